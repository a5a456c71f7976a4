"""The paced track with a virtual clock: frame format, pts, absolute deadlines, catch-up."""

from __future__ import annotations

import fractions

import numpy as np

from myna.audio.playout import Playout
from myna.rtc.track import PacedAudioTrack


class VirtualTime:
    def __init__(self) -> None:
        self.t = 50.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def make():
    vt = VirtualTime()
    events: list[dict] = []
    playout = Playout(events.append, clock=vt.clock)
    return PacedAudioTrack(playout, clock=vt.clock, sleep=vt.sleep), playout, vt, events


def speak(playout: Playout, turn_id: str, seconds: float) -> None:
    playout.begin_turn(turn_id, 0.0)
    t = np.arange(int(48_000 * seconds)) / 48_000
    playout.push_audio(turn_id, (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 48_000)
    playout.end_turn(turn_id)


async def test_frames_and_pts_across_two_turns_and_3_s_of_idle():
    track, playout, vt, events = make()
    frames = []
    speak(playout, "a", 0.5)
    for _ in range(30):
        frames.append(await track.recv())
    for _ in range(150):  # 3 s of idle
        frames.append(await track.recv())
    speak(playout, "b", 0.5)
    for _ in range(30):
        frames.append(await track.recv())
    for i, frame in enumerate(frames):
        assert frame.samples == 960 and frame.sample_rate == 48_000
        assert frame.format.name == "s16" and frame.layout.name == "mono"
        assert frame.time_base == fractions.Fraction(1, 48_000)
        assert frame.pts == 960 * i
    assert [e["type"] for e in events if e["type"] == "turn_done"] == ["turn_done", "turn_done"]
    assert not np.any(frames[100].to_ndarray())  # idle is silence
    assert np.any(frames[185].to_ndarray())  # turn b is heard


async def test_deadlines_are_absolute_and_do_not_drift():
    track, _, vt, _ = make()
    start = vt.t
    for i in range(500):
        await track.recv()
        vt.t += 0.0013 * (i % 3)  # uneven work between calls must not accumulate
    assert abs(vt.t - (start + 499 * 0.020) - 0.0013 * (499 % 3)) < 1e-9


async def test_a_late_wake_up_sends_at_most_two_frames_back_to_back():
    track, _, vt, _ = make()
    for _ in range(5):
        await track.recv()
    vt.t += 0.200  # the event loop stalled for 200 ms
    vt.sleeps.clear()
    burst = 0
    for _ in range(20):
        before = len(vt.sleeps)
        await track.recv()
        if len(vt.sleeps) == before:
            burst += 1
        else:
            break
    assert burst <= 3  # the late frame itself plus at most two of catch-up
    pts = [(await track.recv()).pts for _ in range(3)]
    assert pts[1] - pts[0] == pts[2] - pts[1] == 960
