"""The dsm engine (myna.engines.dsm) on a tiny random checkpoint: streaming turns, words, voices,
cancel, and a failing turn that ends alone with an error."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch

from inprocess import collect
from myna.engines import AudioChunk, EngineError, WordEvent

os.environ.setdefault("NO_TORCH_COMPILE", "1")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from myna.bench.tiny_dsm import build_tiny_checkpoint
    from myna.bench.tiny_dsm import TINY_VOICE
    from myna.engines.dsm import DSMEngine

    threads = torch.get_num_threads()
    folder = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_engine"), seed=0)
    eng = DSMEngine(folder, voice=folder / TINY_VOICE, n_q=32, guidance=2, max_ahead_s=float("inf"), seed=9,
                    threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.close())
    torch.set_num_threads(threads)




@pytest.mark.slow
async def test_a_turn_streams_frames_and_words(engine):
    assert engine.tts.n_q == engine.tts.cfg.n_q  # 32 clamped to the model's
    assert engine.tts.cfg_value == "2.0"
    stream = engine.stream()
    for chunk in ("Hel", "lo wor", "ld, how are", " you?"):
        stream.push_text(chunk)
    stream.end_input()
    items = await collect(stream)
    audio = [i for i in items if isinstance(i, AudioChunk)]
    words = [i for i in items if isinstance(i, WordEvent)]
    assert audio and all(a.sample_rate == 24000 and a.pcm.shape == (1920,) for a in audio)
    assert [w.word for w in words] == ["Hello", "world", "how", "are", "you"]
    assert words[0].start_ms == 0.0 and [w.start_ms for w in words] == sorted(w.start_ms for w in words)
    # same seed, same text: the same audio, whatever the chunking
    again = engine.stream()
    again.push_text("Hello world, how are you?")
    again.end_input()
    pcm2 = np.concatenate([i.pcm for i in await collect(again) if isinstance(i, AudioChunk)])
    np.testing.assert_array_equal(np.concatenate([a.pcm for a in audio]), pcm2)


async def test_unknown_voice_is_refused(engine):
    with pytest.raises(EngineError) as err:
        engine.stream(voice="nobody")
    assert err.value.code == "unknown_voice"
    engine.stream(voice="default").cancel()


async def test_cancel_ends_the_stream_and_frees_the_slot(engine):
    stream = engine.stream()
    stream.push_text("A long sentence that would take a while to say out loud.")
    it = stream.__aiter__()
    first = await asyncio.wait_for(it.__anext__(), 30)
    assert isinstance(first, (AudioChunk, WordEvent))
    stream.cancel()
    await collect(stream, 5)
    for _ in range(200):
        if engine.loop.busy_slots == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.loop.busy_slots == 0


async def test_an_engine_exception_ends_only_its_own_turn(engine):
    bad, good = engine.stream(), engine.stream()

    def explode(pcm):
        raise RuntimeError("decoder exploded")

    bad._audio = explode
    await asyncio.sleep(0.01)  # each stream takes its slot on the next loop iteration
    bad._session.on_audio = explode
    for s in (bad, good):
        s.push_text("Hello there, friend.")
        s.end_input()
    with pytest.raises(EngineError) as err:
        await collect(bad)
    assert err.value.code == "engine_failed"
    items = await collect(good)
    assert any(isinstance(i, AudioChunk) for i in items)


async def test_churn_leaves_no_slots_or_tasks(engine):
    import random

    rng = random.Random(1)
    before = {t for t in asyncio.all_tasks()}

    async def turn(i):
        stream = engine.stream()
        await asyncio.sleep(rng.random() * 0.05)
        kind = rng.random()
        if kind < 0.6:
            stream.push_text("Hi there")
            await asyncio.sleep(rng.random() * 0.05)
            stream.cancel()
        else:
            stream.end_input()  # an empty turn ends by itself
        await collect(stream, 60)

    await asyncio.wait_for(asyncio.gather(*(turn(i) for i in range(60))), 120)
    for _ in range(200):
        if engine.loop.busy_slots == 0 and engine.loop.waiting_sessions == 0:
            break
        await asyncio.sleep(0.01)
    assert engine.loop.busy_slots == 0 and engine.loop.waiting_sessions == 0
    assert {t for t in asyncio.all_tasks()} - before <= {asyncio.current_task()}


async def test_a_sessions_queued_turns_hold_one_slot_and_empty_turns_take_none(engine):
    group = object()
    turns = [engine.stream(group=group) for _ in range(4)]
    for t in turns:
        t.push_text("Hello there, friend.")
        t.end_input()
    await asyncio.sleep(0.05)
    assert engine.loop.busy_slots + engine.loop.waiting_sessions <= 1
    results = [await collect(t, 60) for t in turns]
    assert all(any(isinstance(i, AudioChunk) for i in r) for r in results)
    empty = engine.stream(group=group)
    empty.end_input()
    assert await collect(empty, 5) == []


async def _whole_turn(engine, text: str) -> list:
    stream = engine.stream()
    stream.push_text(text)
    stream.end_input()  # before the slot opens: the whole turn is known
    return await collect(stream)


def _slots_opened(engine) -> list:
    opened = []
    real_open = engine.loop.open

    def counting_open(*args, **kwargs):
        opened.append(kwargs.get("seed"))
        return real_open(*args, **kwargs)

    engine.loop.open = counting_open
    return opened


@pytest.mark.parametrize("cache_seeded", [False, True])
async def test_a_seeded_engine_bypasses_the_phrase_cache_unless_asked(engine, cache_seeded):
    from myna.engines.phrase_cache import PhraseCache

    cache = PhraseCache(10_000_000)
    engine.use_phrase_cache(cache)
    engine.cache_seeded = cache_seeded
    opened = _slots_opened(engine)
    try:
        first = await _whole_turn(engine, "Sure, one moment.")
        again = await _whole_turn(engine, "Sure, one moment.)")
    finally:
        del engine.loop.open
        engine.use_phrase_cache(None)
        engine.cache_seeded = False
    assert engine.seed is not None
    if not cache_seeded:  # the model spoke both turns; nothing was stored or looked up
        assert len(opened) == 2 and len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)
        return
    assert len(opened) == 1 and cache.hits == 1  # the second turn took no slot
    pcm = lambda items: np.concatenate([i.pcm for i in items if isinstance(i, AudioChunk)])
    words = lambda items: [(w.word, w.start_ms) for w in items if isinstance(w, WordEvent)]
    assert np.array_equal(pcm(first), pcm(again))
    assert [s for _, s in words(first)] == [s for _, s in words(again)]
    assert [w for w, _ in words(again)] == ["Sure", "one", "moment"]  # captions: this turn's own words


async def test_a_turn_still_streaming_when_it_starts_is_not_cached(engine):
    from myna.engines.phrase_cache import PhraseCache

    cache = PhraseCache(10_000_000)
    engine.use_phrase_cache(cache)
    engine.cache_seeded = True
    try:
        stream = engine.stream()
        stream.push_text("Sure, one")
        await asyncio.sleep(0.05)  # the slot opens while the text goes on
        stream.push_text(" moment.")
        stream.end_input()
        assert any(isinstance(i, AudioChunk) for i in await collect(stream))
        long = await _whole_turn(engine, "one two three four five six seven eight nine ten eleven twelve thirteen.")
        assert any(isinstance(i, AudioChunk) for i in long)
    finally:
        engine.use_phrase_cache(None)
        engine.cache_seeded = False
    assert len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)
