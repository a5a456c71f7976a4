"""The mono voice Opus encoder: packets, pts, the idle path, and clean decoding across idle."""

from __future__ import annotations

import fractions

import av
import numpy as np

from myna.audio.opus import SETTLE_FRAMES, OpusSettings, VoiceOpusEncoder
from myna.audio.playout import IDLE_FRAME


def decode(payloads: list[bytes]) -> np.ndarray:
    ctx = av.CodecContext.create("libopus", "r")
    ctx.format, ctx.layout, ctx.sample_rate = "s16", "stereo", 48_000
    out = [f.to_ndarray().reshape(-1)[0::2] for p in payloads for f in ctx.decode(av.Packet(p))]
    return np.concatenate(out).astype(np.float64) / 32768


def tone_frames(seconds: float, freq: float = 440.0, amp: float = 0.5) -> list[np.ndarray]:
    t = np.arange(int(seconds * 48_000)) / 48_000
    x = (amp * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)
    return list(x.reshape(-1, 960))


def test_packets_carry_the_frame_pts_and_idle_settles_to_3_bytes():
    enc = VoiceOpusEncoder()
    packets = [enc.encode(f, 960 * i) for i, f in enumerate(tone_frames(0.2))]
    packets += [enc.encode(IDLE_FRAME, 960 * (10 + i), silent=True) for i in range(20)]
    assert [p.pts for p in packets] == [960 * i for i in range(30)]
    assert all(p.time_base == fractions.Fraction(1, 48_000) for p in packets)
    sizes = [len(bytes(p)) for p in packets]
    assert all(s > 20 for s in sizes[:10])
    assert all(s == 3 for s in sizes[10 + SETTLE_FRAMES :])


def test_speech_idle_speech_decodes_without_glitches():
    enc = VoiceOpusEncoder()
    frames = tone_frames(0.5) + [IDLE_FRAME] * 50 + tone_frames(0.5)
    payloads = [bytes(enc.encode(f, 960 * i, silent=f is IDLE_FRAME)) for i, f in enumerate(frames)]
    x = decode(payloads)
    assert len(x) == len(frames) * 960
    assert np.max(np.abs(x)) < 0.5 * 1.15  # no spike at the mode switches
    idle = x[25 * 960 + 4800 : 75 * 960]  # 100 ms after the tone stops, up to the next tone
    assert np.max(np.abs(idle)) < 0.01
    second = x[75 * 960 + 4800 :]
    spectrum = np.abs(np.fft.rfft(second * np.hanning(len(second))))
    assert abs(np.argmax(spectrum) * 48_000 / len(second) - 440) <= 3


def test_bit_rate_follows_the_settings():
    frames = tone_frames(2.0, freq=220.0, amp=0.3)
    for settings, lo, hi in [(OpusSettings(), 16, 40), (OpusSettings(bitrate=64_000, fec=False), 40, 80)]:
        enc = VoiceOpusEncoder(settings)
        total = sum(len(bytes(enc.encode(f, 960 * i))) for i, f in enumerate(frames))
        kbit_s = 8 * total / 2.0 / 1000
        assert lo <= kbit_s <= hi, (settings, kbit_s)
