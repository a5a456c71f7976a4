"""Hostile input, fuzzed (hypothesis): the message parser and a session, the offer endpoint, the
WebSocket endpoint. No exception escapes, no session dies, every error is a documented one and
no outgoing message is over 16 KiB.

Bounded: ``MYNA_FUZZ_EXAMPLES`` examples per target (default 150; set it higher for a
longer run).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import urllib.error
import urllib.request

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inprocess import ToneEngine, paced_session
from myna.bench.soak import serve_in_process
from myna.metrics import Metrics
from myna.events import MAX_MESSAGE_BYTES
from myna.server.app import Worker
from myna.limits import Limits

EXAMPLES = int(os.environ.get("MYNA_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)

#: Every error code the contract documents (docs/contract.md); ``internal`` is a bug and never allowed.
SESSION_CODES = {"message_too_large", "bad_encoding", "bad_json", "bad_message", "unknown_type", "turn_ended",
                 "turn_too_long", "too_many_turns", "draining", "rate_limited", "bad_audio", "audio_failed",
                 "engine_failed", "engine_not_ready", "unknown_voice", "unsupported_language", "unit_failed",
                 "bad_speed", "unsupported_speed", "phonemes_ignored", "bad_language", "wrong_language"}
STREAM_CODES = SESSION_CODES | {"binary_input", "config_too_late", "bad_config", "bad_lexicon", "unknown_engine", "forbidden",
                                "slow_consumer"}
HTTP_CODES = {"bad_request", "bad_json", "bad_body", "bad_sdp", "unknown_engine", "unknown_voice", "not_ready",
              "pc_id_in_use", "unknown_pc", "bad_candidate", "token_required", "bad_token", "forbidden", "full",
              "too_many_sessions", "rate_limited", "draining", "request_entity_too_large", "method_not_allowed",
              "unsupported_codec"}
EVENTS = {"ready", "turn_started", "first_audio", "word", "turn_done", "error", "fallback"}

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)
turn_ids = st.sampled_from(["a", "b", "c", 7]) | st.text(max_size=140) | json_values
messages = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "end_turn", "interrupt", "config"]) | st.text(max_size=20)},
                          optional={"turn_id": turn_ids, "text": st.text(max_size=200) | json_values,
                                    "engine": json_values | st.sampled_from(["tone", "tone2"]),
                                    "voice": json_values, "sample_rate": json_values}).map(json.dumps),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.builds(lambda n: json.dumps({"type": "text", "turn_id": "big", "text": "é" * n}), st.integers(8000, 12000)),
)


def check_event(event: dict, codes: set[str]) -> None:
    assert event["type"] in EVENTS, event
    if event["type"] == "error":
        assert event["code"] in codes, event
    assert len(json.dumps(event).encode()) <= MAX_MESSAGE_BYTES


@FUZZ
@given(st.lists(messages, max_size=12))
def test_a_session_survives_any_message_sequence(raws):
    async def run() -> None:
        sent: list[dict] = []
        session = paced_session(ToneEngine(), sent, Metrics(), limits=Limits(max_turn_chars=10_000, max_queued_turns=4))
        for raw in raws:
            session.receive(raw)
            await asyncio.sleep(0)
        session.interrupt()
        session.receive(json.dumps({"type": "text", "turn_id": "after-the-fuzz", "text": "still here"}))
        assert sent[-1] == {"type": "turn_started", "turn_id": "after-the-fuzz"}  # the session lives
        for event in sent:
            check_event(event, SESSION_CODES)
        await session.close()

    asyncio.run(run())


# -- the endpoints: one worker on a background loop for the whole module ----------------------------
class BackgroundWorker:
    def __init__(self):
        self.worker = Worker(engines={"tone": ToneEngine(), "tone2": ToneEngine("tone2")},
                             limits=Limits(max_sessions=64, max_sessions_per_client=None, offer_rate=None,
                                           message_rate=None, max_turn_chars=2000, max_queued_turns=4))
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),), daemon=True)
        self.thread.start()
        assert self.ready.wait(30)

    async def _serve(self):
        self.stop = asyncio.Event()
        async with serve_in_process(self.worker) as url:
            self.url = url
            self.ready.set()
            await self.stop.wait()

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


@pytest.fixture(scope="module")
def server():
    s = BackgroundWorker()
    yield s
    s.close()


def post(url: str, body: bytes, method: str = "POST") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


sdp_lines = st.sampled_from(["v=0", "o=- 1 1 IN IP4 127.0.0.1", "s=-", "t=0 0", "m=audio 9 UDP/TLS/RTP/SAVPF 111",
                             "m=application 9 UDP/DTLS/SCTP webrtc-datachannel", "a=ice-ufrag:abcd",
                             "a=ice-pwd:0123456789012345678901", "a=fingerprint:sha-256 00:11", "a=setup:actpass",
                             "a=mid:0", "a=rtpmap:111 opus/48000/2", "a=max-message-size:1", "a=sctp-port:5000",
                             "c=IN IP4 0.0.0.0", "a=candidate:1 1 udp 1 127.0.0.1 9 typ host"]) | st.text(max_size=60)
sdps = st.lists(sdp_lines, max_size=16).map("\r\n".join) | st.text(max_size=200)
offer_bodies = st.one_of(
    st.fixed_dictionaries({"sdp": sdps, "type": st.sampled_from(["offer", "answer"]) | json_values},
                          optional={"pc_id": json_values | st.just("myna-x"), "restart_pc": json_values,
                                    "request_data": json_values | st.fixed_dictionaries(
                                        {}, optional={"engine": json_values | st.just("tone2"), "voice": json_values}),
                                    "candidates": json_values}).map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=400),
    json_values.map(lambda v: json.dumps(v).encode()),
)


@pytest.mark.network
@FUZZ
@given(offer_bodies, st.sampled_from(["POST", "PATCH"]))
def test_the_offer_endpoint_answers_any_body_with_a_documented_status(server, body, method):
    status, answer = post(f"{server.url}/api/offer", body, method)
    if status == 200:
        assert ("sdp" in answer and "pc_id" in answer) or answer == {"status": "success"}
    else:
        assert status in (400, 404, 409, 413, 415, 503), (status, answer)  # (docs/contract.md: "HTTP errors")
        assert answer["error"]["code"] in HTTP_CODES, answer
    assert server.worker.metrics.registry.get_sample_value("myna_errors_total", {"code": "internal"}) is None


@pytest.mark.network
@FUZZ
@given(st.lists(messages, min_size=1, max_size=10))
def test_the_websocket_endpoint_survives_any_message_sequence(server, raws):
    async def run() -> None:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(server.url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
                assert (await ws.receive_json(timeout=10))["type"] == "ready"
                for raw in raws:
                    await (ws.send_bytes(raw) if isinstance(raw, bytes) else ws.send_str(raw))
                await ws.send_json({"type": "interrupt"})
                await ws.send_json({"type": "text", "turn_id": "after-the-fuzz", "text": "still here"})
                await ws.send_json({"type": "end_turn", "turn_id": "after-the-fuzz"})
                async with asyncio.timeout(20):
                    async for msg in ws:  # the connection lives: the last turn is spoken
                        if msg.type == aiohttp.WSMsgType.BINARY:
                            assert len(msg.data) <= MAX_MESSAGE_BYTES
                            continue
                        assert msg.type == aiohttp.WSMsgType.TEXT, msg
                        assert len(msg.data.encode()) <= MAX_MESSAGE_BYTES
                        event = json.loads(msg.data)
                        check_event(event, STREAM_CODES)
                        if event == {**event, "type": "turn_done", "turn_id": "after-the-fuzz"}:
                            return
                raise AssertionError("the connection closed")

    asyncio.run(run())
    assert server.worker.metrics.registry.get_sample_value("myna_errors_total", {"code": "internal"}) is None
