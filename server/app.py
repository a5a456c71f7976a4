"""The worker's aiohttp application: signaling, sessions, page, health, metrics (DESIGN.md §3).

Routes:

- ``POST /api/offer``: SDP offer in, answer out (Pipecat SmallWebRTC compatible: ``sdp``,
  ``type``, ``pc_id``, ``restart_pc``, ``request_data`` with ``engine`` and ``voice``).
- ``PATCH /api/offer``: trickled ICE candidates for a known ``pc_id`` (SmallWebRTC clients).
- ``GET /healthz``: 200 once every engine has loaded and warmed up, 503 before.
- ``GET /metrics``: Prometheus text format.
- ``GET /``: the web page (package ``myna.web``).
- ``GET /v1/tts/stream``: streaming TTS over a WebSocket (:mod:`myna.server.tts_stream`).

Every error is JSON ``{"error": {"code", "message"}}`` with a 4xx status; an unexpected
exception is logged and answered with a bare 500 of the same shape, never a traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field
from importlib.resources import files

from aiohttp import web
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import candidate_from_sdp

from myna.engines import Engine
from myna.metrics import Metrics
from myna.rtc.ice import rtc_configuration
from myna.rtc.session import Session
from myna.server.tts_stream import add_tts_stream

log = logging.getLogger(__name__)

WORKER_KEY = web.AppKey("worker", "Worker")


class HTTPError(Exception):
    """An error answered as ``{"error": {"code", "message"}}`` with an HTTP status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Peer:
    """A peer connection and the session it carries."""

    pc_id: str
    pc: RTCPeerConnection
    session: Session
    channel: object | None = None  # where events go: the open channel the client last used
    channels: list = field(default_factory=list)


@dataclass
class Worker:
    """Engines, sessions and settings of one worker process.

    Args:
        engines: loaded engines by name; the first is the default.
        ice_servers: STUN/TURN URLs offered to aiortc (none by default: nothing leaves the host).
        connect_timeout: seconds a new peer may take to connect before it is dropped.
        max_hold_ms: the start rule's budget: the longest a turn's ready first audio may be held
            (``myna serve --max-hold-ms``; :mod:`myna.audio.playout`).
    """

    engines: dict[str, Engine]
    ice_servers: list[str] = field(default_factory=list)
    connect_timeout: float = 30.0
    max_hold_ms: float = 100.0
    metrics: Metrics = field(default_factory=Metrics)
    peers: dict[str, Peer] = field(default_factory=dict)
    ready: bool = False
    loading: asyncio.Task | None = None  # engine start-up, running once the app has started

    @property
    def default_engine(self) -> str:
        return next(iter(self.engines))

    async def start(self) -> None:
        """Load and warm up every engine; the worker is ready afterwards."""
        for engine in self.engines.values():
            await engine.start()
        self.ready = True

    async def offer(self, body: dict) -> dict:
        """Answer an SDP offer, creating (or restarting) a peer and its session.

        Raises:
            HTTPError: 400 for a malformed body, unknown engine or voice, or unusable SDP.
        """
        sdp, kind = body.get("sdp"), body.get("type")
        if not isinstance(sdp, str) or kind != "offer":
            raise HTTPError(400, "bad_request", 'the body needs "sdp" (string) and "type": "offer"')
        request_data = body.get("request_data") or body.get("requestData") or {}
        if not isinstance(request_data, dict):
            raise HTTPError(400, "bad_request", '"request_data" must be an object')
        engine_name = request_data.get("engine") or self.default_engine
        voice = request_data.get("voice")
        if not isinstance(engine_name, str) or not isinstance(voice, (str, type(None))):
            raise HTTPError(400, "bad_request", '"request_data.engine" and "request_data.voice" must be strings')
        if engine_name not in self.engines:
            raise HTTPError(400, "unknown_engine", f"unknown engine {engine_name!r}; loaded: {', '.join(self.engines)}")
        engine = self.engines[engine_name]
        if voice is not None and voice not in engine.voices:
            raise HTTPError(400, "unknown_voice", f"{engine_name} has no voice {voice!r}; available: {engine.voices}")
        if not self.ready:
            raise HTTPError(503, "not_ready", "the worker is still loading its engines")
        if "\nm=audio " not in sdp.replace("\r\n", "\n"):
            raise HTTPError(400, "bad_sdp", "the offer needs an audio m-line (add a recvonly audio transceiver)")

        pc_id = body.get("pc_id")
        existing = self.peers.get(pc_id) if isinstance(pc_id, str) else None
        if existing is not None and not body.get("restart_pc"):
            # Renegotiation keeps the ICE credentials; another peer's offer cannot reuse the id.
            if _ice_ufrag(sdp) != _ice_ufrag(existing.pc.remoteDescription.sdp):
                raise HTTPError(409, "pc_id_in_use", "that pc_id belongs to another connection; omit pc_id or set restart_pc")
            return await self._answer(existing, sdp)
        peer = self._new_peer(existing.pc_id if existing else f"myna-{uuid.uuid4().hex}", engine, voice)
        try:
            answer = await self._answer(peer, sdp)
        except HTTPError:
            await self._release(peer)
            raise
        if existing is not None:  # a restart replaces the old connection only once the new one is answered
            await self._release(existing)
        self.peers[peer.pc_id] = peer
        return answer

    def _new_peer(self, pc_id: str, engine: Engine, voice: str | None) -> Peer:
        pc = RTCPeerConnection(rtc_configuration(self.ice_servers))
        peer: Peer

        def send(event: dict) -> None:
            channel = peer.channel
            if channel is not None and channel.readyState == "open":
                channel.send(json.dumps(event))

        session = Session(engine=engine, send=send, metrics=self.metrics, voice=voice, max_hold_s=self.max_hold_ms / 1000.0)
        peer = Peer(pc_id, pc, session)
        pc.addTrack(session.track)

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            peer.channels.append(channel)
            if peer.channel is None or peer.channel.readyState != "open":
                peer.channel = channel

            @channel.on("message")
            def on_message(message) -> None:
                peer.channel = channel  # events go to the channel the client last spoke on
                session.handle_message(message)

            @channel.on("close")
            def on_close() -> None:
                peer.channels.remove(channel)
                if peer.channel is channel:  # fall back to another open channel, if any
                    peer.channel = next((c for c in reversed(peer.channels) if c.readyState == "open"), None)

            channel.send(json.dumps(session.ready_event(list(self.engines))))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("peer %s: %s", pc_id, pc.connectionState)
            if pc.connectionState in ("failed", "closed") and self.peers.get(pc_id) is peer:
                await self.close_peer(pc_id)

        asyncio.get_running_loop().call_later(self.connect_timeout, self._drop_if_unconnected, pc_id, pc)
        return peer

    async def _answer(self, peer: Peer, sdp: str) -> dict:
        try:
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await peer.pc.setLocalDescription(await peer.pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError, AssertionError, ... on bad SDP
            raise HTTPError(400, "bad_sdp", f"the offer could not be used: {exc or type(exc).__name__}") from None
        return {"sdp": peer.pc.localDescription.sdp, "type": peer.pc.localDescription.type, "pc_id": peer.pc_id}

    async def add_candidates(self, body: dict) -> None:
        """Add trickled ICE candidates (``PATCH /api/offer``).

        Raises:
            HTTPError: 400 for a malformed body, 404 for an unknown ``pc_id``.
        """
        peer = self.peers.get(body.get("pc_id")) if isinstance(body.get("pc_id"), str) else None
        if peer is None:
            raise HTTPError(404, "unknown_pc", "no peer connection with that pc_id")
        candidates = body.get("candidates")
        if not isinstance(candidates, list):
            raise HTTPError(400, "bad_request", '"candidates" must be a list')
        for item in candidates:
            try:
                text = item.get("candidate") or ""
                if not text:
                    await peer.pc.addIceCandidate(None)  # end of candidates
                    continue
                candidate = candidate_from_sdp(text.removeprefix("candidate:"))
                candidate.sdpMid = item.get("sdp_mid", item.get("sdpMid"))
                candidate.sdpMLineIndex = item.get("sdp_mline_index", item.get("sdpMLineIndex"))
                await peer.pc.addIceCandidate(candidate)
            except Exception as exc:
                raise HTTPError(400, "bad_candidate", f"unusable ICE candidate: {exc}") from None

    def _drop_if_unconnected(self, pc_id: str, pc: RTCPeerConnection) -> None:
        peer = self.peers.get(pc_id)
        if peer is not None and peer.pc is pc and pc.connectionState != "connected":
            log.info("peer %s did not connect within %.0f s", pc_id, self.connect_timeout)
            asyncio.ensure_future(self.close_peer(pc_id))

    async def close_peer(self, pc_id: str) -> None:
        """Release everything a peer's session owns (idempotent)."""
        peer = self.peers.pop(pc_id, None)
        if peer is not None:
            await self._release(peer)

    @staticmethod
    async def _release(peer: Peer) -> None:
        await peer.session.close()
        await peer.pc.close()

    async def close(self) -> None:
        """Close every peer, then the engines."""
        await asyncio.gather(*(self.close_peer(pc_id) for pc_id in list(self.peers)))
        for engine in self.engines.values():
            await engine.close()


# -- HTTP layer --------------------------------------------------------------------------
def _error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler):
    try:
        return await handler(request)
    except HTTPError as exc:
        request.app[WORKER_KEY].metrics.errors.labels(exc.code).inc()
        return _error_response(exc.status, exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error_response(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        request.app[WORKER_KEY].metrics.errors.labels("internal").inc()
        return _error_response(500, "internal", "internal error")


async def _json_body(request: web.Request) -> dict:
    try:
        raw = await request.read()
    except web.HTTPException:
        raise  # e.g. 413, answered by the middleware in the JSON shape
    except Exception:  # bad Content-Encoding, truncated body, ...
        raise HTTPError(400, "bad_body", "the request body could not be read") from None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # also bad UTF-8 and absurdly deep nesting
        raise HTTPError(400, "bad_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPError(400, "bad_request", "the body must be a JSON object")
    return body


async def _offer(request: web.Request) -> web.Response:
    return web.json_response(await request.app[WORKER_KEY].offer(await _json_body(request)))


async def _patch_offer(request: web.Request) -> web.Response:
    await request.app[WORKER_KEY].add_candidates(await _json_body(request))
    return web.json_response({"status": "success"})


async def _healthz(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    body = {"status": "ready" if worker.ready else "starting", "engines": list(worker.engines), "sessions": len(worker.peers)}
    return web.json_response(body, status=200 if worker.ready else 503)


async def _metrics(request: web.Request) -> web.Response:
    metrics = request.app[WORKER_KEY].metrics
    return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(files("myna.web") / "index.html")


def _ice_ufrag(sdp: str) -> str | None:
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None


def create_app(worker: Worker) -> web.Application:
    """The aiohttp application for ``worker``; engines load in the background at start-up."""
    app = web.Application(middlewares=[_json_errors], client_max_size=256 * 1024)
    app[WORKER_KEY] = worker
    app.router.add_post("/api/offer", _offer)
    app.router.add_patch("/api/offer", _patch_offer)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/", _index)
    app.router.add_static("/static/", path=str(files("myna.web")), show_index=False)
    add_tts_stream(app, worker)  # GET /v1/tts/stream

    async def start_engines(app: web.Application):
        worker.loading = asyncio.create_task(worker.start())
        yield
        worker.loading.cancel()
        await asyncio.gather(worker.loading, return_exceptions=True)
        await worker.close()

    app.cleanup_ctx.append(start_engines)
    return app
