"""Drain hands clients on: on SIGTERM idle WebSocket connections are closed
with 1001 at once, a connection's turn in progress finishes first; the remote plug-ins treat
``draining`` as a reason to reconnect to the same URL (here a TCP load balancer in front of two
workers in this process; loopback only)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import aiohttp
import pytest

from inprocess import LIVEZ, OFFER, SPEECH, WS_UPGRADE, Balancer, ToneEngine, address, exchange, refused_and_closed
from myna.bench.soak import serve_in_process
from myna.integrations.backend import RemoteBackend, Word
from myna.limits import Limits
from myna.server.app import Worker

pytestmark = pytest.mark.network

LONG = ("The weather today is sunny, with a light breeze from the west. Tomorrow brings clouds in the morning "
        "and rain after noon, so keep an umbrella close and your plans flexible.")


@pytest.mark.slow
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


# -- a rolling restart behind a round-robin TCP proxy ---------------------------------------
# Two workers behind a proxy that alternates per accepted connection; W1 drains. A refusal must
# not keep its TCP connection (the refused client's retry would go back to W1 over it): the
# worker closes it, and the plug-ins retry at once on a fresh connection, which lands on W2.

async def test_every_door_s_refusal_while_full_or_draining_closes_its_connection():
    worker = Worker(engines={"tone": ToneEngine(word_ms=10.0)},
                    limits=Limits(max_sessions=1, max_sessions_per_client=None, offer_rate=None))
    async with serve_in_process(worker) as url, aiohttp.ClientSession() as http:
        # Answers that are not such refusals keep their connection (a 400 included): the next
        # request goes over it.
        reader, writer = await asyncio.open_connection(*address(url))
        for request, expected in ((LIVEZ, 200), (OFFER, 400), (LIVEZ, 200)):  # (OFFER: its SDP has no audio)
            status, headers = await exchange(reader, writer, request)
            assert status == expected and headers.get("connection", "").lower() != "close"
        writer.close()
        # Full: the one session is held by a WebSocket.
        held = await http.ws_connect(url.replace("http", "ws") + "/v1/tts/stream")
        for request in (WS_UPGRADE, SPEECH):
            status, headers = await refused_and_closed(url, request)
            assert (status, headers["connection"].lower()) == (503, "close") and "retry-after" in headers
            assert headers.get("myna-error") == ("full" if request is WS_UPGRADE else None)  # (speech: OpenAI's shape)
        await held.close()
        # Draining: every door (WebSocket upgrade, speech, WebRTC offer), and any answer at all.
        worker.sessions.start_drain()
        for request in (WS_UPGRADE, SPEECH, OFFER):
            status, headers = await refused_and_closed(url, request)
            assert (status, headers["connection"].lower()) == (503, "close") and "retry-after" in headers
            assert headers.get("myna-error") == (None if request is SPEECH else "draining")
        assert (await refused_and_closed(url, LIVEZ))[0] == 200


async def test_a_429_closes_its_connection_too():
    worker = Worker(engines={"tone": ToneEngine(word_ms=10.0)},
                    limits=Limits(max_sessions_per_client=1, offer_rate=None))
    async with serve_in_process(worker) as url, aiohttp.ClientSession() as http:
        held = await http.ws_connect(url.replace("http", "ws") + "/v1/tts/stream")
        status, headers = await refused_and_closed(url, WS_UPGRADE)
        assert (status, headers["myna-error"], headers["connection"].lower()) == (429, "too_many_sessions", "close")
        await held.close()


def next_to(balancer: Balancer, target: tuple[str, int]) -> None:
    """Order ``balancer``'s round robin so that its next connection goes to ``target``."""
    while balancer.target != target:
        balancer.targets.append(balancer.targets.pop(0))


async def test_a_refused_upgrade_moves_the_turn_to_the_other_worker_on_a_fresh_connection():
    """The remote backend, its own pool and a caller's (a plain ``aiohttp.ClientSession``,
    which keeps connections alive): either way the refused connection is not used again."""
    w1, w2 = tone_worker(), tone_worker()
    async with serve_in_process(w1) as url1, serve_in_process(w2) as url2, aiohttp.ClientSession() as shared:
        w1.sessions.start_drain()
        for session in (None, shared):
            balancer = Balancer(address(url1), address(url2))
            async with balancer as lb:
                backend = RemoteBackend(lb, session=session)
                try:
                    next_to(balancer, address(url1))
                    before = w2.metrics.turns.labels("tone")._value.get()
                    assert await speak(backend, "one two") == ["one", "two"]
                    assert w2.metrics.turns.labels("tone")._value.get() == before + 1
                    assert balancer.chosen == [address(url1), address(url2)]  # refused by W1, then W2
                finally:
                    await backend.aclose()


async def pooled_connections_closed(backend: RemoteBackend) -> None:
    """Until the worker's 1001 has reached every pooled connection of ``backend``."""
    await asyncio.wait_for(asyncio.gather(*(c._reader for c in backend._idle if c._reader is not None)), 5)


async def livekit_reply(tts, text: str) -> tuple[list, float]:
    """One reply through livekit-agents' streaming API (its retry loop included): its audio
    events and the seconds from the first text pushed to the first audio."""
    loop = asyncio.get_running_loop()
    events, first_audio = [], None
    async with tts.stream() as stream:
        t0 = loop.time()
        for token in re.findall(r"\S+\s*", text):
            stream.push_text(token)
        stream.flush()
        stream.end_input()
        async with asyncio.timeout(30):
            async for ev in stream:
                if first_audio is None and len(ev.frame.data):
                    first_audio = loop.time() - t0
                events.append(ev)
    return events, first_audio


async def test_the_livekit_plugin_s_next_reply_goes_to_the_other_worker_at_once_behind_a_round_robin_proxy():
    """The public report: W1 drains (SIGTERM), the next reply's upgrade lands on W1 and is
    refused; it must be spoken by W2 right away, not fail after LiveKit's 0.1 + 2 + 2 s of
    retries over the same kept-alive connection."""
    pytest.importorskip("livekit.agents")
    from myna.integrations import livekit as myna_livekit

    w1, w2 = tone_worker(), tone_worker()
    async with serve_in_process(w1) as url1, serve_in_process(w2) as url2:
        balancer = Balancer(address(url1), address(url2))
        async with balancer as lb:
            tts = myna_livekit.TTS(url=lb)
            errors = []
            tts.on("error", errors.append)
            took, refused_from = None, 0
            try:
                next_to(balancer, address(url1))
                first, _ = await livekit_reply(tts, "one two")
                assert first and w1.metrics.turns.labels("tone")._value.get() == 1  # on W1's pooled connection
                await w1.drain(5)  # what SIGTERM does: idle connections closed with 1001, upgrades refused
                await pooled_connections_closed(tts._backend)
                next_to(balancer, address(url1))  # the reply's new connection lands on W1, as in the report
                refused_from = len(balancer.chosen)
                t0 = asyncio.get_running_loop().time()
                second, took = await livekit_reply(tts, "three four")
            finally:
                await tts.aclose()
                ended = asyncio.get_running_loop().time() - t0 if refused_from else 0.0
                print(f"\nLiveKit, W1 draining: the next reply's first audio after "
                      f"{'-' if took is None else f'{took * 1000:.0f} ms'}, its end after {ended * 1000:.0f} ms; "
                      f"{len(balancer.chosen)} connections through the proxy")
    assert second and sum(len(ev.frame.data) for ev in second) > 0
    assert w2.metrics.turns.labels("tone")._value.get() == 1 and w1.metrics.turns.labels("tone")._value.get() == 1
    assert balancer.chosen[refused_from:] == [address(url1), address(url2)]  # refused once, then W2
    assert not errors  # no retry by the framework was needed
    assert took < 1.0


async def test_the_pipecat_service_s_next_reply_goes_to_the_other_worker_behind_a_round_robin_proxy():
    """Pipecat has no retry of its own: the plug-in's fresh connection is the only way on."""
    pytest.importorskip("pipecat")
    from pipecat.frames.frames import (
        EndFrame, ErrorFrame, LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame, TTSAudioRawFrame,
        TTSStoppedFrame, TTSTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from myna.integrations.pipecat import MynaTTSService

    class Ends(FrameProcessor):
        """At the pipeline's head (ErrorFrames going up) and tail (TTS frames coming down)."""

        def __init__(self):
            super().__init__(enable_direct_mode=True)
            self.frames, self.errors, self.stops = [], [], asyncio.Queue()
            self.first_audio_at: float | None = None

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if direction == FrameDirection.UPSTREAM and isinstance(frame, ErrorFrame):
                self.errors.append(frame.error)
            elif direction == FrameDirection.DOWNSTREAM:
                self.frames.append(frame)
                if isinstance(frame, TTSAudioRawFrame) and self.first_audio_at is None:
                    self.first_audio_at = asyncio.get_running_loop().time()
                elif isinstance(frame, TTSStoppedFrame):
                    self.stops.put_nowait(len(self.frames))
            await self.push_frame(frame, direction)

    def reply(text: str) -> list:
        return [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in re.findall(r"\S+\s*", text)),
                LLMFullResponseEndFrame()]

    w1, w2 = tone_worker(), tone_worker()
    async with serve_in_process(w1) as url1, serve_in_process(w2) as url2:
        balancer = Balancer(address(url1), address(url2))
        async with balancer as lb:
            next_to(balancer, address(url1))
            head, tail, service = Ends(), Ends(), MynaTTSService(url=lb)
            pipeline = PipelineWorker(Pipeline([head, service, tail]), cancel_on_idle_timeout=False,
                                      params=PipelineParams(audio_out_sample_rate=24_000))
            running = asyncio.Event()

            @pipeline.event_handler("on_pipeline_started")
            async def _started(worker, frame):
                running.set()

            async def drive() -> tuple[int, float]:
                await asyncio.wait_for(running.wait(), 15)
                for frame in reply("one two"):
                    await pipeline.queue_frame(frame)
                mark = await asyncio.wait_for(tail.stops.get(), 30)
                assert w1.metrics.turns.labels("tone")._value.get() == 1
                await w1.drain(5)
                await pooled_connections_closed(service._backend)
                next_to(balancer, address(url1))
                tail.first_audio_at, t0 = None, asyncio.get_running_loop().time()
                for frame in reply("three four"):
                    await pipeline.queue_frame(frame)
                await asyncio.wait_for(tail.stops.get(), 30)
                took = tail.first_audio_at - t0
                await pipeline.queue_frame(EndFrame())
                return mark, took

            runner = WorkerRunner(handle_sigint=False)
            await runner.add_workers(pipeline)
            _, (mark, took) = await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 60)
            print(f"\nPipecat: next reply's first audio {took * 1000:.0f} ms after its text (W1 draining)")
    words = [f.text.strip() for f in tail.frames[mark:] if isinstance(f, TTSTextFrame)]
    assert words == ["three", "four"] and not head.errors
    assert w2.metrics.turns.labels("tone")._value.get() == 1 and w1.metrics.turns.labels("tone")._value.get() == 1
    assert took < 1.0
