"""A session's own lexicon: the WebSocket ``config.lexicon`` (word, regex and IPA
entries) is applied to that session's turns only, heard by Whisper tiny.en on the real worker's
seeded Piper voice; captions keep the written words; a bad lexicon is ``bad_lexicon`` and the
settings stay."""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest
import soxr

from test_tts_stream import collect, connect, receive_json, server, speak  # noqa: F401 (server: a fixture)

pytestmark = pytest.mark.network

LEXICON = [{"word": "Zyntrix", "say": "banana split"},
           {"regex": "kw[a-z]+", "say": "strawberry"},
           {"word": "banana", "ipa": "pətˈeɪɾoʊ"}]
TURNS = {"brand": "Ask Zyntrix today.", "pattern": "Order the Kwzzpt now.", "ipa": "I say banana now."}


def heard(whisper, messages, turn_id: str) -> tuple[str, list[str]]:
    """What Whisper hears of a turn's audio, and its word events."""
    pcm, words, current = [], [], None
    for m in messages:
        if isinstance(m, dict):
            current = m.get("turn_id", current)
            if m["type"] == "word" and m["turn_id"] == turn_id:
                words.append(m["word"])
        elif current == turn_id:
            pcm.append(np.frombuffer(m, dtype="<i2"))
    audio = np.concatenate(pcm).astype(np.float32) / 32768.0
    segments, _ = whisper.transcribe(soxr.resample(audio, 22_050, 16_000), beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments).lower(), words


async def spoken(server, turns: dict[str, str], **config):
    async with aiohttp.ClientSession() as session:
        ws, _ = await connect(session, server, **config)
        for turn_id, text in turns.items():
            await speak(ws, turn_id, text)
        messages = await collect(ws, list(turns)[-1])
        await ws.close()
    return messages


async def test_config_lexicon_is_heard_and_only_in_its_session(server, whisper):
    messages = await spoken(server, TURNS, lexicon=LEXICON)
    brand, brand_words = heard(whisper, messages, "brand")
    assert brand_words == ["Ask", "Zyntrix", "today"] and "banana" in brand, brand
    pattern, pattern_words = heard(whisper, messages, "pattern")
    assert "Kwzzpt" in pattern_words and "straw" in pattern, pattern  # (heard "straw bearing")
    ipa, ipa_words = heard(whisper, messages, "ipa")
    assert ipa_words == ["I", "say", "banana", "now"] and "potato" in ipa and "banana" not in ipa, ipa
    plain = await spoken(server, {"brand": TURNS["brand"]})  # another session: no lexicon
    assert "banana" not in heard(whisper, plain, "brand")[0]


async def test_a_bad_lexicon_is_bad_lexicon_and_the_session_keeps_its_settings(server):
    async with aiohttp.ClientSession() as session:
        ws, _ = await connect(session, server)
        await ws.send_json({"type": "config", "lexicon": [{"regex": "(", "say": "x"}]})
        error = await receive_json(ws)
        assert error["type"] == "error" and error["code"] == "bad_lexicon" and "entry 1" in error["message"]
        await speak(ws, "t", "Still here.")
        messages = await collect(ws, "t")
        await ws.close()
    assert [m["word"] for m in messages if isinstance(m, dict) and m["type"] == "word"] == ["Still", "here"]
