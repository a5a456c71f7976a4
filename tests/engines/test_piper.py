"""The embedded Piper engine: streaming by clause, words, cancel, long unpunctuated text."""

from __future__ import annotations

import asyncio
from functools import partial

import numpy as np
import pytest

from inprocess import collect as collect_items
from myna.engines import AudioChunk, EngineError, WordEvent
from myna.engines.piper import PiperEngine


@pytest.fixture(scope="module")
def engine():
    async def start():
        e = PiperEngine(workers=1)
        await e.start()
        return e

    return asyncio.run(start())


collect = partial(collect_items, timeout=120.0)  # this module's bound (s)


@pytest.mark.slow
async def test_first_clause_is_synthesised_before_the_turn_ends(engine):
    units = engine.compute_stats()["units"]
    stream = engine.stream()
    for chunk in ["Hello", " there,", " how are", " you"]:
        stream.push_text(chunk)
    first = await asyncio.wait_for(stream.__aiter__().__anext__(), 10)
    # "Hello there," was complete: its audio exists while the turn is still open.
    assert isinstance(first, (AudioChunk, WordEvent))
    stream.end_input()
    items = [first] + await collect(stream)
    words = [i.word for i in items if isinstance(i, WordEvent)]
    assert words == ["Hello", "there", "how", "are", "you"]
    chunks = [i for i in items if isinstance(i, AudioChunk)]
    assert engine.compute_stats()["units"] - units == 2  # "Hello there," and "how are you"
    assert all(c.sample_rate == 22_050 for c in chunks)
    starts = [i.start_ms for i in items if isinstance(i, WordEvent)]
    assert starts == sorted(starts) and starts[0] < 50
    total_ms = sum(c.duration_ms for c in chunks)
    assert starts[-1] < total_ms


async def test_a_word_split_across_chunks_is_spoken_whole(engine):
    stream = engine.stream()
    for chunk in ["Read the ref", "erence", " manual."]:
        stream.push_text(chunk)
    stream.end_input()
    words = [i.word for i in await collect(stream) if isinstance(i, WordEvent)]
    assert words == ["Read", "the", "reference", "manual"]


async def test_cancel_ends_the_stream_at_once(engine):
    stream = engine.stream()
    stream.push_text("This sentence is long enough to take a while to synthesise, and then some more words follow.")
    stream.cancel()
    assert await collect(stream, timeout=2) == []


async def test_unknown_voice_is_a_clear_error(engine):
    with pytest.raises(EngineError) as err:
        engine.stream("nobody")
    assert err.value.code == "unknown_voice"


@pytest.mark.slow
async def test_5000_characters_without_punctuation_speak_every_word(engine):
    """About 100 s: 5,000 characters are some five minutes of speech, all synthesised here."""
    vocabulary = ["remarkable", "neighbourhood", "understanding", "conversation", "extraordinary", "information"]
    words = []
    while len(" ".join(words)) < 5000:
        words.append(vocabulary[len(words) % len(vocabulary)])
    text = " ".join(words)
    assert len(text) >= 5000 and not any(c in text for c in ".,;:!?")
    stream = engine.stream()
    for i in range(0, len(text), 7):  # token-sized chunks that split words anywhere
        stream.push_text(text[i : i + 7])
    stream.end_input()
    items = await collect(stream, timeout=300)
    spoken = [i.word for i in items if isinstance(i, WordEvent)]
    assert spoken == words
    audio_s = sum(len(i.pcm) for i in items if isinstance(i, AudioChunk)) / 22_050
    assert audio_s > 0.25 * len(words)  # every word has audio, none were dropped
    assert all(np.isfinite(i.pcm).all() for i in items if isinstance(i, AudioChunk))
