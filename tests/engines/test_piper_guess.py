"""The first phrase synthesised on a guess: while the early first phrase waits to
learn whether its last word is complete, its latent is made on the guess that it is, and used
when the phrase comes out as guessed, else dropped; on the bundled voice
(tests/engines/conftest.py ``engine``)."""

from __future__ import annotations

import asyncio
import time

import pytest

from inprocess import collect
from myna.engines import WordEvent

# serial: chunks 50 ms apart must come well inside the 250 ms first-phrase wait.
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.serial]

GAP_S = 0.05  # between chunks: well inside the first phrase's wait (0.25 s) and the quiet time


async def _turn(engine, chunks: list[str]) -> tuple[list[tuple[str, float]], list[float], list[str], dict]:
    """Stream ``chunks`` GAP_S apart; the latent jobs asked for (text, when), when each chunk
    was pushed, the turn's word events, and the engine's guess counters' change."""
    asked: list[tuple[str, float]] = []
    encode = engine.encode_unit

    def spy(text, *args):
        asked.append((text, time.monotonic()))
        return encode(text, *args)

    engine.encode_unit = spy
    before = dict(engine.guesses)
    try:
        stream = engine.stream()
        pushed = []
        for chunk in chunks:
            stream.push_text(chunk)
            pushed.append(time.monotonic())
            await asyncio.sleep(GAP_S)
        stream.end_input()
        items = await collect(stream)
    finally:
        del engine.encode_unit
    words = [item.word for item in items if isinstance(item, WordEvent)]
    return asked, pushed, words, {k: engine.guesses[k] - before[k] for k in before}


async def test_a_first_phrase_guessed_right_is_synthesised_once_before_its_last_word_is_confirmed(engine):
    asked, pushed, words, guesses = await _turn(engine, ["Well", " I", " think", " yes", " and", " more."])
    assert words == ["Well", "I", "think", "yes", "and", "more"]
    assert [text for text, _ in asked] == ["Well I think", "yes and more."]  # (FIRST_PHRASE_WORDS: 3)
    assert asked[0][1] < pushed[3]  # started before " yes" said that "think" was complete
    assert guesses == {"used": 1, "dropped": 0}


async def test_a_word_that_goes_on_drops_the_guess_and_the_phrase_is_said_whole(engine):
    asked, pushed, words, guesses = await _turn(engine, ["Well", " I", " boo", "ked", " it", " today."])
    assert words == ["Well", "I", "booked", "it", "today"]  # never "boo"
    texts = [text for text, _ in asked]
    assert texts[-2:] == ["Well I booked", "it today."] and texts.count("Well I booked") == 1
    assert set(texts[:-2]) <= {"Well I boo"}  # the first guess: dropped (perhaps before it ran)
    assert guesses == {"used": 1, "dropped": 1}
    assert asked[-2][1] < pushed[4]  # the second guess, started before " it" confirmed it


async def test_a_first_phrase_that_ends_at_punctuation_needs_no_guess(engine):
    asked, _, words, guesses = await _turn(engine, ["Sure,", " I", " can", " help."])
    assert words == ["Sure", "I", "can", "help"]
    assert [text for text, _ in asked] == ["Sure,", "I can help."] and guesses == {"used": 0, "dropped": 0}
