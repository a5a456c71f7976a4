"""The deadline-ordered scheduler on a virtual clock: earliest deadline first, the horizon,
dropping a session's jobs, and Piper's jobs bounded in compute (virtual cost, no voice)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from myna.engines import AudioChunk
from myna.engines.piper import MIN_JOB_CHARS, PiperEngine, split_unit
from myna.engines.scheduler import ComputeCost, DeadlineScheduler


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


def test_the_cost_is_fitted_to_measured_jobs_and_sizes_them():
    cost = ComputeCost(overhead_s=0.01, s_per_char=0.001)
    for _ in range(60):
        for chars in (10, 50, 100):
            cost.observe(chars, 0.1 + 0.01 * chars)  # 100 ms per job, 10 ms per character
    assert cost.overhead_s == pytest.approx(0.1, abs=0.005)
    assert cost.s_per_char == pytest.approx(0.01, rel=0.05)
    assert cost.max_chars(0.3) == pytest.approx(20, abs=1)
    for _ in range(30):
        for chars in (10, 50, 100):
            cost.observe(chars, 2 * (0.1 + 0.01 * chars))  # the host got busy: twice as slow
    assert cost.s_per_char == pytest.approx(0.02, rel=0.1)
    assert cost.seconds(100) == pytest.approx(2.2, rel=0.1)


@pytest.mark.parametrize("max_chars", [12, 30, 64, 100])
def test_split_unit_keeps_every_word_within_the_bound(max_chars):
    text = ("Your order ships on Friday, and the courier will call an hour before arriving so that "
            "somebody can be at home to sign for the parcel and check it")
    pieces = split_unit(text, max_chars)
    assert " ".join(pieces) == text
    assert all(len(p) <= 1.25 * max_chars for p in pieces)  # "about" the bound
    assert min(len(p) for p in pieces) >= max_chars / 4 or len(pieces) == 1  # balanced, no stray tail
    if max_chars >= 30:  # (at 12 characters some piece must end on one)
        assert not any(p.split()[-1] in ("the", "a", "to", "is", "can", "be") for p in pieces)  # none leans on the next


def test_split_unit_cuts_where_a_speaker_would_pause():
    assert split_unit("Your order ships on Friday, and the courier will call first", 40) == [
        "Your order ships on Friday,", "and the courier will call first"]
    # Not "Your table for four is | booked ...": Whisper heard "as booked" there.
    assert split_unit("Your table for four is booked at seven tonight.", 24) == [
        "Your table for four is booked", "at seven tonight."]


class VirtualPiper:
    """A Piper engine with a virtual voice: 60 ms of audio and ``s_per_char`` of (virtual)
    compute per character; records each job's text, deadline and virtual compute."""

    def __init__(self, s_per_char: float = 0.005):
        self.engine = PiperEngine(workers=1)
        self.engine._voice = object()  # "loaded"
        self.engine.cost = ComputeCost(overhead_s=0.0, s_per_char=s_per_char)
        self.s_per_char = s_per_char
        self.jobs: list[dict] = []
        self.engine.synthesize = self._synthesize

    async def _synthesize(self, text, deadline=None, owner=None):
        self.jobs.append({"text": text, "deadline": deadline, "compute_s": self.s_per_char * len(text)})
        await asyncio.sleep(0)
        words = text.split()
        pcm = np.full(int(0.06 * 22_050 * len(text)), 0.1, np.float32)
        return pcm, [1000.0 * 0.06 * len(" ".join(words[:i])) for i in range(len(words))]


LONG_CLAUSE = ("the courier will call an hour before arriving so that somebody can be at home to sign for the "
               "parcel and check that nothing inside it was damaged on the way")


async def _drain(stream) -> list:
    return [item async for item in stream]


async def test_a_long_unit_becomes_jobs_of_bounded_compute():
    piper = VirtualPiper(s_per_char=0.001)
    piper.engine.max_job_s = 0.08  # 80 characters
    stream = piper.engine.stream()
    stream.push_text(LONG_CLAUSE)
    stream.end_input()
    items = await _drain(stream)
    assert len(piper.jobs) >= 2
    assert max(job["compute_s"] for job in piper.jobs) <= 1.25 * piper.engine.max_job_s  # "about" the bound
    assert " ".join(job["text"] for job in piper.jobs) == LONG_CLAUSE
    assert [i.word for i in items if not isinstance(i, AudioChunk)] == LONG_CLAUSE.split()
    piper.engine.scheduler.shutdown()


async def test_a_clause_is_never_cut_into_pieces_shorter_than_the_floor():
    """On a host so slow that 300 ms is a few words, pieces stay about 12 words long: each cut
    inside a clause is heard (tests/engines/test_piper.py has the Whisper figures)."""
    from myna.text import ClauseChunker

    text = LONG_CLAUSE + " and then some more words to end it."
    chunker = ClauseChunker()
    units = [u for w in text.split() for u in chunker.push(w)] + chunker.flush()
    piper = VirtualPiper(s_per_char=0.02)  # 300 ms of compute: 15 characters
    stream = piper.engine.stream()
    stream.push_text(text)
    stream.end_input()
    await _drain(stream)
    assert len(piper.jobs) == sum(-(-len(u) // MIN_JOB_CHARS) for u in units)  # as few cuts as the floor allows
    assert all(len(job["text"]) >= MIN_JOB_CHARS / 2 for job in piper.jobs)  # balanced halves at worst
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


class Listener:
    """A session's side of the deadline: its queued audio runs out at ``at``."""

    def __init__(self, at: float):
        self.at = at

    def audio_runs_out_at(self) -> float:
        return self.at


async def test_jobs_are_due_when_the_sessions_audio_runs_out():
    import time

    piper = VirtualPiper(s_per_char=0.0005)
    quiet = Listener(time.monotonic())
    stream = piper.engine.stream(group=quiet)
    stream.push_text("Hi, how are you today, my friend?")
    stream.end_input()
    await _drain(stream)
    assert piper.jobs[0]["deadline"] == quiet.at  # a quiet session's first job: now
    # Later jobs: when the audio already made runs out (the stream's own bound, here later).
    assert all(job["deadline"] > quiet.at for job in piper.jobs[1:])
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


async def test_a_groups_turns_are_synthesised_in_order_and_a_cancelled_one_lets_the_next_go():
    piper = VirtualPiper()
    group = Listener(0.0)
    turns = [piper.engine.stream(group=group) for _ in range(3)]
    for i, turn in enumerate(turns):
        turn.push_text(f"Turn {i} says one thing and then another.")
        turn.end_input()
    turns[1].cancel()  # before it ever ran
    await asyncio.wait_for(asyncio.gather(*(_drain(t) for t in turns)), 10)
    said = [job["text"].split()[1] for job in piper.jobs]
    assert said == sorted(said) and set(said) == {"0", "2"}  # turn 0's jobs, then turn 2's
