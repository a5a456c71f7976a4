"""The embedded voice's streaming strategies: by clause, by sentence, whole reply (the latency
race's ``piper``, ``piper-sentence`` and ``piper-whole`` lanes), sharing one loaded voice."""

from __future__ import annotations

import asyncio

import pytest

from myna.engines.piper import STRATEGIES, VARIANT_NAMES, PiperEngine, SentenceChunker, WholeChunker


def _units(chunker, text: str) -> list[str]:
    units = [u for w in text.split() for u in chunker.push(w)]
    return units + chunker.flush()


TEXT = "Sure, I can help: Dr. Lee sees you at 3.30 today! Is that fine? Great"


def test_sentence_chunker_cuts_at_sentence_ends_only():
    assert _units(SentenceChunker(), TEXT) == ["Sure, I can help: Dr. Lee sees you at 3.30 today!", "Is that fine?", "Great"]


def test_sentence_chunker_bounds_a_reply_without_punctuation():
    units = _units(SentenceChunker(max_words=5), "one two three four five six seven")
    assert units == ["one two three four five", "six seven"]


def test_whole_chunker_returns_one_unit_at_the_end():
    chunker = WholeChunker()
    assert [u for w in TEXT.split() for u in chunker.push(w)] == []
    assert chunker.flush() == [TEXT]
    assert _units(WholeChunker(max_chars=12), "aaaa bbbb cccc dddd") == ["aaaa bbbb cccc", "dddd"]


def test_variant_names_map_to_strategies():
    assert set(VARIANT_NAMES.values()) == set(STRATEGIES)
    assert VARIANT_NAMES["piper"] == "clause"


def test_serve_registers_the_strategies_on_one_voice():
    from myna.engines.build import EngineOptions, EngineOptionsError, build_engines

    engines = build_engines(EngineOptions(engines="piper,piper-sentence,piper-whole"))
    assert list(engines) == ["piper", "piper-sentence", "piper-whole"]
    assert [e.name for e in engines.values()] == list(engines)
    assert engines["piper-sentence"].base is engines["piper"] and engines["piper-whole"].base is engines["piper"]
    assert engines["piper-whole"].voices == engines["piper"].voices
    with pytest.raises(EngineOptionsError):
        build_engines(EngineOptions(engines="piper,nope"))


@pytest.mark.slow
def test_strategies_stream_the_same_words_in_fewer_units():
    from myna.engines import AudioChunk, WordEvent

    async def run():
        base = PiperEngine(workers=1)
        engines = {"piper": base, "piper-sentence": base.variant("piper-sentence", "sentence"),
                   "piper-whole": base.variant("piper-whole", "whole")}
        await asyncio.gather(*(e.start() for e in engines.values()))  # loads once
        out = {}
        try:
            for name, engine in engines.items():
                before = base.compute_stats()["units"]
                stream = engine.stream()
                stream.push_text("Hi, there. How are you?")
                stream.end_input()
                words, audio = [], 0
                async for item in stream:
                    if isinstance(item, WordEvent):
                        words.append(item.word)
                    elif isinstance(item, AudioChunk):
                        audio += 1
                out[name] = (base.compute_stats()["units"] - before, words, audio)
            stats = base.compute_stats()
        finally:
            await engines["piper-whole"].close()
            await base.close()  # idempotent
        return out, stats

    out, stats = asyncio.run(run())
    assert [out[name][0] for name in ("piper", "piper-sentence", "piper-whole")] == [3, 2, 1]  # units
    assert out["piper"][1] == out["piper-sentence"][1] == out["piper-whole"][1] == ["Hi", "there", "How", "are", "you"]
    assert all(audio >= units for units, _, audio in out.values())
    assert 0 < stats["busy_s"] <= stats["compute_s"] + 1e-6 and stats["audio_s"] > 1.0
