"""``GET /v1/tts/stream`` against a running ``myna serve`` on loopback.

Runs in the loopback-only namespace (``unshare -n``; see ``scripts/test.sh``).
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import aiohttp
import numpy as np
import pytest

from myna.audio.onset import first_audible_sample
pytestmark = pytest.mark.network

SENTENCE = "The weather today is sunny, with a light breeze from the west."


@pytest.fixture(scope="module")
def server(worker):
    """The session's worker (tests/conftest.py), shared with the end-to-end tests."""
    return worker


def ws_url(server) -> str:
    return server.url.replace("http", "ws") + "/v1/tts/stream"


async def receive_json(ws) -> dict:
    msg = await asyncio.wait_for(ws.receive(), 30)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return json.loads(msg.data)


async def connect(session, server, **config):
    ws = await session.ws_connect(ws_url(server))
    ready = await receive_json(ws)
    assert ready["type"] == "ready" and "piper" in ready["engines"] and ready["sample_rate"] == 22050
    if config:
        await ws.send_json({"type": "config", **config})
        ready = await receive_json(ws)
        assert ready["type"] == "ready", ready
    return ws, ready


async def collect(ws, until_turn: str, timeout: float = 60.0) -> list:
    """Messages up to and including ``turn_done`` of ``until_turn``: dicts and bytes in order."""
    out = []
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                out.append(msg.data)
            elif msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                out.append(event)
                if event["type"] == "turn_done" and event["turn_id"] == until_turn:
                    return out
            else:
                raise AssertionError(f"connection ended: {msg}")


async def speak(ws, turn_id: str, text: str) -> None:
    for token in re.findall(r"\S+\s*", text):  # LLM-like chunks
        await ws.send_json({"type": "text", "turn_id": turn_id, "text": token})
    await ws.send_json({"type": "end_turn", "turn_id": turn_id})


def metric(server, name: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_turns_stream_pcm_at_the_configured_rate_in_order(server):
    async with aiohttp.ClientSession() as session:
        ws, ready = await connect(session, server, sample_rate=16000)
        assert ready["sample_rate"] == 16000 and ready["engine"] == "piper"
        # Two turns back to back: the second is queued behind the first.
        await speak(ws, "a", SENTENCE)
        await speak(ws, "b", "Thank you for calling.")
        messages = await collect(ws, "b")
        await ws.close()
    events = [m for m in messages if isinstance(m, dict)]
    kinds = [(e["type"], e.get("turn_id")) for e in events]
    assert kinds[0] == ("turn_started", "a") and kinds.count(("turn_done", "a")) == 1
    assert kinds.index(("turn_done", "a")) < kinds.index(("turn_started", "b")), kinds
    for turn_id, text in (("a", SENTENCE), ("b", "Thank you for calling.")):
        start = messages.index({"type": "turn_started", "turn_id": turn_id})
        done = next(i for i, m in enumerate(messages) if isinstance(m, dict) and m["type"] == "turn_done" and m["turn_id"] == turn_id)
        turn = messages[start : done + 1]
        pcm = np.frombuffer(b"".join(m for m in turn if isinstance(m, bytes)), dtype="<i2")
        assert turn[-1]["audio_ms"] == pytest.approx(1000 * len(pcm) / 16000, abs=0.1)
        gaps = turn[-1]["gap_ms"]  # timed for a real-time consumer; Piper never cuts a word
        assert turn[-1]["underruns"] == 0 and gaps["count"] == len(turn[-1]["gaps"]) and gaps["total"] >= 0
        assert len(pcm) > 16000 * 0.8 and first_audible_sample(pcm, 16000) is not None
        first_audio = next(i for i, m in enumerate(turn) if isinstance(m, dict) and m["type"] == "first_audio")
        assert isinstance(turn[first_audio + 1], bytes)  # first_audio goes right before its audio
        assert not any(isinstance(m, bytes) for m in turn[:first_audio])
        words = [m["word"].lower() for m in turn if isinstance(m, dict) and m["type"] == "word"]
        assert words == re.sub(r"[^a-z ]", "", text.lower()).split()


async def test_interrupt_stops_audio_at_once_then_the_next_turn_plays(server):
    long_text = " ".join([SENTENCE] * 6)
    async with aiohttp.ClientSession() as session:
        ws, _ = await connect(session, server)
        await speak(ws, "long", long_text)
        # Wait for the first audio, then barge in.
        while True:
            msg = await asyncio.wait_for(ws.receive(), 30)
            if msg.type == aiohttp.WSMsgType.BINARY:
                break
        await ws.send_json({"type": "interrupt"})
        after = await collect(ws, "long", timeout=10)
        done = after[-1]
        assert done["interrupted"] is True
        await speak(ws, "next", "Okay.")
        messages = await collect(ws, "next")
        assert messages[0] == {"type": "turn_started", "turn_id": "next"}, messages[:3]
        assert messages[-1]["audio_ms"] > 200
        await ws.close()


async def test_disconnect_mid_turn_cleans_up_and_the_server_keeps_serving(server):
    before = metric(server, "myna_active_sessions")
    async with aiohttp.ClientSession() as session:
        ws, _ = await connect(session, server)
        await speak(ws, "gone", " ".join([SENTENCE] * 6))
        while (await asyncio.wait_for(ws.receive(), 30)).type != aiohttp.WSMsgType.BINARY:
            pass
        await ws.close()
        for _ in range(50):
            if metric(server, "myna_active_sessions") <= before:
                break
            await asyncio.sleep(0.1)
        assert metric(server, "myna_active_sessions") <= before
        ws, _ = await connect(session, server)
        await speak(ws, "again", "Hello again.")
        assert (await collect(ws, "again"))[-1]["type"] == "turn_done"
        await ws.close()
    with urllib.request.urlopen(f"{server.url}/healthz", timeout=5) as r:
        assert r.status == 200


async def test_config_speed_is_the_session_default_and_a_turn_may_ask_for_another(server):
    """``config.speed`` paces every turn; a turn's ``speed`` wins; a bad one is an error."""
    async with aiohttp.ClientSession() as session:
        ws, _ = await connect(session, server, speed=1.5)
        await ws.send_json({"type": "config", "speed": 9})
        assert (await receive_json(ws))["code"] == "bad_speed"  # the settings stay
        text = "Your table for four is booked for Friday evening."
        await ws.send_json({"type": "text", "turn_id": "fast", "text": text})
        await ws.send_json({"type": "end_turn", "turn_id": "fast"})
        await ws.send_json({"type": "text", "turn_id": "own", "text": text, "speed": 1.0})
        await ws.send_json({"type": "end_turn", "turn_id": "own"})
        messages = await collect(ws, "own")
        await ws.close()
    done = {m["turn_id"]: m["audio_ms"] for m in messages if isinstance(m, dict) and m["type"] == "turn_done"}
    assert 0.6 <= done["fast"] / done["own"] <= 0.72, done


async def test_config_normalise_is_taken_and_a_bad_value_refused(server):
    """``config.normalise`` is a boolean (false: words reach the engine as written;
    its effect on a session is tests/test_turn_options.py's); anything else is ``bad_config``
    and the settings stay."""
    async with aiohttp.ClientSession() as session:
        ws, _ = await connect(session, server, normalise=False)
        await ws.send_json({"type": "config", "normalise": "off"})
        error = await receive_json(ws)
        assert error["type"] == "error" and error["code"] == "bad_config" and "normalise" in error["message"]
        await ws.send_json({"type": "text", "turn_id": "t", "text": "Call 555-0199 now."})
        await ws.send_json({"type": "end_turn", "turn_id": "t"})
        messages = await collect(ws, "t")
        await ws.close()
    assert [m["word"] for m in messages if isinstance(m, dict) and m["type"] == "word"] == ["Call", "555-0199", "now"]
