"""SourceOutput: the playout feeding a real ``rtc.AudioSource`` (no room needed)."""

from __future__ import annotations

import asyncio

import numpy as np

from myna.room.audio import QUEUE_MS, SourceOutput, new_source


def speech(ms: float, rate: int = 22050) -> np.ndarray:
    t = np.arange(int(rate * ms / 1000)) / rate
    return (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


async def test_silence_is_not_queued_ahead_of_speech_and_speech_is_paced_by_the_source():
    events = []
    out = SourceOutput(lambda event: event.type != "turn_started" and events.append(event.to_dict()), new_source())
    try:
        out.begin_turn("t", text_at=0.0)
        await asyncio.sleep(0.15)  # pre-roll: nothing to say yet
        assert out.frames_sent == 0 and out.source.queued_duration == 0
        out.push_audio("t", speech(600), 22050)
        out.end_turn("t")
        await asyncio.sleep(0.1)
        # The source accepts up to its queue at once and then paces to real time: never far ahead.
        assert out.source.queued_duration <= 2 * QUEUE_MS / 1000 + 0.005
        assert [e["type"] for e in events][:1] == ["first_audio"]
        for _ in range(400):  # (a loaded machine may be slow; nothing here asserts speed)
            if events[-1]["type"] == "turn_done":
                break
            await asyncio.sleep(0.05)
        assert events[-1]["type"] == "turn_done" and events[-1]["audio_ms"] == 600.0
        await asyncio.sleep(0.2)  # turn_done goes with the last frame, whose capture may still wait (≤ 40 ms)
        sent = out.frames_sent
        await asyncio.sleep(0.1)
        assert out.frames_sent == sent  # idle: the source sends silence by itself
    finally:
        await out.aclose()
    assert out._task.done()


async def test_a_barge_in_leaves_at_most_the_source_queue_and_the_fade():
    out = SourceOutput(lambda e: None, new_source())
    try:
        out.begin_turn("t", text_at=0.0)
        out.push_audio("t", speech(2000), 22050)
        out.end_turn("t")
        await asyncio.sleep(0.3)
        dropped = out.interrupt()
        assert dropped[0].turn_id == "t" and dropped[0].audio_ms > 0
        assert 5.0 <= out.interrupt_tails_ms[-1] <= 2 * QUEUE_MS + 5.0 + 2.0
        await asyncio.sleep(0.1)
        sent = out.frames_sent
        await asyncio.sleep(0.1)
        assert out.idle and out.frames_sent == sent
        out.begin_turn("u", text_at=0.0)  # the next turn plays
        out.push_audio("u", speech(100), 22050)
        out.end_turn("u")
        await asyncio.sleep(0.3)
        assert out.frames_sent >= sent + 5
    finally:
        await out.aclose()


async def test_a_closed_line_holds_the_turn_whole_until_it_opens():
    """A phone caller whose call is not up yet: the turn waits in the playout, nothing of it is
    sent or lost, and its first frame goes out (with ``first_audio``) when the line opens."""
    events = []
    line = asyncio.Event()
    out = SourceOutput(lambda event: events.append(event.to_dict()), new_source(), line=line)
    try:
        out.begin_turn("t", text_at=0.0)
        out.push_audio("t", speech(300), 22050)
        out.end_turn("t")
        await asyncio.sleep(0.2)
        assert out.frames_sent == 0 and "first_audio" not in [e["type"] for e in events]
        line.set()
        for _ in range(200):
            if events and events[-1]["type"] == "turn_done":
                break
            await asyncio.sleep(0.02)
        assert [e["type"] for e in events if e["type"] in ("first_audio", "turn_done")] == ["first_audio", "turn_done"]
        for _ in range(50):  # turn_done goes with the last frame, whose capture may still wait (≤ 40 ms)
            if out.frames_sent == 15:
                break
            await asyncio.sleep(0.02)
        assert events[-1]["audio_ms"] == 300.0 and out.frames_sent == 15  # all of it, 20 ms frames
    finally:
        await out.aclose()
