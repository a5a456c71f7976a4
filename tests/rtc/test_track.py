"""The paced track with a virtual clock: frame format, pts, absolute deadlines, catch-up, Opus packets."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame

from myna.audio.opus import OpusSettings
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


def make(opus=None):
    vt = VirtualTime()
    events: list[dict] = []
    playout = Playout(lambda event: events.append(event.to_dict()), clock=vt.clock)
    return PacedAudioTrack(playout, clock=vt.clock, sleep=vt.sleep, opus=opus), playout, vt, events


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


async def test_packets_pts_across_3_s_of_idle_and_idle_costs_3_bytes():
    track, playout, vt, events = make(OpusSettings())
    packets = []
    speak(playout, "a", 0.5)
    for _ in range(180):  # the turn, then 3 s of idle
        packets.append(await track.recv())
    speak(playout, "b", 0.5)
    for _ in range(30):
        packets.append(await track.recv())
    assert all(isinstance(p, av.Packet) for p in packets)
    assert [p.pts for p in packets] == [960 * i for i in range(len(packets))]
    assert all(p.time_base == fractions.Fraction(1, 48_000) for p in packets)
    assert all(len(bytes(p)) == 3 for p in packets[60:180])  # settled idle: the cached silent packet
    assert len(bytes(packets[185])) > 20  # speech again
    assert vt.t == pytest.approx(50.0 + 0.02 * (len(packets) - 1))


async def test_deadlines_are_absolute_and_do_not_drift():
    track, _, vt, _ = make()
    start = vt.t
    for i in range(500):
        await track.recv()
        vt.t += 0.0013 * (i % 3)  # uneven work between calls must not accumulate
    assert abs(vt.t - (start + 499 * 0.020) - 0.0013 * (499 % 3)) < 1e-9
    assert track.slips == 0


async def test_a_small_stall_is_caught_up_on_the_original_grid():
    """35 ms late (< 2 frames): frames go out back to back until on time, then the grid holds."""
    track, _, vt, _ = make()
    start = vt.t
    for _ in range(5):
        await track.recv()
    vt.t += 0.020 + 0.035  # frame 5 (due at +100 ms) wakes at +135 ms
    sent = []
    for _ in range(10):
        vt.sleeps.clear()
        await track.recv()
        sent.append((vt.t, len(vt.sleeps)))
    back_to_back = [i for i, (_, slept) in enumerate(sent) if not slept]
    assert back_to_back == [0, 1]  # the late frame and one more
    assert sent[-1][0] == pytest.approx(start + 14 * 0.020)  # still on the original grid
    assert track.slips == 0


async def test_a_late_wake_up_sends_at_most_two_frames_back_to_back():
    track, _, vt, _ = make()
    for _ in range(5):
        await track.recv()
    vt.t += 0.200  # the event loop stalled for 200 ms
    times = []
    for _ in range(20):
        await track.recv()
        times.append(vt.t)
    gaps = np.diff(times)
    burst = 1 + int(np.argmax(gaps > 1e-9)) if np.any(gaps > 1e-9) else len(times)
    assert burst <= 3  # the late frame itself plus at most two of catch-up
    assert np.allclose(gaps[burst - 1 :], 0.020)  # then steady 20 ms spacing
    assert track.slips == 1
    pts = [(await track.recv()).pts for _ in range(3)]
    assert pts[1] - pts[0] == pts[2] - pts[1] == 960


async def test_pacing_is_read_only_and_one_snapshot_says_it_all():
    track, _, vt, _ = make()
    for _ in range(5):
        await track.recv()
    vt.t += 0.200  # one slip
    await track.recv()
    before = track.stats()
    assert (before.frames, before.slips, before.errors) == (6, 1, 0)
    assert (before.deadline, before.lateness) == (track.deadline, track.lateness)
    assert before.lateness == pytest.approx(0.180)  # frame 5 was due at +100 ms, woke at +280 ms
    await track.recv()
    after = track.stats()
    assert after.frames - before.frames == 1 and after.slips == before.slips  # snapshots do not move
    assert after.deadline == pytest.approx(vt.t) and after.lateness == pytest.approx(0.0)  # on the new grid
    for name in ("deadline", "lateness", "slips", "errors"):
        with pytest.raises(AttributeError):
            setattr(track, name, 0)


async def test_a_stall_inside_the_sleep_also_sends_no_burst():
    vt = VirtualTime()
    playout = Playout(lambda e: None, clock=vt.clock)
    stalls = iter([0.0] * 5 + [0.25] + [0.0] * 100)

    async def sleep(seconds: float) -> None:
        vt.t += seconds + next(stalls)

    track = PacedAudioTrack(playout, clock=vt.clock, sleep=sleep, opus=None)
    times = []
    for _ in range(30):
        await track.recv()
        times.append(vt.t)
    gaps = np.diff(times)
    assert np.sum(gaps < 1e-9) <= 2
    assert np.allclose(gaps[-20:], 0.020)


async def test_packets_decode_back_to_the_tone():
    track, playout, vt, _ = make(OpusSettings())
    speak(playout, "a", 1.0)
    decoder = OpusDecoder()
    out = []
    for _ in range(60):
        p = await track.recv()
        for frame in decoder.decode(JitterFrame(data=bytes(p), timestamp=p.pts)):
            out.append(frame.to_ndarray().reshape(-1)[0::2])  # left channel of s16 stereo
    x = np.concatenate(out).astype(np.float64) / 32768
    audio = x[4800:48_000]
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    assert abs(np.argmax(spectrum) * 48_000 / len(audio) - 440) <= 3
    assert np.sqrt(np.mean(audio**2)) == pytest.approx(0.5 / np.sqrt(2), rel=0.1)  # level kept (mono, no -3 dB pan)
    assert np.max(np.abs(x[50_000:])) < 0.01  # silence after the turn


async def test_a_frame_that_cannot_be_built_goes_out_as_silence_and_the_track_keeps_going():
    """aiortc's sender stops for good at the first exception recv() raises: recv() must not raise."""
    track, playout, vt, events = make(OpusSettings())
    errors = []
    track._on_error = errors.append
    put_unplayable_chunk(playout, "bad")
    packets = [await track.recv() for _ in range(3)]
    assert len(errors) == 3 and track.errors == 3 and all(isinstance(e, ValueError) for e in errors)
    assert [p.pts for p in packets] == [0, 960, 1920]


def put_unplayable_chunk(playout: Playout, turn_id: str) -> None:
    """Queue a [960, 2] chunk past the producer-side checks: no frame can be built from it."""
    if turn_id not in playout._by_id:
        playout.begin_turn(turn_id, 0.0)
    turn = playout._by_id[turn_id]
    turn.chunks.append(np.zeros((960, 2), np.float32))
    turn.buffered = 960
    playout.end_turn(turn_id)


async def test_a_session_drops_its_turns_says_so_and_speaks_again_when_a_frame_fails():
    from inprocess import ToneEngine, paced_session

    sent = []
    session = paced_session(ToneEngine(), sent)
    track = PacedAudioTrack(session.output, on_error=session.output_failed)  # as the WebRTC door builds it
    session.receive('{"type": "text", "turn_id": "a", "text": "one two "}')
    put_unplayable_chunk(session.output, "a")  # the turn's queue now holds it
    for _ in range(3):
        await track.recv()
    assert [(e["type"], e.get("code"), e.get("interrupted")) for e in sent[1:]] == [
        ("error", "audio_failed", None), ("turn_done", None, True)]
    session.receive('{"type": "text", "turn_id": "b", "text": "three "}')
    session.receive('{"type": "end_turn", "turn_id": "b"}')
    for _ in range(40):
        await track.recv()
    assert sent[-1]["type"] == "turn_done" and sent[-1]["turn_id"] == "b" and sent[-1]["audio_ms"] > 100
    await session.close()
