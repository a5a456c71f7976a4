"""A Pipecat bot whose voice is Myna, served to a browser through Pipecat's SmallWebRTC transport.

Runs with nothing but the embedded voice: no LLM, no API key. A stand-in "LLM" streams each
reply to the TTS token by token (~30 tokens/s) the way an LLM service does
(``LLMFullResponseStartFrame``, ``LLMTextFrame`` s, ``LLMFullResponseEndFrame``); the bot greets
you when you connect and then reads back whatever you type on the page, so you hear Myna
start speaking while the "LLM" is still writing. Sending while it speaks barges in
(``InterruptionFrame``): the old reply stops at once.

Run (needs the ``pipecat`` extra: ``bash scripts/setup.sh pipecat``)::

    python examples/pipecat_bot.py                        # in-process Piper voice (~3 s to load)
    python examples/pipecat_bot.py --myna http://127.0.0.1:8080   # TTS on a running `myna serve`

then open http://127.0.0.1:7860/ in a browser on the same machine and press *Connect*.
TTFB per reply (Pipecat's own metric, first token in → first audio out) is logged.

No STUN/TURN server is used: the browser must reach this host directly. When
bound to a loopback address, 127.0.0.1 is offered as an ICE candidate (like ``myna serve``).
"""

from __future__ import annotations

import argparse
import asyncio
import re

from myna.extras import require_or_exit

require_or_exit("pipecat")  # before the imports below, so a missing extra is one line, not a traceback

from aiohttp import web
from loguru import logger
from pipecat.frames.frames import (
    Frame,
    InputTransportMessageFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
from pipecat.workers.runner import WorkerRunner

from myna.integrations.pipecat import MynaTTSService

GREETING = "Hi, I'm a Pipecat bot with a Myna voice. Type something and I'll say it back."
TOKENS_PER_S = 30.0

PAGE = """<!doctype html><meta charset=utf-8><title>Myna + Pipecat</title>
<style>body{font:16px system-ui;max-width:40em;margin:2em auto}input{width:70%}</style>
<h1>Myna + Pipecat</h1>
<button id=connect>Connect</button> <span id=state>idle</span>
<p><input id=text placeholder="Type a reply for the bot to speak" disabled> <button id=send disabled>Send</button>
<audio id=audio autoplay></audio>
<script>
let pc, dc;
const $ = (id) => document.getElementById(id);
$("connect").onclick = async () => {
  pc = new RTCPeerConnection({iceServers: []});
  pc.addTransceiver("audio", {direction: "sendrecv"});
  pc.addTransceiver("video", {direction: "sendrecv"});
  pc.ontrack = (e) => { if (e.track.kind === "audio") $("audio").srcObject = new MediaStream([e.track]); };
  pc.onconnectionstatechange = () => $("state").textContent = pc.connectionState;
  dc = pc.createDataChannel("chat", {ordered: true});
  dc.onopen = () => {
    $("text").disabled = $("send").disabled = false;
    setInterval(() => dc.readyState === "open" && dc.send("ping: " + Date.now()), 1000);
  };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((ok) => { if (pc.iceGatheringState === "complete") ok();
    else pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && ok(); });
  const r = await fetch("/api/offer", {method: "POST", headers: {"Content-Type": "application/json"},
    body: JSON.stringify({sdp: pc.localDescription.sdp, type: "offer"})});
  await pc.setRemoteDescription(await r.json());
};
$("send").onclick = () => { dc.send(JSON.stringify({type: "say", text: $("text").value})); $("text").value = ""; };
$("text").onkeydown = (e) => { if (e.key === "Enter") $("send").onclick(); };
</script>
"""


class ScriptedLLM(FrameProcessor):
    """Stands in for an LLM service: streams a reply as token frames, like an LLM would.

    A reply starts on connect (the greeting) and for each ``{"type": "say", "text": ...}`` app
    message from the page (SmallWebRTC app messages are JSON objects with a ``type``). A new message while a reply is still streaming interrupts it.
    """

    def __init__(self):
        super().__init__()
        self._reply: asyncio.Task | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, InputTransportMessageFrame) and isinstance(frame.message, dict) and frame.message.get("text"):
            await self.say(str(frame.message["text"]))
        await self.push_frame(frame, direction)

    async def say(self, text: str) -> None:
        if self._reply is not None and not self._reply.done():
            await self.cancel_task(self._reply)
        await self.push_frame(InterruptionFrame())  # barge-in: drop whatever is still playing
        self._reply = self.create_task(self._stream(text))

    async def _stream(self, text: str) -> None:
        await self.push_frame(LLMFullResponseStartFrame())
        for token in re.findall(r"\S+\s*", text):
            await self.push_frame(LLMTextFrame(token))
            await asyncio.sleep(1.0 / TOKENS_PER_S)
        await self.push_frame(LLMFullResponseEndFrame())


class TTFBLogger(FrameProcessor):
    """Logs the TTS's TTFB metric (seconds → ms) as Pipecat reports it."""

    async def process_frame(self, frame: Frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, MetricsFrame):
            for data in frame.data:
                if isinstance(data, TTFBMetricsData) and data.value and "Myna" in data.processor:
                    logger.info(f"Myna TTFB: {data.value * 1000:.0f} ms")
        await self.push_frame(frame, direction)


async def run_bot(connection: SmallWebRTCConnection, myna_url: str | None, engine) -> None:
    """One browser session: transport → stand-in LLM → Myna TTS → transport."""
    transport = SmallWebRTCTransport(connection, TransportParams(audio_out_enabled=True, audio_in_enabled=False))
    llm = ScriptedLLM()
    tts = MynaTTSService(url=myna_url) if myna_url else MynaTTSService(engine=engine)
    pipeline = Pipeline([transport.input(), llm, tts, TTFBLogger(), transport.output()])
    worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True, audio_out_sample_rate=24_000))

    @transport.event_handler("on_client_connected")
    async def on_connected(transport, client):
        await llm.say(GREETING)

    @transport.event_handler("on_client_disconnected")
    async def on_disconnected(transport, client):
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--myna", metavar="URL", help="a running Myna worker (default: the in-process embedded voice)")
    args = parser.parse_args()

    from myna.rtc.ice import enable_loopback_candidates, is_loopback_host

    if is_loopback_host(args.host):
        enable_loopback_candidates()
    engine = None
    bots: set[asyncio.Task] = set()

    async def load_engine(app: web.Application):
        nonlocal engine
        if not args.myna:
            from myna.engines.piper import PiperEngine

            engine = PiperEngine()
            await engine.start()  # shared by every session
        yield
        for task in bots:
            task.cancel()
        await asyncio.gather(*bots, return_exceptions=True)
        if engine is not None:
            await engine.close()

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def offer(request: web.Request) -> web.Response:
        body = await request.json()
        connection = SmallWebRTCConnection(ice_servers=[])
        await connection.initialize(sdp=body["sdp"], type=body["type"])
        task = asyncio.create_task(run_bot(connection, args.myna, engine))
        bots.add(task)
        task.add_done_callback(bots.discard)
        return web.json_response(connection.get_answer())

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_post("/api/offer", offer)
    app.cleanup_ctx.append(load_engine)
    print(f"open http://{args.host}:{args.port}/ and press Connect (Ctrl-C stops)")
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
