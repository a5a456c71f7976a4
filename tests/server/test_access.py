"""Tokens, limits and readiness of a worker in this process (tone engine, loopback only)."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
import sys

import aiohttp
import jwt
import pytest
from livekit.api import AccessToken, VideoGrants

from inprocess import ToneEngine
from myna.bench.soak import serve_in_process
from myna.rtc.client import MynaClient
from myna.events import MAX_MESSAGE_BYTES
from myna.server.app import Worker
from myna.server.auth import Authenticator, mint_token
from myna.limits import Limits


KEY, SECRET = "myna-test-key", "a-test-secret-that-is-long-enough-for-hs256"
HOUR = datetime.timedelta(hours=1)


def worker(**limits) -> Worker:
    return Worker(engines={"tone": ToneEngine(), "tone2": ToneEngine("tone2")}, limits=Limits.off() if not limits else
                  Limits(**{"max_sessions_per_client": None, "offer_rate": None, "message_rate": None, **limits}))


def ws_url(url: str, token: str | None = None) -> str:
    return url.replace("http", "ws", 1) + "/v1/tts/stream" + (f"?access_token={token}" if token else "")


async def post_offer(http, url, body: dict, token: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(f"{url}/api/offer", json=body, headers=headers) as resp:
        return resp.status, await resp.json(), resp.headers


async def events_until(ws, kind: str, turn_id: str | None = None, timeout: float = 20) -> list[dict]:
    out = []
    async with asyncio.timeout(timeout):
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                event = json.loads(msg.data)
                out.append(event)
                if event["type"] == kind and turn_id in (None, event.get("turn_id")):
                    return out
    raise AssertionError(f"connection ended before {kind}: {out}")


async def speak_ws(ws, turn_id: str, text: str) -> list[dict]:
    await ws.send_json({"type": "text", "turn_id": turn_id, "text": text})
    await ws.send_json({"type": "end_turn", "turn_id": turn_id})
    return await events_until(ws, "turn_done", turn_id)


# -- tokens ----------------------------------------------------------------------------------
@pytest.mark.network
async def test_tokens_over_http_missing_bad_expired_wrong_grant_and_good():
    w = worker()
    w.auth = Authenticator(KEY, SECRET)
    good = mint_token(KEY, SECRET, "alice", HOUR)
    forged = mint_token(KEY, "another-secret-of-the-same-length-as-the-key!", "alice", HOUR)
    expired = mint_token(KEY, SECRET, "alice", -datetime.timedelta(minutes=10))
    room_token = AccessToken(KEY, SECRET).with_identity("alice").with_grants(VideoGrants(room_join=True, room="r")).to_jwt()
    piper_only = mint_token(KEY, SECRET, "alice", HOUR, engines=["tone2"])
    body = {"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer", "request_data": {"engine": "tone"}}
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        cases = {None: (401, "token_required"), "not.a.jwt": (401, "bad_token"), forged: (401, "bad_token"),
                 expired: (401, "token_expired"), room_token: (403, "forbidden"), piper_only: (403, "forbidden")}
        for token, (status, code) in cases.items():
            got_status, got, _ = await post_offer(http, url, body, token)
            assert (got_status, got["error"]["code"]) == (status, code), (token, got)
        async with http.patch(f"{url}/api/offer", json={"pc_id": "x", "candidates": []}) as resp:
            assert resp.status == 401 and (await resp.json())["error"]["code"] == "token_required"
        async with MynaClient(url, engine="tone", token=good) as client:  # the good token speaks
            result = await client.speak("hello there", tokens_per_s=None)
        assert result.event_types()[-1] == "turn_done" and result.perceived_ttfa_ms is not None
        assert not w.webrtc.peers or all(p.owner == "identity:alice" for p in w.webrtc.peers.values())


@pytest.mark.network
async def test_tokens_over_the_websocket_header_and_query():
    w = worker()
    w.auth = Authenticator(KEY, SECRET)
    good = mint_token(KEY, SECRET, "bob", HOUR)
    expired = mint_token(KEY, SECRET, "bob", -datetime.timedelta(minutes=10))
    tone2_only = mint_token(KEY, SECRET, "bob", HOUR, engines=["tone2"])
    forged = mint_token(KEY, "another-secret-of-the-same-length-as-the-key!", "bob", HOUR)
    room_token = AccessToken(KEY, SECRET).with_identity("bob").with_grants(VideoGrants(room_join=True, room="r")).to_jwt()
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        for token, status in ((None, 401), ("garbage", 401), (forged, 401), (expired, 401), (room_token, 403)):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(ws_url(url, token))
            assert refused.value.status == status
        async with http.ws_connect(ws_url(url), headers={"Authorization": f"Bearer {good}"}) as ws:
            assert (await ws.receive_json())["type"] == "ready"
            assert [e["type"] for e in await speak_ws(ws, "a", "one two")][-1] == "turn_done"
        async with http.ws_connect(ws_url(url, tone2_only)) as ws:  # ?access_token=, restricted to tone2
            assert (await ws.receive_json())["type"] == "ready"
            await ws.send_json({"type": "text", "turn_id": "a", "text": "hi"})  # the default engine: not allowed
            assert (await ws.receive_json())["code"] == "forbidden"
            await ws.send_json({"type": "config", "engine": "tone"})
            assert (await ws.receive_json())["code"] == "forbidden"
            await ws.send_json({"type": "config", "engine": "tone2"})
            assert (await ws.receive_json())["engine"] == "tone2"
            assert [e["type"] for e in await speak_ws(ws, "b", "one two")][-1] == "turn_done"


# -- limits ----------------------------------------------------------------------------------
def test_the_default_capacity_is_conversations_at_the_latency_bound_not_streams_of_throughput():
    from myna.limits import BOUND_UTILISATION, SPEECH_SHARE, conversations_at_bound

    # 20 real-time streams flat out (the bundled voice on two threads here): the bound held while
    # the threads were busy BOUND_UTILISATION of the time, and a conversation speaks SPEECH_SHARE.
    assert conversations_at_bound(16.5, 0.825) == int(BOUND_UTILISATION * 20 / SPEECH_SHARE)
    assert conversations_at_bound(16.5, 0.825, utilisation=0.5, speech_share=0.5) == 20
    assert conversations_at_bound(16.5, 1.65, utilisation=0.5, speech_share=0.5) == 10  # a host half as fast
    assert conversations_at_bound(0.1, 10.0) == 1  # never below one


async def test_capacity_is_measured_with_every_synthesis_thread_busy():
    from myna.engines.piper import PiperEngine
    from myna.limits import measure_capacity

    engine = PiperEngine(workers=2)
    streams: list[int] = []
    tone = ToneEngine()
    engine.stream = lambda voice=None, group=None: streams.append(1) or tone.stream()
    assert await measure_capacity(engine) >= 1
    assert len(streams) == 4  # two per thread
    engine.scheduler.shutdown()


@pytest.mark.network
async def test_the_session_past_the_cap_gets_503_and_the_others_keep_speaking():
    w = worker(max_sessions=2)
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        first, second = await http.ws_connect(ws_url(url)), await http.ws_connect(ws_url(url))
        for ws in (first, second):
            assert (await ws.receive_json())["type"] == "ready"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url(url))
        assert refused.value.status == 503 and int(refused.value.headers["Retry-After"]) >= 1
        for turn_id, ws in (("a", first), ("b", second)):
            assert [e["type"] for e in await speak_ws(ws, turn_id, "we keep speaking")][-1] == "turn_done"
            await ws.close()


@pytest.mark.network
async def test_full_worker_refuses_offers_with_503_retry_after_and_readiness_says_full():
    w = worker(max_sessions=1)
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        async with http.get(f"{url}/healthz") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ready"
        async with MynaClient(url) as speaking:
            with pytest.raises(RuntimeError, match="503"):
                await MynaClient(url).connect()
            async with http.get(f"{url}/healthz") as resp:
                body = await resp.json()
                assert resp.status == 503 and body["status"] == "full" and resp.headers["Retry-After"]
            async with http.get(f"{url}/livez") as resp:
                assert resp.status == 200
            result = await speaking.speak("still speaking after the refusal", tokens_per_s=None)
            assert result.event_types()[-1] == "turn_done" and "error" not in result.event_types()
        for _ in range(100):  # the slot comes back once the peer is closed
            if not w.webrtc.peers:
                break
            await asyncio.sleep(0.05)
        async with http.get(f"{url}/healthz") as resp:
            assert resp.status == 200
        metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'myna_limit{name="max_sessions"} 1.0' in metrics and 'myna_errors_total{code="full"} 1.0' in metrics


@pytest.mark.network
async def test_per_identity_cap_and_offer_rate_get_429_with_retry_after():
    w = worker(max_sessions_per_client=3, offer_rate=0.01, offer_burst=3)
    w.auth = Authenticator(KEY, SECRET)
    one_session = mint_token(KEY, SECRET, "carol", HOUR, max_sessions=1)
    other = mint_token(KEY, SECRET, "dave", HOUR)
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        ws = await http.ws_connect(ws_url(url, one_session))
        assert (await ws.receive_json())["type"] == "ready"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:  # carol's token allows one session
            await http.ws_connect(ws_url(url, one_session))
        assert refused.value.status == 429 and int(refused.value.headers["Retry-After"]) >= 1
        for _ in range(3):  # dave: three offers in the burst, then the rate
            async with (await http.ws_connect(ws_url(url, other))) as dave:
                assert (await dave.receive_json())["type"] == "ready"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(ws_url(url, other))
        assert refused.value.status == 429 and int(refused.value.headers["Retry-After"]) >= 50
        assert [e["type"] for e in await speak_ws(ws, "a", "carol still speaks")][-1] == "turn_done"
        await ws.close()


@pytest.mark.network
async def test_turn_text_cap_speaks_nothing_past_it_and_the_session_lives():
    w = worker(max_turn_chars=20)
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http, http.ws_connect(ws_url(url)) as ws:
        await ws.receive_json()
        await ws.send_json({"type": "text", "turn_id": "a", "text": "one two three "})  # 14 characters
        await ws.send_json({"type": "text", "turn_id": "a", "text": "four five six "})  # 28: over the cap
        events = await events_until(ws, "turn_done", "a")
        assert {"type": "error", "code": "turn_too_long", "turn_id": "a"}.items() <= next(
            e for e in events if e["type"] == "error").items()
        assert [e["word"] for e in events if e["type"] == "word"] == ["one", "two", "three"]
        assert events[-1]["audio_ms"] == pytest.approx(3 * 120, abs=1)
        more = await speak_ws(ws, "b", "seven")
        assert [e["word"] for e in more if e["type"] == "word"] == ["seven"]


@pytest.mark.network
async def test_queued_turn_cap_and_message_rate_cap():
    w = worker(max_queued_turns=2, message_rate=20.0, message_burst=6)
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http, http.ws_connect(ws_url(url)) as ws:
        await ws.receive_json()
        t0 = asyncio.get_running_loop().time()
        for turn_id in "abc":  # three turns, none ended: the third is one too many
            await ws.send_json({"type": "text", "turn_id": turn_id, "text": "word "})
        for _ in range(10):  # 3 + 10 messages against a burst of 6: read more slowly, none dropped
            await ws.send_json({"type": "bad"})
        codes = []
        while len(codes) < 11:
            codes += [e.get("code") for e in await events_until(ws, "error") if e["type"] == "error"]
        assert codes == ["too_many_turns"] + ["unknown_type"] * 10
        assert asyncio.get_running_loop().time() - t0 >= (13 - 6) / 20 - 0.05
        metrics = await (await http.get(f"{url}/metrics")).text()
        assert 'myna_limit{name="max_queued_turns"} 2.0' in metrics
        assert 'myna_errors_total{code="rate_limited"}' not in metrics


# -- outgoing size ---------------------------------------------------------------------------
@pytest.mark.network
async def test_errors_echo_at_most_a_little_of_the_input_and_nothing_over_16_kib():
    w = worker()
    huge = {"type": "😀" * 4000}  # 16 000 bytes of UTF-8: accepted size, unknown type
    async with serve_in_process(w) as url, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(url)) as ws:
            await ws.receive_json()
            await ws.send_str(json.dumps({"type": "config", "engine": "x" * 15_000}))
            await ws.send_str(json.dumps(huge, ensure_ascii=False))
            await ws.send_str(json.dumps({"type": "end", "turn_id": "t" * 15_000}))
            for code in ("unknown_engine", "unknown_type", "unknown_type"):
                msg = await ws.receive()
                assert len(msg.data.encode()) < 1024 and json.loads(msg.data)["code"] == code
        status, body, _ = await post_offer(http, url, {"sdp": "x", "type": "offer",
                                                       "request_data": {"engine": "😀" * 20_000}})
        assert status == 400 and len(json.dumps(body)) < 1024
        async with MynaClient(url) as client:
            client.send(json.dumps(huge, ensure_ascii=False))
            event = await asyncio.wait_for(client._next_event("error"), 10)
            assert event["code"] == "unknown_type" and len(json.dumps(event)) < 1024
    assert MAX_MESSAGE_BYTES == 16 * 1024


# -- the command line ------------------------------------------------------------------------
def test_myna_token_mints_what_the_worker_verifies_and_serve_refuses_an_open_public_address():
    env_keys = {"MYNA_API_KEY": KEY, "MYNA_API_SECRET": SECRET}
    out = subprocess.run([sys.executable, "-m", "myna.cli", "token", "--identity", "erin", "--ttl", "90m",
                          "--engines", "tone2", "--max-sessions", "2"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **env_keys})
    assert out.returncode == 0, out.stderr
    grant = Authenticator(KEY, SECRET).verify(out.stdout.strip())
    assert (grant.identity, grant.engines, grant.max_sessions) == ("erin", frozenset({"tone2"}), 2)
    claims = jwt.decode(out.stdout.strip(), options={"verify_signature": False})
    assert claims["exp"] - claims["nbf"] == 90 * 60

    refused = subprocess.run([sys.executable, "-m", "myna.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--insecure" in refused.stderr


async def test_the_room_lane_needs_a_token_like_an_offer(tmp_path, monkeypatch):
    """``POST /api/room`` opens a LiveKit room with Myna in it: a worker with keys opens one only
    for a token holder (401 without, 403 without the engine), before any room is opened."""
    from aiohttp.test_utils import TestClient, TestServer

    from myna.server.app import create_app
    from myna.server.room_lane import add_room_lane

    bundle = tmp_path / "livekit-client.mjs"
    bundle.write_text("export {};")
    monkeypatch.setenv("MYNA_LIVEKIT_CLIENT", str(bundle))
    monkeypatch.setenv("LIVEKIT_API_KEY", "lk-key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "lk-secret-that-is-long-enough-for-hs256-x")
    w = Worker(engines={"tone": ToneEngine(), "tone2": ToneEngine("tone2")}, limits=Limits.off(),
               auth=Authenticator(KEY, SECRET))
    app = create_app(w)
    add_room_lane(app, w, "ws://127.0.0.1:9")  # nothing listens: a room is never reached here
    async with TestClient(TestServer(app)) as http:
        await w.loading
        resp = await http.post("/api/room")
        assert resp.status == 401 and (await resp.json())["error"]["code"] == "token_required"
        only_tone2 = mint_token(KEY, SECRET, "ann", ttl=HOUR, engines=["tone2"])
        resp = await http.post("/api/room", headers={"Authorization": f"Bearer {only_tone2}"})
        assert resp.status == 403 and (await resp.json())["error"]["code"] == "forbidden"
        good = mint_token(KEY, SECRET, "ann", ttl=HOUR)
        resp = await http.post("/api/room", headers={"Authorization": f"Bearer {good}"})
        assert resp.status == 502  # past the checks: the LiveKit server is unreachable
