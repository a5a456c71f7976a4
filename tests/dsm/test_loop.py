"""The frame loop (myna.dsm.loop): streaming equals DSMTTS.synthesize for a seed, word-by-word
intake waits without changing tokens, sessions are independent of the batch mix, cancel frees
slots, churn leaves nothing behind, and a failing session ends alone."""

from __future__ import annotations

import math
import random
import threading
import time

import numpy as np
import pytest

from myna.dsm.loop import FrameLoop


class Turn:
    """Collects one session's callbacks."""

    def __init__(self, loop: FrameLoop, voice, seed: int | None = None, fail_audio: bool = False):
        self.pcm: list[np.ndarray] = []
        self.words: list[tuple[str, float]] = []
        self.ends: list[BaseException | None] = []
        self.ended = threading.Event()
        self.fail_audio = fail_audio
        self.session = loop.open(voice=voice, seed=seed, on_audio=self._audio, on_word=self._word, on_end=self._end)

    def _audio(self, pcm):
        if self.fail_audio:
            raise RuntimeError("boom")
        self.pcm.append(pcm)

    def _word(self, word, start):
        self.words.append((word, start))

    def _end(self, error):
        self.ends.append(error)
        self.ended.set()

    def say(self, text: str) -> "Turn":
        self.session.push_words(text.split())
        self.session.end_input()
        return self

    def wait(self, timeout: float = 60.0) -> "Turn":
        assert self.ended.wait(timeout), "turn did not end"
        return self

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.pcm) if self.pcm else np.zeros(0, np.float32)


@pytest.fixture(scope="module")
def loop(ours):
    loop = FrameLoop(ours, max_batch=8, max_ahead_s=math.inf)
    loop.start()
    yield loop
    loop.close()


def _idle(loop: FrameLoop, timeout: float = 5.0) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if loop.busy_slots == 0 and loop.waiting_sessions == 0:
            return True
        time.sleep(0.01)
    return False


TEXT = "Hello world, this is a test."


def test_streaming_equals_synthesize(ours, loop, voice_path):
    ref = ours.synthesize(TEXT, voice_path, seed=5)
    turn = Turn(loop, voice_path, seed=5).say(TEXT).wait()
    assert turn.ends == [None]
    assert all(p.shape == (1920,) and p.dtype == np.float32 for p in turn.pcm)
    assert turn.session.tokens == ref.text_tokens
    np.testing.assert_array_equal(turn.audio, ref.pcm)
    assert turn.words == ref.words
    # audio lags text by delay_steps + max_delay steps, then the 2 skipped frames
    assert turn.session.first_audio_step == ours.cfg.delay_steps + ours.cfg.max_delay + 2
    assert _idle(loop)


def test_one_word_at_a_time_with_gaps_gives_the_same_tokens(loop, voice_path):
    whole = Turn(loop, voice_path, seed=11).say(TEXT).wait()
    trickle = Turn(loop, voice_path, seed=11)
    for word in TEXT.split():
        trickle.session.push_words([word])
        time.sleep(0.15)  # several steps: the slot waits for its lookahead
    trickle.session.end_input()
    trickle.wait()
    assert trickle.ends == [None]
    assert trickle.session.tokens == whole.session.tokens
    np.testing.assert_array_equal(trickle.audio, whole.audio)
    assert [w for w, _ in trickle.words] == TEXT.split()


def test_output_does_not_depend_on_the_batch_mix(loop, voice_path):
    text = "Jack and Jill went."
    alone = Turn(loop, voice_path, seed=3).say(text).wait()
    for others, stagger in ((2, 0.0), (7, 0.03)):
        turns = []
        for i in range(others):
            turns.append(Turn(loop, voice_path, seed=100 + i).say("some other words here"[: 6 + 4 * i]))
            time.sleep(stagger)
        me = Turn(loop, voice_path, seed=3).say(text)
        for t in turns + [me]:
            t.wait()
        assert me.ends == [None]
        assert me.session.tokens == alone.session.tokens, others
        np.testing.assert_allclose(me.audio, alone.audio, atol=1e-4)
    assert _idle(loop)


def test_cancel_before_first_audio(loop, voice_path):
    turn = Turn(loop, voice_path, seed=1)
    turn.session.push_words(["Hello", "there", "friend."])
    turn.session.cancel()
    turn.wait(5)
    assert turn.ends == [None] and turn.pcm == []
    assert _idle(loop)


def test_cancel_mid_turn_frees_the_slot_within_a_step(loop, voice_path):
    turn = Turn(loop, voice_path, seed=1).say("A rather long sentence that keeps going and going on.")
    t0 = time.monotonic()
    while not turn.pcm and time.monotonic() - t0 < 30:
        time.sleep(0.005)
    assert turn.pcm
    steps = turn.session.steps
    turn.session.cancel()
    turn.wait(5)
    assert turn.ends == [None]
    assert turn.session.steps <= steps + 2
    assert _idle(loop)


def test_many_sessions_joining_and_leaving_leave_nothing_behind(loop, voice_path):
    rng = random.Random(0)
    threads_before = threading.active_count()
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
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.02)
    for kind, turn in turns:
        if 0.5 <= kind < 0.8:
            turn.session.cancel()
    for _, turn in turns:
        turn.wait(120)
        assert len(turn.ends) == 1
    assert _idle(loop)
    assert threading.active_count() == threads_before
    assert len(loop._conditions) <= 2


def test_a_failing_session_ends_alone_with_an_error(loop, voice_path):
    text = "Jack and Jill went."
    alone = Turn(loop, voice_path, seed=3).say(text).wait()
    bad = Turn(loop, voice_path, seed=4, fail_audio=True).say("Hello there, friend.")
    good = Turn(loop, voice_path, seed=3).say(text)
    bad.wait()
    good.wait()
    assert isinstance(bad.ends[0], RuntimeError) and len(bad.ends) == 1
    assert good.ends == [None]
    assert good.session.tokens == alone.session.tokens
    np.testing.assert_allclose(good.audio, alone.audio, atol=1e-4)
    assert _idle(loop)


def test_backpressure_pauses_a_slot_ahead_of_real_time(ours, voice_path):
    loop = FrameLoop(ours, max_batch=2, max_ahead_s=0.2)
    loop.start()
    try:
        turn = Turn(loop, voice_path, seed=2).say("Hello world, this is paced.")
        turn.wait(60)
        first = turn.session.first_audio_time
        audio_s = len(turn.audio) / 24000
        # audio came no faster than real time plus the allowed lead (and one 80 ms frame)
        assert time.monotonic() - first >= audio_s - 0.2 - 0.08 - 0.05
    finally:
        loop.close()


def test_a_session_waiting_for_a_slot_can_be_cancelled(loop, voice_path):
    holders = [Turn(loop, voice_path, seed=i) for i in range(loop.max_batch)]
    for t in holders:
        t.session.push_words(["Hi"])  # holds a slot, waiting for more words
    t0 = time.monotonic()
    while loop.busy_slots < loop.max_batch and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    queued = Turn(loop, voice_path, seed=99)
    time.sleep(0.05)
    assert loop.waiting_sessions == 1
    queued.session.cancel()
    queued.wait(2)
    assert queued.ends == [None] and loop.waiting_sessions == 0
    for t in holders:
        t.session.cancel()
    for t in holders:
        t.wait(5)
    assert _idle(loop)


def test_bench_dsm_loop_tiny(tmp_path, capsys):
    import argparse
    import json

    from myna.bench import BENCHMARKS, add_parsers

    assert "dsm_loop" in BENCHMARKS
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="cmd", required=True))
    out = tmp_path / "loop.json"
    args = parser.parse_args(["dsm-loop", "--config", "tiny", "--sessions", "2", "--no-ref", "--device", "cpu",
                              "--text", "Hello there, friend.", "--json", str(out)])
    assert args.func(args) == 0
    assert "steps/s" in capsys.readouterr().out
    row = json.loads(out.read_text())["results"][0]
    assert row["sessions"] == 2 and row["ours"]["steps_per_s"] > 0 and row["ours"]["first_audio_steps"] == 21
