"""Playout with a virtual clock: frames, resampling, underruns, barge-in, events."""

from __future__ import annotations

import numpy as np
import pytest

from myna.audio.playout import FADE_SAMPLES, FRAME_SAMPLES, Playout


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(clock=None):
    events: list[dict] = []
    return Playout(events.append, clock=clock or Clock()), events


def tone(freq: float, seconds: float, rate: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(seconds * rate))) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def drain(playout: Playout, events: list[dict], max_frames: int = 10_000) -> np.ndarray:
    frames = []
    for _ in range(max_frames):
        frame = playout.next_frame()
        assert frame.dtype == np.int16 and frame.shape == (FRAME_SAMPLES,)
        frames.append(frame)
        if events and events[-1]["type"] == "turn_done":
            break
    return np.concatenate(frames)


def test_25_chunks_of_80_ms_make_exactly_100_frames():
    playout, events = make()
    playout.begin_turn("t", 0.0)
    for chunk in np.split(tone(440, 2.0, 48_000), 25):
        playout.push_audio("t", chunk, 48_000)
    playout.end_turn("t")
    out = drain(playout, events)
    assert len(out) == 100 * FRAME_SAMPLES
    assert events[-1] == {"type": "turn_done", "turn_id": "t", "audio_ms": 2000.0, "underruns": 0}


@pytest.mark.parametrize("rate", [24_000, 16_000, 22_050])
def test_a_1_khz_tone_comes_out_at_1_khz_and_the_right_length(rate):
    playout, events = make()
    playout.begin_turn("t", 0.0)
    x = tone(1000, 1.0, rate)
    for chunk in np.array_split(x, 13):  # odd chunk sizes
        playout.push_audio("t", chunk, rate)
    playout.end_turn("t")
    out = drain(playout, events).astype(np.float64) / 32767
    assert abs(events[-1]["audio_ms"] - 1000.0) <= 1.0
    audio = out[: 48_000]
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    assert abs(np.argmax(spectrum) * 48_000 / len(audio) - 1000) <= 2
    assert np.max(np.abs(audio)) == pytest.approx(0.5, abs=0.02)


def test_underruns_fade_without_clicks_and_are_counted():
    playout, events = make()
    x = tone(300, 0.6, 48_000, amp=0.8)
    max_step = np.max(np.abs(np.diff(x)))  # the largest jump the audio itself contains
    playout.begin_turn("t", 0.0)
    out = []
    # 100 ms arrives, then 10 frames with nothing, twice; then the rest and the end.
    for piece in np.split(x[: 4800 * 2], 2):
        playout.push_audio("t", piece, 48_000)
        out += [playout.next_frame() for _ in range(10)]
    playout.push_audio("t", x[9600:], 48_000)
    playout.end_turn("t")
    out = np.concatenate(out + [drain(playout, events)]).astype(np.float64) / 32767
    assert events[-1]["underruns"] == 2
    assert np.max(np.abs(np.diff(out))) <= max_step * 1.05 + 2 / 32767
    assert np.any(out[:9600] == 0)  # silence was played while starved


def test_interrupt_half_way_through_a_chunk_keeps_only_a_5_ms_fade():
    playout, events = make()
    playout.begin_turn("t", 0.0)
    playout.push_audio("t", tone(300, 0.08, 48_000, amp=0.8), 48_000)  # one 80 ms chunk
    playout.next_frame()
    playout.next_frame()  # 40 ms of the chunk played
    assert playout.interrupt() == ["t"]
    frame = playout.next_frame().astype(np.float64) / 32767
    assert np.all(frame[FADE_SAMPLES:] == 0)
    assert np.max(np.abs(frame[:FADE_SAMPLES])) > 0.1
    assert np.max(np.abs(np.diff(frame))) <= 0.8 * 2 * np.pi * 300 / 48_000 + 0.8 / FADE_SAMPLES + 2 / 32767
    assert all(not np.any(playout.next_frame()) for _ in range(10))
    playout.push_audio("t", tone(300, 0.1, 48_000), 48_000)  # late audio of the dropped turn
    assert not np.any(playout.next_frame())
    assert [e["type"] for e in events] == ["first_audio"]


def test_turns_play_back_to_back_and_events_follow_the_frames():
    clock = Clock()
    playout, events = make(clock)
    playout.begin_turn("a", text_at=clock.t)
    playout.begin_turn("b", text_at=clock.t)
    silence = np.zeros(4800, np.float32)
    playout.push_audio("a", np.concatenate([silence, tone(200, 0.1, 48_000)]), 48_000)
    playout.push_word("a", "hello", 100.0)
    playout.end_turn("a")
    playout.push_audio("b", tone(200, 0.05, 48_000), 48_000)
    playout.end_turn("b")
    assert not any(playout.next_frame()[:1])  # leading silence of "a"
    assert events == []
    clock.t += 0.1
    frames = [playout.next_frame() for _ in range(12)]
    kinds = [(e["type"], e["turn_id"]) for e in events]
    assert kinds[:3] == [("first_audio", "a"), ("word", "a"), ("turn_done", "a")]
    assert events[0]["server_ttfa_ms"] == pytest.approx(100.0)
    assert events[1] == {"type": "word", "turn_id": "a", "word": "hello", "start_ms": 100.0}
    assert ("turn_done", "b") in kinds
    assert np.any(frames[-2]) and not np.any(frames[-1][FRAME_SAMPLES // 2 :])  # b follows a without a gap


def test_an_empty_turn_ends_once_and_idle_is_silence():
    playout, events = make()
    assert not np.any(playout.next_frame())
    playout.begin_turn("t", 0.0)
    playout.end_turn("t")
    assert not np.any(playout.next_frame())
    assert events == [{"type": "turn_done", "turn_id": "t", "audio_ms": 0.0, "underruns": 0}]
    assert playout.idle


def test_a_turn_waits_for_a_whole_frame_before_it_starts():
    playout, events = make()
    playout.begin_turn("t", 0.0)
    playout.push_audio("t", tone(300, 0.01, 48_000), 48_000)  # 10 ms: not enough yet
    assert not np.any(playout.next_frame())
    playout.push_audio("t", tone(300, 0.1, 48_000), 48_000)
    assert np.any(playout.next_frame())
    assert events[-1]["type"] == "first_audio"
