"""Text as an LLM writes it (docs/text.md), over the wire: the WebSocket (``/v1/tts/stream``) and the WebRTC data channel,
against the session's worker on loopback (run in the loopback-only namespace)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest

from myna.audio.onset import first_audible_sample
from myna.rtc.client import MynaClient

pytestmark = pytest.mark.network

RATE = 22_050  # the WebSocket's default rate for Piper
TOKENS = ["Let", " me", " check", " that", " for", " you."]


def ws_url(worker) -> str:
    return worker.url.replace("http", "ws") + "/v1/tts/stream"


async def next_message(ws, timeout: float = 30.0):
    msg = await asyncio.wait_for(ws.receive(), timeout)
    if msg.type == aiohttp.WSMsgType.BINARY:
        return msg.data
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return json.loads(msg.data)


async def until(ws, predicate, timeout: float = 30.0) -> list:
    """Messages (dicts and bytes) up to and including the first that ``predicate`` accepts."""
    out = []
    async with asyncio.timeout(timeout):
        while True:
            out.append(await next_message(ws))
            if predicate(out[-1]):
                return out


def done(turn_id):
    return lambda m: isinstance(m, dict) and m["type"] == "turn_done" and m["turn_id"] == turn_id


def pcm_of(messages) -> np.ndarray:
    return np.frombuffer(b"".join(m for m in messages if isinstance(m, bytes)), dtype="<i2")


def words_of(messages) -> list[str]:
    return [m["word"] for m in messages if isinstance(m, dict) and m["type"] == "word"]


async def connect(http, worker):
    ws = await http.ws_connect(ws_url(worker))
    ready = await next_message(ws)
    assert ready["type"] == "ready" and ready["scripts"] == ["Latin"]
    return ws


@pytest.mark.slow
async def test_ws_a_finished_sentence_is_spoken_without_the_next_token(worker):
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, worker)
        for token in TOKENS:
            await ws.send_json({"type": "text", "turn_id": "t1", "text": token})
        # Nothing more is sent: the whole sentence is heard anyway, its last word included.
        got = await until(ws, lambda m: isinstance(m, dict) and m.get("word") == "you", timeout=20)
        assert words_of(got) == ["Let", "me", "check", "that", "for", "you"]
        assert first_audible_sample(pcm_of(got), RATE) is not None
        await ws.send_json({"type": "end_turn", "turn_id": "t1"})
        rest = await until(ws, done("t1"))
        assert not [m for m in rest if isinstance(m, dict) and m["type"] == "error"]
        await ws.close()


async def test_ws_two_sentences_a_second_apart_are_two_sentences(worker):
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, worker)
        await ws.send_json({"type": "text", "turn_id": "t2", "text": "Let me check that for you."})
        await asyncio.sleep(1.0)
        await ws.send_json({"type": "text", "turn_id": "t2", "text": "Your order ships on Friday."})
        await ws.send_json({"type": "end_turn", "turn_id": "t2"})
        got = await until(ws, done("t2"))
        assert words_of(got) == ["Let", "me", "check", "that", "for", "you", "Your", "order", "ships", "on", "Friday"]
        await ws.close()


@pytest.mark.parametrize("text", ["👍", "...", ":)", "**", "🎉🎉", "<break time='1s'/>", "— !!"])
async def test_ws_a_reply_with_nothing_to_say_ends_cleanly_and_the_next_is_spoken(worker, text):
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, worker)
        await ws.send_json({"type": "text", "turn_id": "empty", "text": text})
        await ws.send_json({"type": "end_turn", "turn_id": "empty"})
        got = await until(ws, done("empty"))
        assert [m["type"] for m in got if isinstance(m, dict)] == ["turn_started", "turn_done"]
        assert got[-1]["audio_ms"] == 0
        await ws.send_json({"type": "text", "turn_id": "next", "text": "Thanks for waiting."})
        await ws.send_json({"type": "end_turn", "turn_id": "next"})
        after = await until(ws, done("next"))
        assert words_of(after) == ["Thanks", "for", "waiting"]
        await ws.close()


async def test_ws_text_in_another_script_is_an_error_and_the_session_lives(worker):
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, worker)
        await ws.send_json({"type": "text", "turn_id": "ru", "text": "Привет"})
        await ws.send_json({"type": "end_turn", "turn_id": "ru"})
        got = await until(ws, done("ru"))
        errors = [m for m in got if isinstance(m, dict) and m["type"] == "error"]
        assert len(errors) == 1 and errors[0]["code"] == "unsupported_language" and errors[0]["turn_id"] == "ru"
        assert "Cyrillic" in errors[0]["message"]
        assert not pcm_of(got).size and got[-1]["audio_ms"] == 0
        await ws.send_json({"type": "text", "turn_id": "mix", "text": "Hello Привет, how are you?"})
        await ws.send_json({"type": "end_turn", "turn_id": "mix"})
        got = await until(ws, done("mix"))
        assert words_of(got) == ["Hello", "how", "are", "you"]
        assert [m["code"] for m in got if isinstance(m, dict) and m["type"] == "error"] == ["unsupported_language"]
        await ws.close()


async def test_ws_a_break_is_silence_and_no_tag_is_spoken(worker):
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, worker)
        for chunk in ["It's fine <bre", 'ak time="0.5s" />', " ok."]:
            await ws.send_json({"type": "text", "turn_id": "b", "text": chunk})
        await ws.send_json({"type": "end_turn", "turn_id": "b"})
        got = await until(ws, done("b"))
        assert words_of(got) == ["It's", "fine", "ok"]
        events = {m["word"]: m["start_ms"] for m in got if isinstance(m, dict) and m["type"] == "word"}
        assert events["ok"] - events["fine"] > 500  # the pause lies between them
        await ws.close()


# -- the data channel (WebRTC) -----------------------------------------------------------------


async def test_data_channel_sentence_without_end_turn_and_an_unsupported_script(worker):
    async with MynaClient(worker.url) as client:
        for token in TOKENS:
            client.send({"type": "text", "turn_id": "dc1", "text": token})
        async with asyncio.timeout(20):  # no end_turn, no more text: every word is heard
            while True:
                event = await client._next_event()
                if event["type"] == "word" and event["word"] == "you":
                    break
        client.send({"type": "end_turn", "turn_id": "dc1"})
        async with asyncio.timeout(30):
            while (await client._next_event())["type"] != "turn_done":
                pass
        client.send({"type": "text", "turn_id": "dc2", "text": "Привет"})
        client.send({"type": "end_turn", "turn_id": "dc2"})
        events = []
        async with asyncio.timeout(30):
            while not events or events[-1]["type"] != "turn_done":
                events.append(await client._next_event())
        assert [e["type"] for e in events] == ["turn_started", "error", "turn_done"]
        assert events[1]["code"] == "unsupported_language" and "Cyrillic" in events[1]["message"]
        after = await client.speak("Still here.", tokens_per_s=None)
        assert "first_audio" in after.event_types()


@pytest.mark.parametrize("text", ["\U0001F44D", "\u2026"], ids=["thumbs-up", "ellipsis"])
async def test_data_channel_a_reply_with_nothing_to_say_ends_with_turn_done_not_an_error(worker, text):
    """As on the WebSocket: a turn with nothing speakable is ``turn_started`` then ``turn_done``
    (``audio_ms`` 0), no ``error``; the session speaks the next turn."""
    async with MynaClient(worker.url) as client:
        client.send({"type": "text", "turn_id": "empty", "text": text})
        client.send({"type": "end_turn", "turn_id": "empty"})
        events = []
        async with asyncio.timeout(30):
            while not events or events[-1]["type"] != "turn_done":
                events.append(await client._next_event())
        assert [e["type"] for e in events] == ["turn_started", "turn_done"]
        assert events[-1]["turn_id"] == "empty" and events[-1]["audio_ms"] == 0
        after = await client.speak("Still here.", tokens_per_s=None)
        assert "first_audio" in after.event_types() and "error" not in after.event_types()


ESCAPED = "&quot;That&#x27;s cool,&quot; Tom &amp; Jerry."


@pytest.mark.parametrize("chunks", [[ESCAPED], [ESCAPED[:3], ESCAPED[3:12], ESCAPED[12:33], ESCAPED[33:]], list(ESCAPED)],
                         ids=["whole", "cut-inside-references", "char-by-char"])
async def test_ws_html_references_are_decoded_before_the_voice(worker, chunks):
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, worker)
        for chunk in chunks:
            await ws.send_json({"type": "text", "turn_id": "e", "text": chunk})
        await ws.send_json({"type": "end_turn", "turn_id": "e"})
        got = await until(ws, done("e"))
        words = words_of(got)
        assert words[:2] == ["That's", "cool"] and "Tom" in words and "Jerry" in words, words
        assert not {"quot", "amp", "x27", "39", "#x27"} & {w.lower() for w in words}, words
        await ws.close()
