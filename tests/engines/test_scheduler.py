"""The deadline-ordered scheduler on a virtual clock: earliest deadline first, the horizon,
dropping a session's jobs, and Piper's jobs: a unit's latent whole, then chunks (virtual voice)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import numpy as np
import pytest

from inprocess import until
from myna.engines import AudioChunk
from myna.engines.piper import CHUNK_FRAMES, FIRST_CHUNK_FRAMES, PiperEngine, UnitLatent
from myna.engines.scheduler import AHEAD_DUE_S, URGENT_NICENESS, DeadlineScheduler, lower_thread_priority


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Timers:
    """A ``call_later`` that only records what it was asked to do."""

    def __init__(self) -> None:
        self.pending: list[tuple[float, object]] = []

    def __call__(self, delay, callback):
        self.pending.append((delay, callback))
        return _Handle()


class _Handle:
    def cancel(self) -> None:
        pass


async def _blocked(scheduler: DeadlineScheduler) -> tuple[threading.Event, asyncio.Future]:
    """Occupy the scheduler's only thread until the returned event is set."""
    gate, started = threading.Event(), threading.Event()

    def hold():
        started.set()
        gate.wait(10)

    job = asyncio.ensure_future(scheduler.run(hold))
    while not started.is_set():
        await asyncio.sleep(0.001)
    return gate, job


@pytest.fixture
async def busy():
    """A one-thread scheduler on a virtual clock (horizon out of the way), its thread held:
    (clock, scheduler, release)."""
    clock = Clock()
    scheduler = DeadlineScheduler(1, "test", clock=clock, horizon_s=60.0)
    gate, first = await _blocked(scheduler)

    async def release():
        gate.set()
        await first

    yield clock, scheduler, release
    scheduler.shutdown()


async def test_the_earliest_deadline_runs_first_and_ties_keep_their_order(busy):
    clock, scheduler, release = busy
    order: list[str] = []
    deadlines = {"e": 5.0, "a": 1.0, "c": 3.0, "b1": 2.0, "d": 4.0, "b2": 2.0}
    jobs = [asyncio.ensure_future(scheduler.run(order.append, name, deadline=clock.t + d))
            for name, d in deadlines.items()]
    await asyncio.sleep(0.01)
    assert order == [] and scheduler.queued == 6  # the thread is busy: everything waits
    await release()
    await asyncio.gather(*jobs)
    assert order == ["a", "b1", "b2", "c", "d", "e"]


async def test_a_turns_first_job_overtakes_sessions_that_have_audio_queued(busy):
    clock, scheduler, release = busy
    order: list[str] = []
    ahead = [asyncio.ensure_future(scheduler.run(order.append, f"ahead{i}", deadline=clock.t + 2.5)) for i in range(2)]
    await asyncio.sleep(0)
    new = asyncio.ensure_future(scheduler.run(order.append, "first job"))  # deadline: now
    await release()
    await asyncio.gather(new, *ahead)
    assert order[0] == "first job"


async def test_a_job_whose_deadline_has_come_takes_an_urgent_thread_while_the_others_are_busy():
    """Every synthesis thread busy: a job due now (a turn's first) starts on an urgent thread at
    once; a job with audio still queued waits for a synthesis thread, and so does a second due
    job while the only urgent thread is taken."""
    clock = Clock()
    scheduler = DeadlineScheduler(1, "test", clock=clock, horizon_s=60.0, urgent_threads=1)
    gate, held = await _blocked(scheduler)
    urgent_gate, urgent_started = threading.Event(), threading.Event()

    def first_job():
        urgent_started.set()
        urgent_gate.wait(10)
        return threading.current_thread().name

    ran: list[str] = []
    queued = asyncio.ensure_future(scheduler.run(ran.append, "has audio queued", deadline=clock.t + 1.0))
    first = asyncio.ensure_future(scheduler.run(first_job))  # deadline: now
    await until(urgent_started.is_set)
    second = asyncio.ensure_future(scheduler.run(ran.append, "second due job"))
    await asyncio.sleep(0.01)
    assert ran == [] and scheduler.queued == 2 and scheduler.urgent_runs == 1
    urgent_gate.set()
    assert (await first).startswith("test-urgent")
    await second  # the urgent thread is free again: the due job takes it
    assert ran == ["second due job"] and scheduler.urgent_runs == 2
    gate.set()
    await asyncio.gather(held, queued)
    assert ran == ["second due job", "has audio queued"]
    scheduler.shutdown()


async def test_without_urgent_threads_a_due_job_waits_for_a_synthesis_thread(busy):
    clock, scheduler, release = busy
    ran: list[str] = []
    first = asyncio.ensure_future(scheduler.run(ran.append, "first job"))
    await asyncio.sleep(0.01)
    assert ran == [] and scheduler.urgent_runs == 0
    await release()
    await first
    assert ran == ["first job"]


async def test_a_session_beyond_the_horizon_waits_even_with_an_idle_thread():
    clock, timers = Clock(), Timers()
    scheduler = DeadlineScheduler(1, "test", clock=clock, horizon_s=3.0, call_later=timers)
    ran: list[str] = []
    far = asyncio.ensure_future(scheduler.run(ran.append, "far", deadline=clock.t + 10.0))
    await asyncio.sleep(0.01)
    assert ran == [] and scheduler.queued == 1
    assert timers.pending and timers.pending[-1][0] == pytest.approx(7.0)  # wakes when within the horizon
    assert await scheduler.run(ran.append, "near", deadline=clock.t + 2.0) is None  # runs at once
    assert ran == ["near"]
    clock.t += 6.9
    scheduler.dispatch()
    await asyncio.sleep(0.01)
    assert ran == ["near"]  # still 3.1 s ahead
    clock.t += 0.1
    timers.pending[-1][1]()  # the wake-up
    await far
    assert ran == ["near", "far"]
    scheduler.shutdown()


async def test_a_background_job_never_runs_before_a_due_real_time_job_and_runs_beyond_the_horizon_when_idle():
    """An ahead job (a file download's) runs far beyond the horizon on an idle thread, but
    never while a job within the horizon waits for a synthesis thread; once due it is ordered
    by its deadline like any job."""
    clock, timers = Clock(), Timers()
    scheduler = DeadlineScheduler(1, "test", clock=clock, horizon_s=3.0, call_later=timers, background_threads=1)
    ran: list[tuple[str, str]] = []

    def note(name):
        ran.append((name, threading.current_thread().name))

    # idle: a job 60 s ahead runs at once as background work; a real-time one as far ahead waits
    held = asyncio.ensure_future(scheduler.run(note, "real-time, far", deadline=clock.t + 60.0))
    await scheduler.run(note, "ahead, far", deadline=clock.t + 60.0, ahead=True)
    assert [name for name, _ in ran] == ["ahead, far"] and ran[0][1].startswith("test-bg")
    assert scheduler.queued == 1 and not held.done() and scheduler.background_runs == 1
    held.cancel()

    # a due real-time job waiting for the synthesis thread: no background job starts before it
    ran.clear()
    gate, first = await _blocked(scheduler)
    due = asyncio.ensure_future(scheduler.run(note, "real-time, due", deadline=clock.t + 0.5))
    background = asyncio.ensure_future(scheduler.run(note, "ahead, far", deadline=clock.t + 60.0, ahead=True))
    await asyncio.sleep(0.05)
    scheduler.dispatch()
    await asyncio.sleep(0.05)
    assert ran == [] and scheduler.queued == 2  # the background thread is idle, and stays so
    gate.set()
    await first
    await asyncio.gather(due, background)
    # (the due job started first; the background one may start beside it, on its own thread)
    assert sorted(name for name, _ in ran) == ["ahead, far", "real-time, due"]

    # due (its audio runs out within AHEAD_DUE_S) an ahead job is ordered by its deadline, on the
    # synthesis thread
    ran.clear()
    gate, first = await _blocked(scheduler)
    soon = AHEAD_DUE_S / 2
    jobs = [asyncio.ensure_future(scheduler.run(note, name, deadline=clock.t + d, ahead=ahead))
            for name, d, ahead in (("real-time 2 s", 2.0, False), ("ahead, due", soon, True), ("real-time 0 s", 0.0, False))]
    await asyncio.sleep(0.01)
    gate.set()
    await first
    await asyncio.gather(*jobs)
    assert [name for name, _ in ran] == ["real-time 0 s", "ahead, due", "real-time 2 s"]
    assert all(not thread.startswith("test-bg") for _, thread in ran)

    # not yet due, even within the horizon, it leaves the idle synthesis thread to listeners
    ran.clear()
    await scheduler.run(note, "ahead, 1 s", deadline=clock.t + AHEAD_DUE_S + 1.0, ahead=True)
    assert ran[0][1].startswith("test-bg")
    scheduler.shutdown()


async def test_an_ahead_job_its_callable_holds_waits_until_it_says_yes():
    """``ahead`` as a callable (a download whose reader is behind): False holds the job until it
    is due; it is asked again soon, and runs ahead once it says True."""
    clock, timers = Clock(), Timers()
    scheduler = DeadlineScheduler(1, "test", clock=clock, horizon_s=3.0, call_later=timers)
    reader_behind = True
    ran: list[str] = []
    job = asyncio.ensure_future(scheduler.run(ran.append, "x", deadline=clock.t + 60.0, ahead=lambda: not reader_behind))
    await asyncio.sleep(0.01)
    assert ran == [] and scheduler.queued == 1
    assert min(delay for delay, _ in timers.pending) == pytest.approx(0.05)  # asked again soon
    reader_behind = False
    timers.pending[-1][1]()
    await job
    assert ran == ["x"] and scheduler.background_runs == 1
    scheduler.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
async def test_background_threads_run_at_the_lowest_priority():
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    scheduler = DeadlineScheduler(1, "test", niceness=5)
    nice = await scheduler.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                               deadline=time.monotonic() + 60.0, ahead=True)
    assert nice == 19 and scheduler.background_runs == 1
    scheduler.shutdown()


async def test_drop_removes_a_sessions_queued_jobs_at_once(busy):
    clock, scheduler, release = busy
    ran: list[str] = []
    mine, other = object(), object()
    dropped = [asyncio.ensure_future(scheduler.run(ran.append, f"x{i}", owner=mine)) for i in range(3)]
    kept = asyncio.ensure_future(scheduler.run(ran.append, "kept", owner=other, deadline=clock.t + 1))
    await asyncio.sleep(0)
    assert scheduler.drop(mine) == 3
    assert scheduler.queued == 1  # gone before any thread is free
    await release()
    await kept
    for job in dropped:
        with pytest.raises(asyncio.CancelledError):
            await job
    assert ran == ["kept"]


async def test_errors_reach_the_caller_and_the_scheduler_carries_on():
    scheduler = DeadlineScheduler(1, "test")

    def boom():
        raise RuntimeError("engine failed")

    with pytest.raises(RuntimeError, match="engine failed"):
        await scheduler.run(boom)
    assert await scheduler.run(lambda: 42) == 42
    scheduler.shutdown()


class _FakeLatent:
    """A unit's latent for the virtual voice: its text and its frames."""

    def __init__(self, text: str, frames: int):
        self.text, self.frames = text, frames


class VirtualPiper:
    """A Piper engine with a virtual voice: 2 latent frames (256 samples each) per character,
    jobs of no real compute; records each job (kind, unit text, frames, deadline) in order."""

    HOP = 256

    def __init__(self, job_s: float = 0.0, lead: int = 0, workers: int = 1):
        self.engine = PiperEngine(workers=workers, horizon_s=120.0)  # (the horizon is tested above)
        self.engine._voice = object()  # "loaded"
        self.job_s = job_s
        self.lead = lead  # frames of quiet lead-in before each unit's first word
        self.jobs: list[dict] = []
        self.engine.encode_unit = self._encode
        self.engine.render = self._render
        run = self.engine.scheduler.run

        async def recorded(fn, *args, deadline=None, owner=None, ahead=False):
            kind = "latent" if fn == self._encode else "chunk"
            text = args[0] if kind == "latent" else args[0].text
            job = {"kind": kind, "text": text, "deadline": deadline, "frames": args[2] - args[1] if kind == "chunk" else 0,
                   "ahead": ahead}

            def started(*a):  # recorded when a thread takes it (the order jobs run in), with when it ran
                self.jobs.append(job)
                job["began"] = time.monotonic()
                try:
                    return fn(*a)
                finally:
                    job["ended"] = time.monotonic()

            return await run(started, *args, deadline=deadline, owner=owner, ahead=ahead)

        self.engine.scheduler.run = recorded

    def _encode(self, text: str, speed: float = 1.0, voice: str | None = None) -> UnitLatent:
        time.sleep(self.job_s)
        words = text.split()
        frames = 2 * len(text) + self.lead
        starts = [1000.0 * self.HOP * (self.lead + 2 * len(" ".join(words[:i]))) / 22_050 for i in range(len(words))]
        return UnitLatent([_FakeLatent(text, frames)], starts, frames * self.HOP)

    def _render(self, latent: _FakeLatent, start: int, end: int, voice: str | None = None, after: int | None = None) -> np.ndarray:
        time.sleep(self.job_s)
        return np.full((min(end, latent.frames) - start) * self.HOP, 0.1, np.float32)


LONG_CLAUSE = ("the courier will call an hour before arriving so that somebody can be at home to sign for the "
               "parcel and check that nothing inside it was damaged on the way")


async def _drain(stream) -> list:
    return [item async for item in stream]


async def test_a_long_unit_is_one_latent_job_then_chunks_that_grow_never_a_cut_in_its_text():
    piper = VirtualPiper()
    stream = piper.engine.stream()
    stream.push_text(LONG_CLAUSE + ".")  # 31 words, 157 characters
    stream.end_input()
    items = await _drain(stream)
    latents = [job for job in piper.jobs if job["kind"] == "latent"]
    assert [job["text"] for job in latents] == [LONG_CLAUSE + "."]  # the clause whole: no cut for compute
    chunks = [job["frames"] for job in piper.jobs if job["kind"] == "chunk"]
    growing = [min(CHUNK_FRAMES, FIRST_CHUNK_FRAMES * 2**i) for i in range(len(chunks))]
    assert chunks == growing and chunks[-1] == CHUNK_FRAMES  # small first, doubling, then capped
    assert sum(chunks) >= 2 * len(LONG_CLAUSE)  # every frame rendered
    assert [i.word for i in items if not isinstance(i, AudioChunk)] == LONG_CLAUSE.split()  # (words without stops)
    piper.engine.scheduler.shutdown()


async def test_a_turns_first_chunk_holds_its_frames_of_sound_after_the_quiet_lead_in():
    """The output trims a turn's quiet lead-in, so the first chunk is rendered that much longer:
    FIRST_CHUNK_FRAMES of sound go out first (with fewer, the next chunk was due ~40 ms into the
    first word and came late under load: a gap inside it). Later chunks grow as before."""
    piper = VirtualPiper(lead=5)
    stream = piper.engine.stream()
    stream.push_text(LONG_CLAUSE + ". " + LONG_CLAUSE + ".")
    stream.end_input()
    await _drain(stream)
    chunks = [job["frames"] for job in piper.jobs if job["kind"] == "chunk"]
    assert chunks[:4] == [5 + FIRST_CHUNK_FRAMES, 2 * FIRST_CHUNK_FRAMES, 4 * FIRST_CHUNK_FRAMES, 8 * FIRST_CHUNK_FRAMES]
    piper.engine.scheduler.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
async def test_synthesis_threads_run_at_a_lower_priority_than_the_event_loop_and_urgent_ones_between():
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    scheduler = DeadlineScheduler(1, "test", niceness=5)
    nice = await scheduler.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert nice == min(19, own + 5)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # the loop's thread is untouched
    scheduler.shutdown()
    piper = PiperEngine(workers=2)
    nice = await piper.scheduler.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert piper.scheduler.workers == 2 and nice == min(19, own + 10)
    piper.scheduler.shutdown()
    urgent = DeadlineScheduler(1, "test", urgent_threads=1)
    gate, held = await _blocked(urgent)
    nice = await urgent.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert nice == min(19, own + URGENT_NICENESS) and urgent.urgent_runs == 1
    gate.set()
    await held
    urgent.shutdown()
    lower_thread_priority(0)  # no change asked: none made
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own


async def test_a_turns_first_unit_waits_for_one_chunk_not_for_a_unit():
    """One thread, a session speaking a long unit (jobs of 20 ms each): a new turn's first job
    runs after at most the one chunk that is running when it arrives."""
    import time as clock

    piper = VirtualPiper(job_s=0.02)
    speaking = piper.engine.stream(group=Listener(clock.monotonic() + 0.5))
    speaking.push_text(LONG_CLAUSE + " " + LONG_CLAUSE)
    speaking.end_input()
    drain = asyncio.ensure_future(_drain(speaking))
    while sum(job["kind"] == "chunk" for job in piper.jobs) < 3:
        await asyncio.sleep(0.005)
    at = len(piper.jobs)  # the running job, and those before it
    new = piper.engine.stream(group=Listener(clock.monotonic()))
    new.push_text("Hello there.")
    new.end_input()
    await asyncio.wait_for(new.__aiter__().__anext__(), 5)
    mine = next(i for i, job in enumerate(piper.jobs) if job["text"] == "Hello there.")
    assert mine - at <= 1  # at most the chunk a thread took as the text arrived
    new.cancel()
    speaking.cancel()
    await drain
    piper.engine.scheduler.shutdown()


async def test_the_whole_reply_lane_releases_audio_only_when_every_job_is_done():
    piper = VirtualPiper()
    stream = piper.engine.stream(group=Listener(0.0), strategy="whole")
    stream.push_text(LONG_CLAUSE + ". " + LONG_CLAUSE)
    stream.end_input()
    seen_at: list[int] = []
    async for item in stream:
        seen_at.append(len(piper.jobs))
    assert len(piper.jobs) > 1
    assert seen_at and min(seen_at) == len(piper.jobs)  # the first item came after the last job
    # Nothing was out while they ran: every job is due when the listener began to wait, so
    # the reply's jobs keep their place instead of sharing the threads with later turns.
    assert len({job["deadline"] for job in piper.jobs}) == 1


async def test_a_thin_listeners_next_chunk_is_rendered_beside_the_one_before_it():
    """While a listener has little queued (a turn's start), the chunk after the next one is
    submitted too, and a second thread renders it beside the first; with nobody listening in
    real time (no group, a group that cannot say when its audio runs out, a file download),
    one chunk at a time."""
    download = Listener(time.monotonic())
    download.synthesis_ahead = lambda: True
    for group, beside in ((Listener(time.monotonic()), True), (None, False), (object(), False), (download, False)):
        piper = VirtualPiper(job_s=0.05, workers=2)
        stream = piper.engine.stream(group=group)
        stream.push_text("Hello there.")
        stream.end_input()
        await _drain(stream)
        first, second = [job for job in piper.jobs if job["kind"] == "chunk"][:2]
        assert (second["began"] < first["ended"]) is beside
        piper.engine.scheduler.shutdown()


async def test_a_clause_still_being_written_is_cut_between_phrases_before_the_listener_runs_out():
    """A turn's later clause whose punctuation has not come is cut early, before a word that
    leans on the next, STARVE_LEAD_S before the listener's audio runs out. With seconds of audio
    queued the clause waits for its punctuation."""
    from myna.engines.piper import STARVE_LEAD_S

    # ("our" is still held when the cut comes: a last word waits for the next chunk.)
    for queued_s, units in ((0.1, ["Sure,", "the order you asked", "about left our warehouse on Monday."]),
                            (30.0, ["Sure,", "the order you asked about left our warehouse on Monday."])):
        piper = VirtualPiper()
        latents = lambda: [job["text"] for job in piper.jobs if job["kind"] == "latent"]  # noqa: E731
        listener = Listener(time.monotonic() + 30.0)
        stream = piper.engine.stream(group=listener)
        items: list = []
        reader = asyncio.ensure_future(_collect(stream, items))
        stream.push_text("Sure, ")
        await until(lambda: any(isinstance(i, AudioChunk) for i in items) and stream._idle)
        # queued_s of audio left until the clause's first unit is on its way; then plenty.
        listener.audio_runs_out_at = lambda: time.monotonic() + (queued_s if len(latents()) < 2 else 30.0)
        stream.push_text("the order you asked about left our ")
        if queued_s < STARVE_LEAD_S:
            await until(lambda: len(latents()) == 2)
        stream.push_text("warehouse on Monday.")
        stream.end_input()
        await reader
        assert latents() == units
        piper.engine.scheduler.shutdown()


async def _collect(stream, items: list) -> None:
    async for item in stream:
        items.append(item)


class Listener:
    """A session's side of the deadline: its queued audio runs out at ``at``."""

    def __init__(self, at: float):
        self.at = at

    def audio_runs_out_at(self) -> float:
        return self.at


async def test_jobs_are_due_when_the_sessions_audio_runs_out():
    import time

    piper = VirtualPiper()
    quiet = Listener(time.monotonic())
    stream = piper.engine.stream(group=quiet)
    stream.push_text("Hi, how are you today, my friend?")
    stream.end_input()
    await _drain(stream)
    # A quiet session's first jobs (the first unit's latent and first chunk): now.
    assert [job["kind"] for job in piper.jobs[:2]] == ["latent", "chunk"]
    assert [job["deadline"] for job in piper.jobs[:2]] == [quiet.at, quiet.at]
    # Later jobs: when the audio already made runs out (the stream's own bound, here later).
    assert len(piper.jobs) > 2 and all(job["deadline"] > quiet.at for job in piper.jobs[2:])
    busy = Listener(time.monotonic() + 30.0)  # 30 s of audio still to play
    stream = piper.engine.stream(group=busy)
    stream.push_text("Hi, how are you today?")
    stream.end_input()
    before = len(piper.jobs)
    await _drain(stream)
    assert [job["deadline"] for job in piper.jobs[before:]] == [busy.at] * (len(piper.jobs) - before)
    offline = piper.engine.stream()  # nobody listening in real time: no deadlines, no horizon
    offline.push_text("Hi, how are you today?")
    offline.end_input()
    before = len(piper.jobs)
    await _drain(offline)
    assert all(job["deadline"] is None for job in piper.jobs[before:])


async def test_a_group_nobody_listens_to_submits_ahead_jobs_others_do_not():
    """A session whose output nobody plays in real time (``synthesis_ahead``: a file download)
    submits every job as an ahead job, its callable asked by the scheduler; a listener's and a
    session's without one are ordinary jobs the horizon holds."""
    import time

    piper = VirtualPiper()
    download = Listener(time.monotonic())
    download.synthesis_ahead = lambda: True
    for group, expected in ((download, download.synthesis_ahead), (Listener(time.monotonic()), False)):
        stream = piper.engine.stream(group=group)
        stream.push_text("Hi, how are you today, my friend?")
        stream.end_input()
        before = len(piper.jobs)
        await _drain(stream)
        assert len(piper.jobs) > before + 1 and all(job["ahead"] is expected for job in piper.jobs[before:])


async def test_a_groups_turns_are_synthesised_in_order_and_a_cancelled_one_lets_the_next_go():
    piper = VirtualPiper()
    group = Listener(0.0)
    names = ["alpha", "bravo", "charlie"]  # (words the normaliser leaves as they are)
    turns = [piper.engine.stream(group=group) for _ in names]
    for name, turn in zip(names, turns):
        turn.push_text(f"Turn {name} says one thing and then another.")
        turn.end_input()
    turns[1].cancel()  # before it ever ran
    await asyncio.wait_for(asyncio.gather(*(_drain(t) for t in turns)), 10)
    said = [job["text"].split()[1] for job in piper.jobs if job["kind"] == "latent"]
    assert said == ["alpha", "charlie"]  # turn alpha's jobs, then turn charlie's; bravo's never ran
