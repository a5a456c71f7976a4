"""A fast LLM loses no words: a 1,000-token burst over the WebSocket and the
data channel, against the session's worker (embedded voice, ``myna serve``'s message rate of 200/s,
burst 400), is spoken word for word and its turn ends; a flood is slowed, not cut."""

from __future__ import annotations

import asyncio
import json
import re
import time

import aiohttp
import pytest

from inprocess import ToneEngine
from myna.bench.soak import serve_in_process
from myna.limits import Limits
from myna.rtc.client import MynaClient
from myna.server.app import Worker

pytestmark = pytest.mark.network

SENTENCE = ("Your order of three blue shirts ships on Friday from our warehouse in Leeds, and it should "
            "arrive by Tuesday next week. ")
TEXT = SENTENCE * 9  # 198 words
WORDS = re.findall(r"[A-Za-z]+", TEXT)


def tokens_of(text: str, n: int) -> list[str]:
    """``text`` cut into ``n`` LLM-token-like pieces (words split anywhere)."""
    size = len(text) / n
    cuts = [round(i * size) for i in range(n + 1)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:])]


def ws_url(worker) -> str:
    return worker.url.replace("http", "ws") + "/v1/tts/stream"


@pytest.mark.slow
async def test_a_1000_token_burst_over_the_websocket_is_spoken_word_for_word(worker):
    assert len(WORDS) == 198
    tokens = tokens_of(TEXT, 1000)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(worker)) as ws:
        assert (await ws.receive_json())["type"] == "ready"
        t0 = time.monotonic()
        for token in tokens:  # as fast as the socket takes them (a few ms on loopback)
            await ws.send_str(json.dumps({"type": "text", "turn_id": "burst", "text": token}))
        await ws.send_str(json.dumps({"type": "end_turn", "turn_id": "burst"}))
        sent_s = time.monotonic() - t0
        events = []
        async with asyncio.timeout(120):
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    events.append(json.loads(msg.data))
                    if events[-1]["type"] == "turn_done":
                        break
        done_s = time.monotonic() - t0
    errors = [e for e in events if e["type"] == "error"]
    assert not errors, errors
    spoken = [w for e in events if e["type"] == "word" for w in re.findall(r"[A-Za-z]+", e["word"])]
    assert spoken == WORDS
    print(f"1,000-token burst over the WebSocket: sent in {sent_s * 1000:.0f} ms, {len(spoken)}/{len(WORDS)} "
          f"words spoken, turn_done after {done_s:.1f} s ({events[-1]['audio_ms'] / 1000:.1f} s of audio)")


async def test_a_1000_chunk_burst_over_the_data_channel_is_spoken_word_for_word():
    # The data channel's audio is paced in real time: a tone engine of 20 ms words keeps this short,
    # with ``myna serve``'s message limits (200/s, burst 400).
    w = Worker(engines={"tone": ToneEngine(word_ms=20.0)}, limits=Limits(max_sessions_per_client=None, offer_rate=None))
    assert (w.limits.message_rate, w.limits.message_burst) == (200.0, 400)
    async with serve_in_process(w) as url, MynaClient(url) as client:
        t0 = time.monotonic()
        for token in tokens_of(TEXT, 1000):  # one turn: accepted at its first chunk, so none is dropped
            client.channel.send(json.dumps({"type": "text", "turn_id": "burst", "text": token}))
        client.channel.send(json.dumps({"type": "end_turn", "turn_id": "burst"}))
        events = []
        async with asyncio.timeout(60):
            while not (events and events[-1]["type"] == "turn_done"):
                events.append(await client._next_event())
        done_s = time.monotonic() - t0
    assert not [e for e in events if e["type"] == "error"], events
    spoken = [w for e in events if e["type"] == "word" for w in re.findall(r"[A-Za-z]+", e["word"])]
    assert spoken == WORDS
    print(f"1,000-chunk burst over the data channel: {len(spoken)}/{len(WORDS)} words, turn_done after {done_s:.1f} s")


async def test_over_the_rate_the_websocket_slows_its_reading_and_drops_nothing():
    """Messages that begin nothing of the open turn (here: bad ones, each answered) are held
    back to the rate, none dropped; the open turn's text is never held back."""
    w = Worker(engines={"tone": ToneEngine(word_ms=5.0)}, limits=Limits(max_sessions_per_client=None, offer_rate=None,
                                                                       message_rate=50.0, message_burst=10))
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
            await ws.receive_json()
            t0 = time.monotonic()
            for i in range(60):  # 60 messages against a burst of 10 at 50/s: about 1 s of back-pressure
                await ws.send_str(json.dumps({"type": "bad", "n": i}))
            for i in range(60):  # then one turn of 60 chunks: straight in once it has begun
                await ws.send_str(json.dumps({"type": "text", "turn_id": "t", "text": f"w{i} "}))
            await ws.send_str(json.dumps({"type": "end_turn", "turn_id": "t"}))
            events = []
            async with asyncio.timeout(30):
                while not (events and events[-1]["type"] == "turn_done"):
                    msg = await ws.receive()
                    if msg.type == aiohttp.WSMsgType.TEXT:
                        events.append(json.loads(msg.data))
            elapsed = time.monotonic() - t0
    errors = [e["code"] for e in events if e["type"] == "error"]
    assert errors == ["unknown_type"] * 60  # every one answered, none dropped, no rate_limited
    assert [e["word"] for e in events if e["type"] == "word"] == [f"w{i}" for i in range(60)]
    assert elapsed >= (61 - 10) / 50 - 0.05  # the worker read no faster than its rate
