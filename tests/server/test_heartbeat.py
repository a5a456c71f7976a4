"""Heartbeats both ways: a WebSocket client frozen mid-turn (SIGSTOP) loses its
session and slot within the heartbeat; a worker frozen mid-turn fails the remote plug-ins' turn
with a retryable error within theirs, and they speak again once a worker answers (loopback only)."""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time

import pytest

from inprocess import ToneEngine
from myna.bench.soak import serve_in_process
from myna.integrations import backend as backend_module
from myna.integrations.backend import Audio, MynaError, RemoteBackend, Word
from myna.limits import Limits
from myna.server.app import Worker

pytestmark = pytest.mark.network

LONG = " ".join(["The weather today is sunny, with a light breeze from the west."] * 20)

CLIENT = textwrap.dedent("""
    import asyncio, json, sys
    import aiohttp

    async def main(url):
        async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
            await ws.receive()
            await ws.send_str(json.dumps({"type": "text", "turn_id": "t", "text": sys.argv[2]}))
            await ws.send_str(json.dumps({"type": "end_turn", "turn_id": "t"}))
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    print("audio", flush=True)
                    await asyncio.sleep(3600)  # keep the connection; the test freezes this process

    asyncio.run(main(sys.argv[1]))
""")


async def test_a_client_frozen_mid_turn_loses_its_session_and_slot_within_the_heartbeat():
    w = Worker(engines={"tone": ToneEngine(word_ms=200.0)}, limits=Limits(max_sessions_per_client=None, offer_rate=None),
               ws_heartbeat=1.0)
    async with serve_in_process(w) as url:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, url.replace("http", "ws") + "/v1/tts/stream",
                                                    LONG, stdout=asyncio.subprocess.PIPE)
        try:
            assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"audio"
            assert w.sessions.admission.total == 1 and len(w.sessions.all()) == 1
            proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            while w.sessions.admission.total and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.05)
            freed_s = time.monotonic() - t0
            assert w.sessions.admission.total == 0 and not w.sessions.all() and not w.streams
            assert freed_s < 1.0 + 0.5 + 1.0  # one ping interval, half of it for the pong, and slack
        finally:
            proc.kill()
            await proc.wait()
    print(f"frozen client's session freed {freed_s:.1f} s after SIGSTOP (heartbeat 1 s)")


@pytest.mark.slow
async def test_a_worker_frozen_mid_turn_is_a_retryable_error_and_the_backend_speaks_again(start_worker, monkeypatch):
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--ws-heartbeat", "1")
    try:
        backend = RemoteBackend(worker.url, heartbeat=1.0)
        await backend.start()
        turn = await backend.open_turn()
        await turn.push_text(LONG)
        await turn.end_input()
        got = []
        with pytest.raises(MynaError) as failed:
            async with asyncio.timeout(20):
                async for item in turn:
                    got.append(item)
                    if isinstance(item, Audio) and len(got) == 3:
                        worker.proc.send_signal(signal.SIGSTOP)
                        t0 = time.monotonic()
        failed_s = time.monotonic() - t0
        assert failed.value.code == "heartbeat_timeout" and failed.value.code in backend_module.RETRYABLE_CODES
        assert failed_s < 1.0 + 0.5 + 1.5
        worker.proc.send_signal(signal.SIGCONT)
        turn = await backend.open_turn()  # a new connection: the dead one is not reused
        await turn.push_text("Hello again.")
        await turn.end_input()
        words = [item.word async for item in turn if isinstance(item, Word)]
        assert [w.strip(".").lower() for w in words] == ["hello", "again"]
        await backend.aclose()
    finally:
        worker.proc.send_signal(signal.SIGCONT)
        worker.stop()
    print(f"frozen worker: the plug-in's turn failed {failed_s:.1f} s after SIGSTOP (heartbeat 1 s)")


@pytest.mark.slow
async def test_the_livekit_plugin_turns_a_frozen_worker_into_a_retryable_api_error(start_worker, monkeypatch):
    pytest.importorskip("livekit.agents")
    from livekit.agents import APIConnectionError, APIConnectOptions

    from myna.integrations import livekit as myna_livekit

    monkeypatch.setattr(backend_module, "HEARTBEAT_S", 1.0)
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--ws-heartbeat", "1")
    try:
        tts = myna_livekit.TTS(url=worker.url)
        stream = tts.stream(conn_options=APIConnectOptions(max_retry=0, timeout=30))
        stream.push_text(LONG)
        stream.end_input()
        t0 = None
        with pytest.raises(APIConnectionError) as failed:
            async with asyncio.timeout(20):
                async for ev in stream:
                    if t0 is None:
                        worker.proc.send_signal(signal.SIGSTOP)
                        t0 = time.monotonic()
        assert failed.value.retryable and time.monotonic() - t0 < 1.0 + 0.5 + 1.5
        worker.proc.send_signal(signal.SIGCONT)
        events = [ev async for ev in tts.synthesize("Hello again.")]
        assert sum(len(ev.frame.data) for ev in events) > 0
        await tts.aclose()
    finally:
        worker.proc.send_signal(signal.SIGCONT)
        worker.stop()
