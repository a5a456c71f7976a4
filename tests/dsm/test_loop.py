"""The frame loop (myna.dsm.loop): streaming equals DSMTTS.synthesize for a seed under any logit
setting, word-by-word intake waits without changing tokens, sessions are independent of the batch
mix, cancel frees slots, churn leaves nothing behind, a failing session ends alone, backpressure
holds a slot to real time, and a reset slot starts clean even from NaN leftovers.

The loop is driven step by step with ``tick()`` on the test's thread and a virtual clock, so
nothing here sleeps; one test runs the loop's own thread against sessions on other threads."""

from __future__ import annotations

import math
import random
import threading

import numpy as np
import pytest

from myna.dsm.loop import FrameLoop


class Clock:
    """A virtual monotonic clock."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Turn:
    """Collects one session's callbacks."""

    def __init__(self, loop: FrameLoop, voice, seed: int | None = None, fail_audio: bool = False):
        self.loop = loop
        self.pcm: list[np.ndarray] = []
        self.audio_times: list[float] = []
        self.words: list[tuple[str, float]] = []
        self.ends: list[BaseException | None] = []
        self.ended = threading.Event()
        self.fail_audio = fail_audio
        self.session = loop.open(voice=voice, seed=seed, on_audio=self._audio, on_word=self._word, on_end=self._end)

    def _audio(self, pcm):
        if self.fail_audio:
            raise RuntimeError("boom")
        self.pcm.append(pcm)
        self.audio_times.append(self.loop.clock())

    def _word(self, word, start):
        self.words.append((word, start))

    def _end(self, error):
        self.ends.append(error)
        self.ended.set()

    def say(self, text: str) -> "Turn":
        self.session.push_words(text.split())
        self.session.end_input()
        return self

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.pcm) if self.pcm else np.zeros(0, np.float32)


def drive(loop: FrameLoop, until=None, max_ticks: int = 5000) -> None:
    """Tick until ``until()`` holds (default: the loop is idle, every turn ended), moving the
    virtual clock on over pauses; fails if the loop has nothing to do before that."""
    until = until or (lambda: loop.idle)
    for _ in range(max_ticks):
        if until():
            return
        wait = loop.tick()
        if wait is None and not until():
            raise AssertionError("the loop has nothing to do, but the condition does not hold")
        if wait:
            loop.clock.now += max(wait, 1e-6)  # a timer wakes a little late, never early
    raise AssertionError("the condition did not hold within max_ticks")


def idle_steps(loop: FrameLoop) -> None:
    """Tick until the loop has nothing to do (tick() is not 0.0)."""
    for _ in range(5000):
        if loop.tick() != 0.0:
            return
    raise AssertionError("the loop never ran out of work")


@pytest.fixture(scope="module")
def loop(ours):
    """Pipelined as on CUDA (PCM handed out a step later), the harder case for the bookkeeping."""
    loop = FrameLoop(ours, max_batch=8, max_ahead_s=math.inf, clock=Clock(), pipelined=True)
    loop.start(thread=False)
    yield loop
    loop.close()


TEXT = "Hello world, this is a test."
SHORT = "Hello world, friend."


def test_streaming_equals_synthesize(ours, loop, voice_path):
    """Pipelined (PCM handed out behind the next text launch, as on CUDA); the tests below with
    their own loop run it as on the CPU."""
    ref = ours.synthesize(TEXT, voice_path, seed=5)
    turn = Turn(loop, voice_path, seed=5).say(TEXT)
    drive(loop)
    assert turn.ends == [None]
    assert all(p.shape == (1920,) and p.dtype == np.float32 for p in turn.pcm)
    assert turn.session.tokens == ref.text_tokens
    np.testing.assert_array_equal(turn.audio, ref.pcm)
    assert turn.words == ref.words
    # audio lags text by delay_steps + max_delay steps, then the 2 skipped frames
    assert turn.session.first_audio_step == ours.cfg.delay_steps + ours.cfg.max_delay + 2


@pytest.mark.parametrize("settings", [
    {"padding_bonus": 4.0, "top_k_text": 0, "top_k_audio": 0},
    {"padding_bonus": -1.5, "temperature": 0.9, "top_k_text": 5, "top_k_audio": 10},
])
def test_streaming_equals_synthesize_with_any_logit_setting(ours, voice_path, settings):
    """Every logit rule is in the one frame step: the same seed gives the same tokens and PCM."""
    saved = {k: getattr(ours, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(ours, k, v)
        ref = ours.synthesize(SHORT, voice_path, seed=21)
        own = FrameLoop(ours, max_batch=2, max_ahead_s=math.inf, clock=Clock())  # takes the settings now
        if settings["padding_bonus"] > 0:
            ours.padding_bonus = 0.0
            plain = ours.synthesize(SHORT, voice_path, seed=21)
    finally:
        for k, v in saved.items():
            setattr(ours, k, v)
    own.start(thread=False)
    try:
        turn = Turn(own, voice_path, seed=21).say(SHORT)
        drive(own)
    finally:
        own.close()
    assert turn.ends == [None]
    assert turn.session.tokens == ref.text_tokens
    np.testing.assert_array_equal(turn.audio, ref.pcm)
    assert turn.words == ref.words
    if settings["padding_bonus"] > 0:  # the bonus did act: PAD sampled more often than without it
        pads = [sum(s == 3 for s, _ in r.text_tokens) / len(r.text_tokens) for r in (ref, plain)]
        assert pads[0] > pads[1]


def test_one_word_at_a_time_with_gaps_gives_the_same_tokens(loop, voice_path):
    whole = Turn(loop, voice_path, seed=11).say(TEXT)
    drive(loop)
    trickle = Turn(loop, voice_path, seed=11)
    waited = []
    for word in TEXT.split():
        trickle.session.push_words([word])
        idle_steps(loop)  # the slot runs what it can, then waits for its lookahead
        before = trickle.session.steps
        assert loop.tick() is None and trickle.session.steps == before  # waiting: no step runs
        waited.append(before)
    trickle.session.end_input()
    drive(loop)
    assert trickle.ends == [None]
    assert waited == sorted(waited) and waited[0] < waited[-1]
    assert trickle.session.tokens == whole.session.tokens
    np.testing.assert_array_equal(trickle.audio, whole.audio)
    assert [w for w, _ in trickle.words] == TEXT.split()


def test_output_does_not_depend_on_the_batch_mix(loop, voice_path):
    text = "Jack and Jill went."
    alone = Turn(loop, voice_path, seed=3).say(text)
    drive(loop)
    for others, stagger in ((2, 0), (7, 3)):
        turns = []
        for i in range(others):
            turns.append(Turn(loop, voice_path, seed=100 + i).say("some other words here"[: 6 + 4 * i]))
            for _ in range(stagger):
                loop.tick()
        me = Turn(loop, voice_path, seed=3).say(text)
        drive(loop)
        assert all(t.ends == [None] for t in turns + [me])
        assert me.session.tokens == alone.session.tokens, others
        np.testing.assert_allclose(me.audio, alone.audio, atol=1e-4)


def test_cancel_before_first_audio(loop, voice_path):
    turn = Turn(loop, voice_path, seed=1)
    turn.session.push_words(["Hello", "there", "friend."])
    turn.session.cancel()
    drive(loop)
    assert turn.ends == [None] and turn.pcm == []


def test_cancel_mid_turn_frees_the_slot_within_a_step(loop, voice_path):
    turn = Turn(loop, voice_path, seed=1).say("A rather long sentence that keeps going and going on.")
    drive(loop, until=lambda: bool(turn.pcm))
    steps = turn.session.steps
    turn.session.cancel()
    loop.tick()
    assert turn.ends == [None]
    assert turn.session.steps == steps
    assert loop.busy_slots == 0


def test_many_sessions_joining_and_leaving_leave_nothing_behind(loop, voice_path):
    rng = random.Random(0)
    turns = []
    for i in range(200):
        turn = Turn(loop, voice_path, seed=i)
        kind = rng.random()
        if kind < 0.5:
            turn.session.push_words(["Hi", "you", "there."])
            turn.session.cancel()
        elif kind < 0.8:
            turn.session.push_words(["Hi"])  # waits for more words, then is cancelled below
        else:
            turn.session.end_input()  # no words: ends by itself
        turns.append((kind, turn))
        for _ in range(rng.randrange(3)):
            loop.tick()
    for kind, turn in turns:
        if 0.5 <= kind < 0.8:
            turn.session.cancel()
    drive(loop)
    assert all(len(turn.ends) == 1 for _, turn in turns)
    assert len(loop._conditions) <= 2


def test_a_failing_session_ends_alone_with_an_error(loop, voice_path):
    text = "Jack and Jill went."
    alone = Turn(loop, voice_path, seed=3).say(text)
    drive(loop)
    bad = Turn(loop, voice_path, seed=4, fail_audio=True).say("Hello there, friend.")
    good = Turn(loop, voice_path, seed=3).say(text)
    drive(loop)
    assert isinstance(bad.ends[0], RuntimeError) and len(bad.ends) == 1
    assert good.ends == [None]
    assert good.session.tokens == alone.session.tokens
    np.testing.assert_allclose(good.audio, alone.audio, atol=1e-4)


def test_backpressure_holds_a_slot_to_real_time(ours, voice_path):
    clock = Clock()
    lead = 0.2
    paced = FrameLoop(ours, max_batch=2, max_ahead_s=lead, clock=clock, pipelined=True)
    paced.start(thread=False)
    try:
        turn = Turn(paced, voice_path, seed=2).say("Hello world, this is paced.")
        pauses = 0
        while True:
            wait = paced.tick()
            if turn.ended.is_set():
                break
            if wait == 0.0:
                clock.now += 0.01  # a step takes 10 ms: 8 times faster than real time
            else:
                assert wait is not None, "the turn stalled"
                pauses += 1
                clock.now += max(wait, 1e-6)  # a timer wakes a little late, never early
    finally:
        paced.close()
    assert turn.ends == [None] and pauses > 0
    first = turn.audio_times[0]
    for i, t in enumerate(turn.audio_times):  # frame i was handed out no earlier than allowed
        assert i * 0.08 - (t - first) <= lead + 0.08 + 1e-9
    assert turn.audio_times[-1] - first >= len(turn.pcm) * 0.08 - lead - 0.08 - 0.01


def test_a_session_waiting_for_a_slot_can_be_cancelled(loop, voice_path):
    holders = [Turn(loop, voice_path, seed=i) for i in range(loop.max_batch)]
    for t in holders:
        t.session.push_words(["Hi"])  # holds a slot, waiting for more words
    idle_steps(loop)
    assert loop.busy_slots == loop.max_batch
    queued = Turn(loop, voice_path, seed=99)
    loop.tick()
    assert loop.waiting_sessions == 1
    queued.session.cancel()
    loop.tick()
    assert queued.ends == [None] and loop.waiting_sessions == 0
    for t in holders:
        t.session.cancel()
    drive(loop)
    assert all(t.ends == [None] for t in holders)


def test_a_reset_slot_starts_clean_from_nan_leftovers(ours, loop, voice_path):
    """CUDA's memory-efficient attention leaves NaN where every key of a row is masked; whatever a
    slot's caches hold, a new turn in that slot gives finite audio, equal to synthesize()."""
    for cache in loop.fs.temporal.caches + loop.ms.caches:
        cache.k[0].fill_(float("nan"))
        cache.v[0].fill_(float("nan"))
    for buf in loop.ms.buffers.values():
        buf[0].fill_(float("nan"))
    ref = ours.synthesize(SHORT, voice_path, seed=9)
    turn = Turn(loop, voice_path, seed=9).say(SHORT)  # takes slot 0
    drive(loop)
    assert turn.ends == [None]
    assert np.isfinite(turn.audio).all() and len(turn.pcm) > 0
    assert turn.session.tokens == ref.text_tokens
    np.testing.assert_array_equal(turn.audio, ref.pcm)


def test_the_loop_thread_serves_sessions_from_other_threads(ours, voice_path):
    """The thread's life: sessions opened and fed from other threads end with their audio, each as
    synthesize() gives it; close() ends the one left waiting and stops the thread."""
    threaded = FrameLoop(ours, max_batch=4, max_ahead_s=math.inf)
    threads_before = threading.active_count()
    threaded.start()
    refs = {seed: ours.synthesize(SHORT, voice_path, seed=seed) for seed in (1, 2)}
    turns: dict[int, Turn] = {}

    def client(seed: int) -> None:
        turns[seed] = Turn(threaded, voice_path, seed=seed)
        for word in SHORT.split():
            turns[seed].session.push_words([word])
        turns[seed].session.end_input()

    clients = [threading.Thread(target=client, args=(seed,)) for seed in refs]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    for seed, turn in turns.items():
        assert turn.ended.wait(60), "turn did not end"
        assert turn.ends == [None]
        assert turn.session.tokens == refs[seed].text_tokens
        np.testing.assert_allclose(turn.audio, refs[seed].pcm, atol=1e-4)  # batched with the other: rounding
    waiting = Turn(threaded, voice_path, seed=3)
    waiting.session.push_words(["Hi"])
    threaded.close()
    assert waiting.ended.wait(10) and isinstance(waiting.ends[0], RuntimeError)
    assert threading.active_count() == threads_before
    with pytest.raises(RuntimeError):
        threaded.open()


@pytest.mark.slow
def test_the_loop_computes_on_its_own_thread_with_its_own_thread_count(ours, voice_path, monkeypatch):
    """With a thread, every model call (the warm-up included) runs on the loop thread, at the
    loop's intra-op thread count, while the caller's count and new threads' default stay."""
    import torch

    callers = torch.get_num_threads()
    want = 1 if callers != 1 else 2
    seen: list[tuple[int, int]] = []

    def recorded(fn):
        def call(*args, **kwargs):
            seen.append((threading.get_ident(), torch.get_num_threads()))
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(ours.lm, "forward_text", recorded(ours.lm.forward_text))
    monkeypatch.setattr(ours.mimi, "decode", recorded(ours.mimi.decode))
    threaded = FrameLoop(ours, max_batch=2, max_ahead_s=math.inf, threads=want)
    threaded.start()
    try:
        warm_up = len(seen)
        turn = Turn(threaded, voice_path, seed=1).say(SHORT)
        assert turn.ended.wait(60) and turn.ends == [None]
        loop_thread = threaded._thread.ident
    finally:
        threaded.close()
    assert 0 < warm_up < len(seen)
    assert set(seen) == {(loop_thread, want)}
    assert torch.get_num_threads() == callers
    fresh: list[int] = []
    other = threading.Thread(target=lambda: fresh.append(torch.get_num_threads()))
    other.start()
    other.join()
    assert fresh == [callers]


def test_a_failed_start_raises_and_leaves_no_thread(ours, monkeypatch):
    def no_memory(batch_size):
        raise MemoryError("no room for the Mimi state")

    monkeypatch.setattr(ours.mimi, "new_state", no_memory)
    threads_before = threading.active_count()
    broken = FrameLoop(ours, max_batch=2)
    with pytest.raises(MemoryError, match="Mimi state"):
        broken.start()
    assert threading.active_count() == threads_before and not broken.started
    with pytest.raises(ValueError, match="threads"):
        FrameLoop(ours, max_batch=2, threads=0)


@pytest.mark.slow
def test_bench_dsm_loop_tiny(tmp_path, capsys):
    import argparse
    import json

    from myna.bench import BENCHMARKS, add_parsers

    assert "dsm_loop" in BENCHMARKS
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="cmd", required=True))
    out = tmp_path / "loop.json"
    args = parser.parse_args(["dsm-loop", "--config", "tiny", "--sessions", "1,2", "--no-ref", "--device", "cpu",
                              "--text", "Hello there, friend.", "--profile", "--join", "--json", str(out)])
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert "steps/s" in table and "host ms per step by phase" in table and "own work" in table and "joining" in table
    rows = json.loads(out.read_text())["results"]
    assert [row["sessions"] for row in rows] == [1, 2]
    for row in rows:
        ours = row["ours"]
        assert ours["steps_per_s"] > 0 and ours["cpu_ms_per_step"] > 0 and ours["first_audio_steps"] == 21
        assert 0 < ours["noise_ms_per_step"] + ours["copy_ms_per_step"] < ours["host_ms_per_step"]
        phases = ours["phases_ms"]
        assert sum(phases.values()) == pytest.approx(ours["host_ms_per_step"])
        assert 0 < ours["own_ms_per_step"] < ours["host_ms_per_step"]
        for phase in ("temporal", "depformer", "sampling", "mimi", "state machines", "hand-offs"):
            assert phases[phase] > 0, phase
        join = row["join"]
        assert join["join_wait_steps"] <= 1 and join["join_first_audio_ms"] > 0 and join["lone_first_audio_ms"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("listener_ahead", [True, False])
def test_a_joiner_steps_alone_in_the_first_row_until_its_first_audio(loop, voice_path, listener_ahead):
    """A session joining a busy loop steps without the others until its first audio frame (its
    text-only lead-in and the steps that fill the audio delays), moved to row 0 so that those
    steps run at the smallest bucket: back to back while the others are a frame or more ahead of
    real time, every other step when they are not. The tokens and audio of both sessions are
    those they have alone, though both changed rows mid-turn."""
    text = "Jack and Jill went."
    talk = "a long reply that keeps the talker busy " * 3
    alone = Turn(loop, voice_path, seed=3).say(text)
    drive(loop)
    talker_alone = Turn(loop, voice_path, seed=5).say(talk)
    drive(loop)
    first_audio = alone.session.first_audio_step + 1
    talker = Turn(loop, voice_path, seed=5).say(talk)
    drive(loop, until=lambda: len(talker.pcm) >= 3)
    if not listener_ahead:  # its listener has heard everything so far: no slack
        loop.clock.now = talker.session.first_audio_time + talker.session.steps
    heard_before, small_before = len(talker.pcm), loop.bucket_steps.get(1, 0)
    joiner = Turn(loop, voice_path, seed=3).say(text)
    drive(loop, until=lambda: bool(joiner.pcm))
    frames_meanwhile = len(talker.pcm) - heard_before
    small_steps = loop.bucket_steps.get(1, 0) - small_before
    if listener_ahead:
        assert frames_meanwhile <= 1
        assert small_steps >= first_audio - 1
    else:
        assert first_audio // 2 - 1 <= frames_meanwhile <= first_audio // 2 + 1
        assert small_steps >= first_audio // 2 - 1
    drive(loop)
    assert joiner.ends == [None] and talker.ends == [None]
    assert joiner.session.tokens == alone.session.tokens
    np.testing.assert_allclose(joiner.audio, alone.audio, atol=1e-4)
    assert talker.session.tokens == talker_alone.session.tokens
    np.testing.assert_allclose(talker.audio, talker_alone.audio, atol=1e-4)


def test_a_session_left_alone_in_a_high_row_steps_at_the_smallest_bucket(loop, voice_path):
    """When the sessions in the rows below a busy one end, it moves down into the first free row,
    so its steps run at the bucket its count needs (not the one its old row did), with the same
    tokens and audio as alone."""
    talk = "a reply long enough to outlast the two short ones by far"
    alone = Turn(loop, voice_path, seed=7).say(talk)
    drive(loop)
    shorts = [Turn(loop, voice_path, seed=10 + i) for i in range(2)]
    for turn in shorts:
        turn.session.push_words(["Hi."])
    last = Turn(loop, voice_path, seed=7)
    loop.tick()  # admits all three: rows 0, 1, 2
    assert last.session.admitted_step is not None and loop.busy_slots == 3
    for turn in shorts:
        turn.session.end_input()
    last.say(talk)
    drive(loop, until=lambda: all(t.ended.is_set() for t in shorts))
    small_before, steps_before = loop.bucket_steps.get(1, 0), loop.steps
    drive(loop)
    assert loop.bucket_steps.get(1, 0) - small_before == loop.steps - steps_before > 0
    assert last.session.tokens == alone.session.tokens
    np.testing.assert_allclose(last.audio, alone.audio, atol=1e-4)
