"""Graceful drain and logs of a real ``myna serve`` process (embedded voice, loopback only)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import aiohttp
import pytest

from inprocess import OFFER, SPEECH, WS_UPGRADE, refused_and_closed
from myna.rtc.client import MynaClient

pytestmark = pytest.mark.network

LONG = ("The weather today is sunny, with a light breeze from the west. Tomorrow brings clouds in the morning "
        "and rain after noon, so keep an umbrella close and your plans flexible.")


async def status_of(http, method: str, url: str, **kw) -> tuple[int, dict]:
    async with http.request(method, url, **kw) as resp:
        return resp.status, await resp.json()


async def speaking_client(url: str) -> tuple[MynaClient, asyncio.Future]:
    client = MynaClient(url)
    await client.connect()
    turn = asyncio.ensure_future(client.speak(LONG, tokens_per_s=None, timeout=60))
    async with asyncio.timeout(30):
        while not any(e["type"] == "first_audio" for e in client.history):
            await asyncio.sleep(0.02)
    return client, turn


@pytest.mark.slow
async def test_sigterm_mid_turn_finishes_the_turn_refuses_new_sessions_and_exits_0(start_worker):
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--drain-timeout", "30")
    try:
        client, turn = await speaking_client(worker.url)
        worker.proc.send_signal(signal.SIGTERM)
        async with aiohttp.ClientSession() as http:
            for _ in range(50):  # the signal is handled within a few ms
                status, body = await status_of(http, "GET", f"{worker.url}/healthz")
                if body["status"] == "draining":
                    break
                await asyncio.sleep(0.05)
            assert (status, body["status"]) == (503, "draining")
            assert (await status_of(http, "GET", f"{worker.url}/livez"))[0] == 200
            with pytest.raises(RuntimeError, match="503.*draining"):
                await MynaClient(worker.url).connect()
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(worker.url.replace("http", "ws") + "/v1/tts/stream")
            assert refused.value.status == 503
            client.send({"type": "text", "turn_id": "late", "text": "One more thing."})  # no new turns either
        result = await turn
        done = result.events[-1]
        assert done["type"] == "turn_done" and not done.get("interrupted")
        words = [e["word"].lower() for e in result.events if e["type"] == "word"]
        assert words == re.sub(r"[^a-z ]", "", LONG.lower()).split()  # every word was spoken
        assert any(e.get("code") == "draining" for e in client.history)
        await client.close()
        assert worker.proc.wait(timeout=30) == 0
    finally:
        worker.stop()
    log = worker.log_path.read_text()
    assert "draining: 1 session(s) speaking" in log


@pytest.mark.slow
async def test_after_sigterm_every_door_s_503_says_connection_close_and_closes_the_socket(start_worker):
    """A rolling restart behind a TCP load balancer: a refused client retries on a new
    connection (perhaps to another worker) only if the refusal did not keep its connection."""
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--drain-timeout", "30")
    try:
        client, turn = await speaking_client(worker.url)  # the worker drains until this turn is done
        async with aiohttp.ClientSession() as http:
            idle = await http.ws_connect(worker.url.replace("http", "ws") + "/v1/tts/stream")
            assert (await idle.receive_json())["type"] == "ready"
            worker.proc.send_signal(signal.SIGTERM)
            assert (await idle.receive(timeout=5)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        for request in (WS_UPGRADE, SPEECH, OFFER):  # (the idle WebSocket's 1001 says the drain began)
            status, headers = await refused_and_closed(worker.url, request)
            assert (status, headers["connection"].lower()) == (503, "close")
            assert headers.get("myna-error") == (None if request is SPEECH else "draining")
        assert not turn.done()  # all of it while draining
        assert (await turn).events[-1]["type"] == "turn_done"
        await client.close()
        assert worker.proc.wait(timeout=30) == 0
    finally:
        worker.stop()


@pytest.mark.slow
async def test_a_second_signal_exits_at_once(start_worker):
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--drain-timeout", "30")
    try:
        client, turn = await speaking_client(worker.url)
        worker.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        worker.proc.send_signal(signal.SIGINT)
        code = await asyncio.get_running_loop().run_in_executor(None, worker.proc.wait, 10)
        assert code == 128 + signal.SIGINT and time.monotonic() - t0 < 5  # long before the turn could end
        turn.cancel()
        await client.close()
    finally:
        worker.stop()


@pytest.mark.slow
def test_health_polls_leave_no_access_line_at_info_and_json_logs_parse(start_worker):
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8")
    try:
        for path in ("/healthz", "/livez", "/metrics", "/healthz", "/"):
            urllib.request.urlopen(worker.url + path, timeout=10).read()
    finally:
        worker.stop()
    lines = worker.log_path.read_text().splitlines()
    assert not [line for line in lines if re.search(r"GET /(healthz|livez|metrics) ", line)]
    assert [line for line in lines if re.search(r"GET / 200 ", line)]  # other requests are still logged

    out = subprocess.run([sys.executable, "-c", "import logging, sys; from myna.cli import _configure_logging; "
                          "_configure_logging('info', 'json'); logging.getLogger('myna.x').info('hello %s', 'there'); "
                          "logging.getLogger('myna.x').debug('not shown')"],
                         capture_output=True, text=True, timeout=30)
    records = [json.loads(line) for line in out.stderr.splitlines()]
    assert records == [{"time": records[0]["time"], "level": "INFO", "logger": "myna.x", "message": "hello there"}]
