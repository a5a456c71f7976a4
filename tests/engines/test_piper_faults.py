"""A failure inside one Piper unit is contained: the unit is retried once, then left
out with an ``unit_failed`` error event, and the rest of the turn is spoken; with a fallback
engine the fallback speaks it."""

from __future__ import annotations

import asyncio
import json

import pytest

from inprocess import ToneEngine, collect, paced_session
from myna.engines import AudioChunk, EngineError, ErrorEvent, FallbackEvent, WordEvent
from myna.engines.fallback import FallbackEngine
from myna.metrics import Metrics

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture
def faults(engine):
    """``faults(word, times, exc)``: the next ``times`` latent jobs of a unit holding ``word``
    raise ``exc``; returns the texts encoded, failures included."""
    real = engine.encode_unit
    calls: list[str] = []
    plan: dict[str, list] = {}

    def encode_unit(text: str, *options):  # (speed, voice)
        calls.append(text)
        for word, left in plan.items():
            if word in text and left[0] > 0:
                left[0] -= 1
                raise left[1]
        return real(text, *options)

    def arm(word: str, times: int, exc: BaseException) -> list[str]:
        plan[word] = [times, exc]
        return calls

    engine.encode_unit = encode_unit
    yield arm
    del engine.encode_unit


async def turn(stream, text: str, timeout: float = 120.0) -> list:
    stream.push_text(text)
    stream.end_input()
    return await collect(stream, timeout)


def words(items) -> list[str]:
    return [i.word for i in items if isinstance(i, WordEvent)]


def errors(items) -> list[ErrorEvent]:
    return [i for i in items if isinstance(i, ErrorEvent)]


@pytest.mark.slow
async def test_a_unit_that_fails_twice_is_left_out_and_the_rest_is_spoken(engine, faults):
    calls = faults("Press", 2, RuntimeError("onnxruntime: bad state"))
    items = await turn(engine.stream(), "Press the buttons now. Then wait.")
    assert words(items) == ["Then", "wait"]
    assert [e.code for e in errors(items)] == ["unit_failed"]
    assert "Press the buttons now" in errors(items)[0].message
    assert sum("Press" in c for c in calls) == 2  # tried, then retried once
    audio = [i for i in items if isinstance(i, AudioChunk)]
    assert sum(a.duration_ms for a in audio) > 300  # "Then wait." was synthesised
    assert items.index(errors(items)[0]) < items.index(audio[0])  # in turn order


async def test_a_unit_that_fails_once_is_retried_and_nothing_is_lost(engine, faults):
    calls = faults("buttons", 1, ValueError("transient"))
    items = await turn(engine.stream(), "Press the buttons now. Then wait.")
    assert words(items) == ["Press", "the", "buttons", "now", "Then", "wait"]
    assert not errors(items)
    assert sum("buttons" in c for c in calls) == 2


@pytest.mark.parametrize("word, exc", [("Four", MemoryError()), ("Seven", OSError("model file gone"))])
async def test_any_unit_and_any_exception(engine, faults, word, exc):
    faults(word, 2, exc)
    text = "One, two, three. Four five six. Seven eight."
    items = await turn(engine.stream(), text)
    kept = [w.strip(",.") for w in text.split()]
    unit = {"Four": ["Four", "five", "six"], "Seven": ["Seven", "eight"]}[word]
    assert words(items) == [w for w in kept if w not in unit]
    assert [e.code for e in errors(items)] == ["unit_failed"]


async def test_the_session_reports_the_unit_and_finishes_the_turn(engine, faults):
    faults("Press", 2, RuntimeError("boom"))
    sent: list[dict] = []
    clock = [100.0]
    session = paced_session(engine, sent, Metrics(), clock=lambda: clock[0])
    session.receive(json.dumps({"type": "text", "turn_id": "t", "text": "Press the buttons now. Then wait."}))
    session.receive(json.dumps({"type": "end_turn", "turn_id": "t"}))
    for _ in range(3000):
        session.output.next_frame()
        clock[0] += 0.02
        await asyncio.sleep(0.001)
        if any(e["type"] == "turn_done" for e in sent):
            break
    kinds = [(e["type"], e.get("code")) for e in sent if e["type"] in ("error", "turn_done")]
    assert kinds == [("error", "unit_failed"), ("turn_done", None)]  # no engine_failed
    assert [e["word"] for e in sent if e["type"] == "word"] == ["Then", "wait"]
    await session.close()


async def test_with_a_fallback_the_failed_unit_is_spoken_by_it(engine, faults):
    faults("Press", 2, RuntimeError("boom"))
    wrapped = FallbackEngine(engine, ToneEngine("backup"))
    items = await turn(wrapped.stream(group=object()), "Press the buttons now. Then wait.")
    assert [i for i in items if isinstance(i, FallbackEvent)] == [FallbackEvent("piper", "backup", "error", 0)]
    assert [w.strip(".") for w in words(items)] == ["Press", "the", "buttons", "now", "Then", "wait"]
    assert not errors(items)  # nothing was left out
    assert all(a.sample_rate == engine.sample_rate for a in items if isinstance(a, AudioChunk))


async def test_a_chunk_that_fails_twice_leaves_out_the_rest_of_its_unit_only(engine, monkeypatch):
    real, calls = engine.render, []

    def render(latent, start, end, *voice):
        calls.append(start)
        if start > 0 and len(calls) <= 4:  # the first unit's second chunk, and its retry
            raise RuntimeError("onnxruntime: bad state")
        return real(latent, start, end, *voice)

    monkeypatch.setattr(engine, "render", render)
    items = await turn(engine.stream(), "Please press every one of the buttons on the panel now. Then wait.")
    assert [e.code for e in errors(items)] == ["unit_failed"]
    said = words(items)
    assert said[-2:] == ["Then", "wait"] and said[0] == "Please" and len(said) < 12  # its start, not its rest
    assert calls.count(0) == 2  # the next unit was rendered from its start


async def test_a_failure_outside_synthesis_still_ends_only_its_turn(engine, monkeypatch):
    import myna.engines.piper as piper

    stream = engine.stream()
    monkeypatch.setattr(piper, "_UnitOut", lambda *a: 1 / 0)
    with pytest.raises(EngineError) as err:
        await turn(stream, "Hello there.")
    assert err.value.code == "engine_failed"
    monkeypatch.undo()
    assert words(await turn(engine.stream(), "Hello there.")) == ["Hello", "there"]
