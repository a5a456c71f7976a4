"""Drain hands clients on (issue 24, case 3): on SIGTERM idle WebSocket connections are closed
with 1001 at once, a connection's turn in progress finishes first; the remote plug-ins treat
``draining`` as a reason to reconnect to the same URL (here a TCP load balancer in front of two
workers in this process; loopback only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time

import aiohttp
import pytest

from inprocess import ToneEngine
from myna.bench.soak import serve_in_process
from myna.integrations.backend import RemoteBackend, Word
from myna.limits import Limits
from myna.server.app import Worker

pytestmark = pytest.mark.network

LONG = ("The weather today is sunny, with a light breeze from the west. Tomorrow brings clouds in the morning "
        "and rain after noon, so keep an umbrella close and your plans flexible.")


async def test_sigterm_closes_idle_websockets_at_once_and_busy_ones_after_their_turn(start_worker):
    worker = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--drain-timeout", "30")
    ws_url = worker.url.replace("http", "ws") + "/v1/tts/stream"
    try:
        async with aiohttp.ClientSession() as http:
            idle = await http.ws_connect(ws_url)
            busy = await http.ws_connect(ws_url)
            for ws in (idle, busy):
                assert (await ws.receive_json())["type"] == "ready"
            await busy.send_json({"type": "text", "turn_id": "t", "text": LONG})
            await busy.send_json({"type": "end_turn", "turn_id": "t"})
            while (await busy.receive_json())["type"] != "first_audio":
                pass
            t0 = time.monotonic()
            worker.proc.send_signal(signal.SIGTERM)
            msg = await idle.receive(timeout=5)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED) and idle.close_code == 1001
            idle_closed_s = time.monotonic() - t0
            assert idle_closed_s < 2.0
            events = []
            while True:
                msg = await busy.receive(timeout=30)
                if msg.type != aiohttp.WSMsgType.TEXT:
                    if msg.type == aiohttp.WSMsgType.BINARY:
                        continue
                    break
                events.append(json.loads(msg.data))
            assert busy.close_code == 1001
            assert events[-1]["type"] == "turn_done" and not events[-1].get("interrupted")
            words = [e["word"].lower().strip(".,") for e in events if e["type"] == "word"]
            assert words == re.sub(r"[^a-z ]", "", LONG.lower()).split()  # the whole turn, every word
        assert worker.proc.wait(timeout=30) == 0
    finally:
        worker.stop()
    print(f"idle WebSocket closed 1001 {idle_closed_s * 1000:.0f} ms after SIGTERM")


class Balancer:
    """A TCP load balancer on loopback: each new connection goes to ``target`` (host, port)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self._server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _pipe(self, reader, writer) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)

        async def copy(src, dst):
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def tone_worker() -> Worker:
    return Worker(engines={"tone": ToneEngine(word_ms=10.0)}, limits=Limits(max_sessions_per_client=None, offer_rate=None))


async def speak(backend: RemoteBackend, text: str) -> list[str]:
    turn = await backend.open_turn()
    await turn.push_text(text)
    await turn.end_input()
    return [item.word async for item in turn if isinstance(item, Word)]


async def test_the_remote_backend_reconnects_when_its_worker_drains():
    a, b = tone_worker(), tone_worker()
    balancer = Balancer(("127.0.0.1", 0))
    async with serve_in_process(a) as url_a, serve_in_process(b) as url_b, balancer as lb:
        balancer.target = address(url_a)
        backend = RemoteBackend(lb)
        await backend.start()  # a pooled connection to A
        try:
            assert await speak(backend, "one two") == ["one", "two"]
            # A drains: its idle connection (pooled here) is closed with 1001; new ones go to B.
            balancer.target = address(url_b)
            drained = asyncio.ensure_future(a.drain(5))
            assert await asyncio.wait_for(drained, 5)
            await asyncio.sleep(0.1)
            assert not any(c.usable for c in backend._idle)
            assert await speak(backend, "three four") == ["three", "four"]
            # The race: a turn on a connection whose worker began draining just before it was sent
            # gets "draining" and moves, whole, to a new connection (to C behind the same URL).
            c = tone_worker()
            async with serve_in_process(c) as url_c:
                turn = await backend.open_turn()
                balancer.target = address(url_c)
                b.sessions.start_drain()  # sessions refuse turns; the connection is still open
                await turn.push_text("five six seven")
                await turn.end_input()
                words = [item.word async for item in turn if isinstance(item, Word)]
                assert words == ["five", "six", "seven"]
                assert c.metrics.turns.labels("tone")._value.get() == 1
        finally:
            await backend.aclose()


async def test_the_livekit_plugin_speaks_on_through_a_drain_behind_the_same_url():
    pytest.importorskip("livekit.agents")
    from myna.integrations import livekit as myna_livekit

    a, b = tone_worker(), tone_worker()
    balancer = Balancer(("127.0.0.1", 0))
    async with serve_in_process(a) as url_a, serve_in_process(b) as url_b, balancer as lb:
        balancer.target = address(url_a)
        tts = myna_livekit.TTS(url=lb)
        try:
            first = [ev async for ev in tts.synthesize("one two")]
            balancer.target = address(url_b)
            await a.drain(5)  # the pooled connection is closed; the next reply reconnects
            second = [ev async for ev in tts.synthesize("three four")]
        finally:
            await tts.aclose()
    assert first and second and sum(len(ev.frame.data) for ev in second) > 0
    assert b.metrics.turns.labels("tone")._value.get() == 1
