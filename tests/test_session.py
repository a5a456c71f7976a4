"""The core every door shares, on a virtual clock with a scripted engine: the start rule's budget,
gaps in ``turn_done`` and ``/metrics``, the deadline the session offers its engine, typed
messages in and typed events out, limits, drain, and an output that fails."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from myna.engines.base import AudioChunk, Engine, SynthesisStream
from myna.metrics import Metrics
from myna.audio.playout import Playout
from myna.session import Session


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
        session.output.next_frame()
        clock.t += 0.02
        await asyncio.sleep(0)


@pytest.mark.parametrize("chunks_end_at_words", [True, False])
async def test_a_late_chunk_is_a_gap_or_an_underrun_in_turn_done_and_metrics(chunks_end_at_words):
    clock, metrics, sent = Clock(), Metrics(), []
    engine = ScriptedEngine(chunks_end_at_words)
    session = Session(engine, Playout.for_session, lambda e: sent.append(e.to_dict()), metrics, clock=clock)
    session.receive(json.dumps({"type": "text", "turn_id": "t", "text": "Hello there, "}))
    stream, group = engine.streams[0]
    assert group is session  # the session is the engine's scheduling group
    stream._emit(AudioChunk(tone(0.2), 48_000))
    await asyncio.sleep(0)
    assert session.audio_runs_out_at() == pytest.approx(clock.t + 0.2)
    await play(session, clock, 25)  # 200 ms of audio, then 300 ms of nothing
    stream._emit(AudioChunk(tone(0.2), 48_000))
    stream._finish()
    await asyncio.sleep(0)
    session.receive(json.dumps({"type": "end_turn", "turn_id": "t"}))
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
    session = Session(engine, Playout.for_session, lambda e: sent.append(e.to_dict()), Metrics(), clock=clock, max_hold_s=0.06)
    session.receive(json.dumps({"type": "text", "turn_id": "t", "text": "Hello there "}))
    stream, _ = engine.streams[0]
    clock.t += 0.5  # a slow first chunk: the jitter-aware rule alone would wait for more
    stream._emit(AudioChunk(tone(0.08), 48_000))
    await asyncio.sleep(0)
    await play(session, clock, 10)
    first = next(e for e in sent if e["type"] == "first_audio")
    assert first["pre_roll_ms"] <= 60.0
    await session.close()


# -- the rules every door gets -----------------------------------------------------------
def unpaced(sent: list, **options) -> Session:
    """A session whose output hands audio over at once (as the WebSocket's and the plug-ins')."""
    from myna.audio.unpaced import UnpacedOutput

    class Sink:
        def put_audio(self, turn_id, pcm):
            pass

        def drop_audio(self):
            pass

    from inprocess import ToneEngine

    return Session(ToneEngine(), lambda s: UnpacedOutput.for_session(s, Sink(), 24_000),
                   lambda e: sent.append(e.to_dict()), Metrics(), **options)


async def test_typed_messages_and_json_take_the_same_path():
    from myna.messages import EndTurn, Text

    typed, raw = [], []
    a, b = unpaced(typed), unpaced(raw)
    a.handle(Text("t", "one two "))
    a.handle(EndTurn("t"))
    b.receive(json.dumps({"type": "text", "turn_id": "t", "text": "one two "}))
    b.receive(json.dumps({"type": "end_turn", "turn_id": "t"}))
    await asyncio.sleep(0.05)
    assert [e["type"] for e in typed] == [e["type"] for e in raw] == [
        "turn_started", "first_audio", "word", "word", "turn_done"]
    await a.close()
    await b.close()


async def test_bad_input_is_an_error_naming_its_turn_and_the_session_goes_on():
    sent = []
    session = unpaced(sent)
    session.receive("{nope")
    session.receive(json.dumps({"type": "text", "turn_id": "t", "text": 5}))
    session.receive(json.dumps({"type": "config", "sample_rate": "x"}))  # the WebSocket's alone
    assert [(e["code"], e.get("turn_id")) for e in sent] == [("bad_json", None), ("bad_message", "t"), ("unknown_type", None)]
    session.receive(json.dumps({"type": "end_turn", "turn_id": "t"}))
    session.receive(json.dumps({"type": "text", "turn_id": "t", "text": "late"}))
    assert sent[-1]["code"] == "turn_ended" and sent[-1]["turn_id"] == "t" and "'t'" not in sent[-1]["message"]
    await session.close()


async def test_the_turn_limits():
    from myna.limits import Limits

    sent = []
    session = unpaced(sent, limits=Limits(max_turn_chars=12, max_queued_turns=1))
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "one two "}))
    session.receive(json.dumps({"type": "text", "turn_id": "b", "text": "three"}))  # one turn at a time: refused
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "four"}))  # "a" goes on (a refusal ends nothing)
    codes = [(e["code"], e["turn_id"]) for e in sent if e["type"] == "error"]
    assert codes == [("too_many_turns", "b")]
    await session.close()
    sent.clear()
    session = unpaced(sent, limits=Limits(max_turn_chars=12))
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "one two "}))
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "three four five"}))
    await asyncio.sleep(0.05)
    assert [e["code"] for e in sent if e["type"] == "error"] == ["turn_too_long"]
    assert [e["word"] for e in sent if e["type"] == "word"] == ["one", "two"]  # what came before is spoken
    assert sent[-1]["type"] == "turn_done"
    await session.close()


async def test_drain_refuses_new_turns_and_lets_speaking_ones_finish():
    from myna.sessions import Sessions

    sessions = Sessions()
    sent, later = [], []
    speaking = sessions.open(ToneLong(), Playout.for_session, lambda e: sent.append(e.to_dict()))
    speaking.receive(json.dumps({"type": "text", "turn_id": "a", "text": "one two three "}))
    draining = asyncio.ensure_future(sessions.drain(timeout=5.0))
    await asyncio.sleep(0.1)
    speaking.receive(json.dumps({"type": "text", "turn_id": "b", "text": "four"}))
    fresh = sessions.open(ToneLong(), Playout.for_session, lambda e: later.append(e.to_dict()))
    fresh.receive(json.dumps({"type": "text", "turn_id": "c", "text": "five"}))
    assert sent[-1]["code"] == later[-1]["code"] == "draining" and not draining.done()
    speaking.receive(json.dumps({"type": "end_turn", "turn_id": "a"}))
    for _ in range(100):  # play the turn out
        speaking.output.next_frame()
        await asyncio.sleep(0.002)
    assert await draining is True and sent[-1]["type"] == "turn_done" and not sent[-1].get("interrupted")
    assert sessions.speaking() == 0
    for session in (speaking, fresh):
        await session.close()
    assert sessions.all() == []


async def test_an_output_that_cannot_be_interrupted_is_reset_and_the_turns_end():
    sent = []
    clock = Clock()
    session = Session(ScriptedEngine(False), Playout.for_session, lambda e: sent.append(e.to_dict()), Metrics(), clock=clock)
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "hello "}))
    real = session.output.interrupt

    def broken():  # the queue itself is what broke, this once
        session.output.interrupt = real
        raise RuntimeError("the queue broke")

    session.output.interrupt = broken
    session.output_failed(ValueError("boom"))
    assert [(e["type"], e.get("code"), e.get("interrupted")) for e in sent[1:]] == [
        ("error", "audio_failed", None), ("turn_done", None, True)]
    assert session.output.idle and not session.busy
    await session.close()


class ToneLong(Engine):
    """Each word: 100 ms of tone at 48 kHz, emitted at once."""

    name, sample_rate = "tone-long", 48_000

    def stream(self, voice=None, group=None):
        class Words(SynthesisStream):
            def _on_words(self, words):
                for _ in words:
                    self._emit(AudioChunk(tone(0.1), 48_000))

            def _on_end_input(self):
                self._finish()

        return Words()


async def test_a_turn_whose_input_goes_quiet_ends_as_end_turn_would_and_the_session_is_idle_again():
    """For every door: a sender that never ends its turn (crashed, trailer lost)."""
    from myna.limits import Limits

    sent = []
    session = unpaced(sent, limits=Limits(turn_idle_s=0.2))
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "one two "}))
    await asyncio.sleep(0.1)
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "three"}))  # text resets the bound
    await asyncio.sleep(0.15)
    assert not [e for e in sent if e["type"] == "error"]
    await asyncio.sleep(0.3)
    errors = [e for e in sent if e["type"] == "error"]
    assert [(e["code"], e["turn_id"]) for e in errors] == [("turn_idle", "a")]
    assert sent[-1]["type"] == "turn_done" and not sent[-1].get("interrupted")
    assert [e["word"] for e in sent if e["type"] == "word"] == ["one", "two", "three"]
    assert not session.busy
    await session.close()


async def test_a_new_turn_ends_only_its_own_senders_open_turn():
    """In the core: with senders named, B's turn queues behind A's open turn."""
    from myna.messages import EndTurn, Text

    sent = []
    session = unpaced(sent)
    session.handle(Text("a", "one two "), "alice")
    session.handle(Text("b", "three "), "bob")  # another sender: "a" stays open
    session.handle(Text("a", "four"), "alice")
    assert not [e for e in sent if e["type"] == "error"]
    session.handle(Text("c", "five"), "alice")  # alice's new turn ends alice's "a"
    session.handle(Text("a", "six"), "alice")
    assert [(e["code"], e["turn_id"]) for e in sent if e["type"] == "error"] == [("turn_ended", "a")]
    for turn_id, who in (("b", "bob"), ("c", "alice")):
        session.handle(EndTurn(turn_id), who)
    await asyncio.sleep(0.1)
    done = [e["turn_id"] for e in sent if e["type"] == "turn_done"]
    assert done == ["a", "b", "c"]
    words = {t: [e["word"] for e in sent if e["type"] == "word" and e["turn_id"] == t] for t in "abc"}
    assert words == {"a": ["one", "two", "four"], "b": ["three"], "c": ["five"]}
    await session.close()
