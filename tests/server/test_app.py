"""The worker's app refusing bad input, served in this process on loopback with a tone engine
(tests/inprocess.py): no ``myna serve``, no voice to load.

Errors are 4xx JSON ``{"error": {"code", "message"}}`` over HTTP and ``error`` events on the
WebSocket and the data channel, after which the connection or session keeps working
(docs/contract.md).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from aiortc import RTCPeerConnection

from inprocess import ToneEngine, app_client
from myna.bench.soak import serve_in_process
from myna.rtc.client import MynaClient
from myna.server.app import Worker

pytestmark = pytest.mark.network

JSON = {"Content-Type": "application/json"}


async def post_offer(client, body: bytes, headers: dict | None = None) -> tuple[int, dict]:
    async with client.post("/api/offer", data=body, headers=headers or JSON) as resp:
        return resp.status, await resp.json()


async def test_http_errors_are_json_4xx_and_counted():
    cases = [
        (b"not json", 400, "bad_json"),
        (b"[1]", 400, "bad_request"),
        (json.dumps({"type": "offer"}).encode(), 400, "bad_request"),
        (json.dumps({"sdp": "v=0 garbage", "type": "offer"}).encode(), 400, "bad_sdp"),
        (json.dumps({"sdp": "x", "type": "offer", "request_data": {"engine": "nope"}}).encode(), 400, "unknown_engine"),
        (json.dumps({"sdp": "x", "type": "offer", "request_data": {"voice": "nobody"}}).encode(), 400, "unknown_voice"),
    ]
    async with app_client() as client:
        for body, status, code in cases:
            got, answer = await post_offer(client, body)
            assert (got, answer["error"]["code"]) == (status, code), (body, answer)
            assert answer["error"]["message"] and "Traceback" not in answer["error"]["message"]
        async with client.get("/nowhere") as resp:
            assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
        async with client.get("/healthz") as resp:
            health = await resp.json()
            assert resp.status == 200 and health["status"] == "ready" and health["engines"] == ["tone"]
        async with client.get("/metrics") as resp:
            text = await resp.text()
            assert resp.status == 200
    for code, n in (("bad_json", 1), ("bad_request", 2), ("bad_sdp", 1), ("unknown_engine", 1)):
        assert f'myna_errors_total{{code="{code}"}} {n:.1f}' in text, code


async def test_hostile_http_bodies_get_json_400s_not_500s():
    async with app_client() as client:
        assert (await post_offer(client, b"[" * 100_000 + b"]" * 100_000))[0] == 400
        for request_data in ({"engine": ["tone"]}, {"engine": {"a": 1}}, {"voice": 3}):
            status, answer = await post_offer(client, json.dumps({"sdp": "x", "type": "offer", "request_data": request_data}).encode())
            assert status == 400 and answer["error"]["code"] == "bad_request", (request_data, answer)
        for headers, body in (({"Content-Type": "application/json; charset=nonexistent"}, b"{}"),
                              ({"Content-Encoding": "gzip"}, b"notgzip"),
                              ({"Content-Encoding": "deflate"}, b"\x00garbage")):
            # (aiohttp drops the connection after a body it could not decode: one per request)
            status, answer = await post_offer(client, body, {**headers, "Connection": "close"})
            assert status == 400 and "error" in answer, (headers, status)
        status, answer = await post_offer(client, json.dumps({"sdp": "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\n", "type": "offer"}).encode())
        assert status == 400 and "audio m-line" in answer["error"]["message"]


async def receive_json(ws) -> dict:
    msg = await asyncio.wait_for(ws.receive(), 20)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return json.loads(msg.data)


async def test_websocket_bad_input_gets_error_events_and_the_connection_keeps_working():
    async with app_client() as client, client.ws_connect("/v1/tts/stream") as ws:
        assert (await receive_json(ws))["type"] == "ready"
        await ws.send_str("{not json")
        await ws.send_str(json.dumps({"type": "text", "turn_id": "x", "text": "a" * 17_000}))
        await ws.send_bytes(b"\x00\x01" * 100)
        await ws.send_json({"type": "config", "engine": "nope"})
        await ws.send_json({"type": "config", "voice": "nobody"})
        await ws.send_json({"type": "config", "sample_rate": 3})
        await ws.send_json({"type": "config", "engine": ["tone"]})
        await ws.send_json({"type": "config", "voice": {"a": 1}})
        await ws.send_json({"type": "dance"})
        codes = [(await receive_json(ws))["code"] for _ in range(9)]
        assert codes == ["bad_json", "message_too_large", "binary_input", "unknown_engine",
                         "unknown_voice", "bad_config", "bad_config", "bad_config", "unknown_type"]
        await ws.send_json({"type": "text", "turn_id": "ok", "text": "Still here."})
        await ws.send_json({"type": "end_turn", "turn_id": "ok"})
        audio, events = 0, []
        async with asyncio.timeout(20):
            while not events or events[-1]["type"] != "turn_done":
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio += len(msg.data)
                else:
                    events.append(json.loads(msg.data))
        assert [e["type"] for e in events] == ["turn_started", "first_audio", "word", "word", "turn_done"]
        assert audio == 2 * round(24_000 * 0.24)  # two 120 ms tones, s16le at the engine's rate
        await ws.send_json({"type": "config", "sample_rate": 24000})
        assert (await receive_json(ws))["code"] == "config_too_late"


# -- the data channel (a WebRTC session in this process) --------------------------------------
async def test_bad_messages_on_the_channel_get_errors_and_the_session_stays_usable():
    cases = [
        ("{not json", "bad_json"),
        ("[" * 1000 + "]" * 1000, "bad_json"),  # deeply nested
        (json.dumps({"type": "sing", "turn_id": "x"}), "unknown_type"),
        (b"\xff\xfe\x00binary", "bad_encoding"),
        (json.dumps({"type": "text", "turn_id": "big", "text": "a" * 17000}), "message_too_large"),
        (json.dumps([1, 2]), "bad_message"),
        (json.dumps({"type": "text", "turn_id": "x"}), "bad_message"),
        (json.dumps({"type": "text", "text": "hi"}), "bad_message"),
    ]
    async with serve_in_process(Worker(engines={"tone": ToneEngine()})) as url, MynaClient(url) as client:
        for raw, code in cases:
            client.send(raw)
            event = await asyncio.wait_for(client._next_event(), 5)
            assert event["type"] == "error" and event["code"] == code, (raw[:40], event)
            assert event["message"] and "Traceback" not in event["message"]
        result = await client.speak("still working fine", tokens_per_s=None)
        assert "first_audio" in result.event_types()


async def test_a_refused_restart_keeps_the_session_and_a_foreign_offer_cannot_take_a_pc_id():
    async with serve_in_process(Worker(engines={"tone": ToneEngine()})) as url, MynaClient(url) as client, \
            aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/offer", json={"sdp": "garbage", "type": "offer", "pc_id": client.pc_id,
                                                       "restart_pc": True}) as resp:
            assert resp.status == 400
        pc = RTCPeerConnection()
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        async with http.post(f"{url}/api/offer", json={"sdp": pc.localDescription.sdp, "type": "offer",
                                                       "pc_id": client.pc_id}) as resp:
            status, answer = resp.status, await resp.json()
        await pc.close()
        assert status == 409 and answer["error"]["code"] == "pc_id_in_use"
        assert "first_audio" in (await client.speak("still connected", tokens_per_s=None)).event_types()
