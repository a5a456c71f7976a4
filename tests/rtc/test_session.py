"""A session on a virtual clock with a scripted engine: the start rule's budget, gaps in
``turn_done`` and ``/metrics``, and the deadline the session offers its engine."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from myna.engines.base import AudioChunk, Engine, SynthesisStream
from myna.metrics import Metrics
from myna.rtc.session import Session


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Scripted(SynthesisStream):
    """Emits only what the test hands it."""

    def _on_words(self, words):
        pass

    def _on_end_input(self):
        pass


class ScriptedEngine(Engine):
    name, sample_rate = "scripted", 48_000

    def __init__(self, chunks_end_at_words: bool):
        self.chunks_end_at_words = chunks_end_at_words
        self.streams: list[tuple[Scripted, object]] = []

    def stream(self, voice=None, group=None):
        self.streams.append((Scripted(), group))
        return self.streams[-1][0]


def tone(seconds: float) -> np.ndarray:
    t = np.arange(int(48_000 * seconds)) / 48_000
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


async def play(session: Session, clock: Clock, frames: int) -> None:
    for _ in range(frames):
        session.playout.next_frame()
        clock.t += 0.02
        await asyncio.sleep(0)


@pytest.mark.parametrize("chunks_end_at_words", [True, False])
async def test_a_late_chunk_is_a_gap_or_an_underrun_in_turn_done_and_metrics(chunks_end_at_words):
    clock, metrics, sent = Clock(), Metrics(), []
    engine = ScriptedEngine(chunks_end_at_words)
    session = Session(engine=engine, send=sent.append, metrics=metrics, clock=clock)
    session.handle_message(json.dumps({"type": "text", "turn_id": "t", "text": "Hello there, "}))
    stream, group = engine.streams[0]
    assert group is session  # the session is the engine's scheduling group
    stream._emit(AudioChunk(tone(0.2), 48_000))
    await asyncio.sleep(0)
    assert session.audio_runs_out_at() == pytest.approx(clock.t + 0.2)
    await play(session, clock, 25)  # 200 ms of audio, then 300 ms of nothing
    stream._emit(AudioChunk(tone(0.2), 48_000))
    stream._finish()
    await asyncio.sleep(0)
    session.handle_message(json.dumps({"type": "end_turn", "turn_id": "t"}))
    await play(session, clock, 20)
    first = next(e for e in sent if e["type"] == "first_audio")
    done = next(e for e in sent if e["type"] == "turn_done")
    assert first["pre_roll_ms"] <= 100.0
    text = metrics.render().decode()
    if chunks_end_at_words:
        assert done["underruns"] == 0 and done["gap_ms"]["count"] == 1
        assert 280.0 <= done["gap_ms"]["total"] <= 320.0 and done["gaps"][0][0] == 200.0
        assert 'myna_gaps_total{engine="scripted"} 1.0' in text
        assert f'myna_gap_seconds_total{{engine="scripted"}} {done["gap_ms"]["total"] / 1000.0}' in text
    else:
        assert done["underruns"] == 1 and done["gap_ms"]["count"] == 0
        assert 'myna_underruns_total{engine="scripted"} 1.0' in text
    assert 'myna_pre_roll_seconds_count{engine="scripted"} 1.0' in text
    await session.close()


async def test_the_budget_bounds_the_hold_of_a_frame_level_producer():
    clock = Clock()
    engine = ScriptedEngine(chunks_end_at_words=False)
    sent: list[dict] = []
    session = Session(engine=engine, send=sent.append, metrics=Metrics(), clock=clock, max_hold_s=0.06)
    session.handle_message(json.dumps({"type": "text", "turn_id": "t", "text": "Hello there "}))
    stream, _ = engine.streams[0]
    clock.t += 0.5  # a slow first chunk: the jitter-aware rule alone would wait for more
    stream._emit(AudioChunk(tone(0.08), 48_000))
    await asyncio.sleep(0)
    await play(session, clock, 10)
    first = next(e for e in sent if e["type"] == "first_audio")
    assert first["pre_roll_ms"] <= 60.0
    await session.close()
