"""The in-process plug-in door runs the same session as every other door: a fallback switch, the
turn limits, an engine's failure (the in-process backend skipped the session and
crashed with ``AttributeError: 'FallbackEvent' object has no attribute 'word'`` at a switch)."""

from __future__ import annotations

import re

import pytest

from inprocess import ToneEngine
from myna.bench.faulty import FaultyEngine
from myna.engines.fallback import FallbackEngine
from myna.errors import MynaError
from myna.integrations.backend import Audio, LocalBackend, Notice, Word
from myna.limits import Limits
from myna.sessions import Sessions

TEXT = "one two three four five six"
WORDS = TEXT.split()


def switching_engine(fault: str = "raise") -> FallbackEngine:
    """A primary that fails after two words, behind a backup at another rate."""
    return FallbackEngine(FaultyEngine(ToneEngine("primary"), fault, at_word=2), ToneEngine("backup", sample_rate=16_000))


async def speak(backend: LocalBackend, text: str = TEXT) -> list:
    turn = await backend.open_turn()
    for token in re.findall(r"\S+\s*", text):
        await turn.push_text(token)
    await turn.end_input()
    return [item async for item in turn]


async def test_a_fallback_switch_mid_turn_is_heard_word_for_word():
    backend = LocalBackend(switching_engine(), sample_rate=24_000)
    await backend.start()
    try:
        items = await speak(backend)
        assert [i.word for i in items if isinstance(i, Word)] == WORDS  # each word once, in order
        audio = b"".join(i.pcm for i in items if isinstance(i, Audio))
        assert len(audio) / 2 / 24_000 == pytest.approx(6 * 0.12, abs=0.02)  # both engines' audio, at one rate
        assert not [i for i in items if isinstance(i, Notice)]
        items = await speak(backend, "seven eight")  # the session goes on
        assert [i.word for i in items if isinstance(i, Word)] == ["seven", "eight"]
    finally:
        await backend.aclose()


async def test_an_engine_failure_is_a_myna_error_and_the_next_turn_speaks():
    backend = LocalBackend(FaultyEngine(ToneEngine(), "raise", at_word=2))
    await backend.start()
    try:
        with pytest.raises(MynaError) as err:
            await speak(backend)
        assert err.value.code == "engine_failed"
    finally:
        await backend.aclose()


async def test_the_in_process_door_applies_the_turn_limits():
    backend = LocalBackend(ToneEngine(), sessions=Sessions(limits=Limits(max_turn_chars=10)))
    await backend.start()
    try:
        with pytest.raises(MynaError) as err:
            await speak(backend)  # 27 characters
        assert err.value.code == "turn_too_long"
    finally:
        await backend.aclose()


async def test_the_livekit_agents_plugin_in_process_survives_a_fallback_switch():
    pytest.importorskip("livekit.agents")
    from myna.integrations import livekit as myna_livekit

    tts = myna_livekit.TTS(engine=switching_engine(), sample_rate=24_000)
    try:
        async with tts.synthesize(TEXT) as stream:
            frames = [event.frame async for event in stream]
    finally:
        await tts.aclose()
    assert sum(f.samples_per_channel for f in frames) / 24_000 == pytest.approx(6 * 0.12, abs=0.03)


async def test_the_pipecat_plugin_in_process_survives_a_fallback_switch():
    pytest.importorskip("pipecat")
    from pipecat.frames.frames import TTSAudioRawFrame, TTSTextFrame

    from myna.integrations.pipecat import MynaTTSService
    from tests.integrations.test_pipecat import llm_reply, run

    down = await run(MynaTTSService(engine=switching_engine()), llm_reply(TEXT))
    assert [f.text.strip() for f in down if isinstance(f, TTSTextFrame)] == WORDS
    assert sum(len(f.audio) for f in down if isinstance(f, TTSAudioRawFrame)) / 2 / 24_000 == pytest.approx(0.72, abs=0.03)


async def test_closing_the_backend_mid_turn_ends_the_turns_iteration():
    import asyncio

    backend = LocalBackend(ToneEngine(word_ms=120.0))
    await backend.start()
    turn = await backend.open_turn()
    await turn.push_text("one two three four five six ")  # no end_input: the turn stays open
    items = []

    async def consume():
        async for item in turn:
            items.append(item)

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.05)
    await backend.aclose()
    await asyncio.wait_for(consumer, 2.0)  # (it waited for ever)
    assert items  # what had come is kept


async def test_text_after_end_input_is_refused_at_the_call_and_the_turn_is_spoken():
    backend = LocalBackend(ToneEngine())
    await backend.start()
    try:
        turn = await backend.open_turn()
        await turn.push_text("one two ")
        await turn.end_input()
        with pytest.raises(RuntimeError):
            await turn.push_text("three ")
        assert [i.word for i in [x async for x in turn] if isinstance(i, Word)] == ["one", "two"]
    finally:
        await backend.aclose()


async def test_a_turn_the_session_refuses_frees_its_session_for_the_next():
    sessions = Sessions()
    backend = LocalBackend(ToneEngine(), sessions=sessions)
    await backend.start()
    try:
        await sessions.drain(0.0)  # every new turn is refused: draining
        for _ in range(3):
            with pytest.raises(MynaError) as err:
                await speak(backend)
            assert err.value.code == "draining"
        assert len(sessions.all()) == 1  # one session, reused (each refused turn used to keep its own)
    finally:
        await backend.aclose()
