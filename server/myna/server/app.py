"""The worker's aiohttp application: signaling, sessions, page, health, metrics (DESIGN.md §3).

Routes:

- ``POST /api/offer``: SDP offer in, answer out (Pipecat SmallWebRTC compatible: ``sdp``,
  ``type``, ``pc_id``, ``restart_pc``, ``request_data`` with ``engine`` and ``voice``).
- ``PATCH /api/offer``: trickled ICE candidates for a known ``pc_id`` (SmallWebRTC clients).
- ``GET /healthz``: readiness. 200 ``ready`` once every engine has loaded and warmed up (and
  the phrase cache is filled);
  503 ``starting`` before, ``full`` at the session cap (with ``Retry-After``), ``draining``
  after SIGTERM.
- ``GET /livez``: liveness, 200 while the process serves (draining included).
- ``GET /metrics``: Prometheus text format.
- ``GET /``: the web page (package ``myna.web``).
- ``GET /v1/tts/stream``: streaming TTS over a WebSocket (:mod:`myna.server.tts_stream`).

With keys configured, offers and the WebSocket need an access token (:mod:`myna.server.auth`);
every session passes the worker's limits (:mod:`myna.server.limits`). Every error is JSON
``{"error": {"code", "message"}}`` with a 4xx status (503 when full, draining or starting; 429
and 503 refusals carry ``Retry-After``); an unexpected exception is logged and answered with a
bare 500 of the same shape, never a traceback.

Graceful drain (:meth:`Worker.drain`): readiness turns 503 ``draining``, new offers and
WebSocket connections get 503, sessions refuse new turns (``error`` ``draining``) and the turns
already speaking finish, up to a timeout; then the app's cleanup closes everything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import candidate_from_sdp

from myna.engines import Engine
from myna.engines.phrase_cache import PhraseCache, warm_up
from myna.errors import HTTPError
from myna.events import MAX_MESSAGE_BYTES, Error, encode_event
from myna.engines.fallback import FallbackEngine
from myna.metrics import Metrics
from myna.rtc.ice import rtc_configuration
from myna.rtc.session import Session, quote_input
from myna.server.auth import Authenticator, Grant, bearer_token
from myna.server.limits import RETRY_WHEN_FULL_S, Admission, Limits, MessageRate, measure_capacity
from myna.server.tts_stream import add_tts_stream

log = logging.getLogger(__name__)

WORKER_KEY = web.AppKey("worker", "Worker")


@dataclass
class Peer:
    """A peer connection, the session it carries, and who owns it."""

    pc_id: str
    pc: RTCPeerConnection
    session: Session
    owner: str  # the client it is counted against (token identity or address)
    release: Callable[[], None]  # gives the owner's session slot back (idempotent)
    rate: MessageRate
    channel: object | None = None  # where events go: the open channel the client last used
    channels: list = field(default_factory=list)
    connect_timer: asyncio.TimerHandle | None = None
    max_event_bytes: int = MAX_MESSAGE_BYTES  # the smaller of ours and the peer's SCTP max-message-size
    refused_kinds: set = field(default_factory=set)  # event types already reported as too large


@dataclass
class Worker:
    """Engines, sessions and settings of one worker process.

    Args:
        engines: loaded engines by name; the first is the default.
        ice_servers: STUN/TURN URLs offered to aiortc (none by default: nothing leaves the host).
        connect_timeout: seconds a new peer may take to connect before it is dropped.
        max_hold_ms: the start rule's budget: the longest a turn's ready first audio may be held
            (``myna serve --max-hold-ms``; :mod:`myna.audio.playout`).
        limits: session caps and rates (none by default; ``myna serve`` sets its own).
        auth: checks access tokens (None: no token needed; clients are told apart by address).
        measure_capacity: at start-up, set ``limits.max_sessions`` (when None) to the default
            engine's measured capacity (:func:`myna.server.limits.measure_capacity`).
        phrase_cache: synthesised units kept for reuse (:mod:`myna.engines.phrase_cache`;
            None: off), attached to the engines at start-up after capacity is measured.
        warm_phrases: spoken into the phrase cache at start-up, before the worker is ready.
    """

    engines: dict[str, Engine]
    ice_servers: list[str] = field(default_factory=list)
    connect_timeout: float = 30.0
    max_hold_ms: float = 100.0
    limits: Limits = field(default_factory=Limits.off)
    auth: Authenticator | None = None
    measure_capacity: bool = False
    phrase_cache: PhraseCache | None = None
    warm_phrases: list[str] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    peers: dict[str, Peer] = field(default_factory=dict)
    streams: set = field(default_factory=set)  # open /v1/tts/stream connections
    ready: bool = False
    draining: bool = False
    loading: asyncio.Task | None = None  # engine start-up, running once the app has started
    admission: Admission = field(init=False)

    def __post_init__(self) -> None:
        self.admission = Admission(self.limits)
        if self.phrase_cache is not None:
            self.metrics.watch_phrase_cache(self.phrase_cache)

    @property
    def default_engine(self) -> str:
        return next(iter(self.engines))

    async def start(self) -> None:
        """Load and warm up every engine (and measure capacity if asked), then fill the phrase
        cache (capacity is measured without it); ready afterwards."""
        for engine in self.engines.values():
            await engine.start()
        if self.measure_capacity and self.limits.max_sessions is None:
            self.limits.max_sessions = await measure_capacity(self.engines[self.default_engine])
            log.info("capacity of %s on this host: %d sessions", self.default_engine, self.limits.max_sessions)
        if self.phrase_cache is not None:
            # An engine behind a fallback is warmed itself: its turns are the same, and a slow
            # first synthesis must not count against its breaker.
            engines = [e.primary if isinstance(e, FallbackEngine) else e for e in self.engines.values()]
            await warm_up(engines, self.phrase_cache, self.warm_phrases)
        self.metrics.set_limits(self.limits)
        self.ready = True

    # -- who is asking ----------------------------------------------------------------------
    def authorize(self, request: web.Request, query_token: bool = False) -> Grant | None:
        """The request's grant (None when the worker needs no token).

        Raises:
            AuthError: 401 or 403 (see :mod:`myna.server.auth`).
        """
        if self.auth is None:
            return None
        return self.auth.verify(bearer_token(request.headers, request.query if query_token else {}))

    @staticmethod
    def client_of(request: web.Request, grant: Grant | None) -> str:
        """Whom a request's sessions count against: the token's identity, else the address."""
        return f"identity:{grant.identity}" if grant is not None else f"address:{request.remote}"

    def admit(self, client: str, grant: Grant | None) -> Callable[[], None]:
        """Take a session slot for ``client``; returns its release function.

        Raises:
            HTTPError: 503 ``draining`` / ``not_ready``; :class:`LimitExceeded` 503 or 429.
        """
        if self.draining:
            raise HTTPError(503, "draining", "the worker is shutting down; connect to another", RETRY_WHEN_FULL_S)
        if not self.ready:
            raise HTTPError(503, "not_ready", "the worker is still loading its engines")
        self.admission.admit(client, grant.max_sessions if grant is not None else None)
        return self.admission.hold(client)

    def breakers(self) -> dict[str, str]:
        """The circuit breaker state of each engine with a fallback (``closed``, ``open``,
        ``half_open``; :class:`myna.engines.fallback.CircuitBreaker`), by engine name."""
        return {name: engine.breaker.state for name, engine in self.engines.items() if isinstance(engine, FallbackEngine)}

    def sessions(self) -> list[Session]:
        """Every open session, WebRTC and WebSocket."""
        return [p.session for p in self.peers.values()] + [c.session for c in self.streams if c.session is not None]

    # -- signaling ------------------------------------------------------------------------
    async def offer(self, body: dict, client: str = "local", grant: Grant | None = None) -> dict:
        """Answer an SDP offer, creating (or restarting) a peer and its session for ``client``.

        Raises:
            HTTPError: 400 for a malformed body, unknown engine or voice, or unusable SDP; 409
                for another client's ``pc_id``; 503 while starting or draining.
            AuthError: 403 when ``grant`` may not use the engine.
            LimitExceeded: 503 ``full``, 429 ``too_many_sessions`` / ``rate_limited``.
        """
        if self.draining:
            raise HTTPError(503, "draining", "the worker is shutting down; connect to another", RETRY_WHEN_FULL_S)
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
            raise HTTPError(400, "unknown_engine",
                            f"unknown engine {quote_input(engine_name)}; loaded: {', '.join(self.engines)}")
        engine = self.engines[engine_name]
        if voice is not None and voice not in engine.voices:
            raise HTTPError(400, "unknown_voice", f"{engine_name} has no voice {quote_input(voice)}; available: {engine.voices}")
        if grant is not None:
            grant.check_engine(engine_name)
        if not self.ready:
            raise HTTPError(503, "not_ready", "the worker is still loading its engines")
        if "\nm=audio " not in sdp.replace("\r\n", "\n"):
            raise HTTPError(400, "bad_sdp", "the offer needs an audio m-line (add a recvonly audio transceiver)")

        pc_id = body.get("pc_id")
        existing = self.peers.get(pc_id) if isinstance(pc_id, str) else None
        if existing is not None and existing.owner != client:
            raise HTTPError(409, "pc_id_in_use", "that pc_id belongs to another client; omit pc_id")
        if existing is not None and not body.get("restart_pc"):
            # Renegotiation keeps the ICE credentials; another peer's offer cannot reuse the id.
            if _ice_ufrag(sdp) != _ice_ufrag(existing.pc.remoteDescription.sdp):
                raise HTTPError(409, "pc_id_in_use", "that pc_id belongs to another connection; omit pc_id or set restart_pc")
            return await self._answer(existing, sdp)
        if existing is not None:  # a restart takes over the slot of the connection it replaces
            release, existing.release = existing.release, _nothing
        else:
            release = self.admit(client, grant)
        peer = self._new_peer(existing.pc_id if existing else f"myna-{uuid.uuid4().hex}", engine, voice, client, release)
        try:
            answer = await self._answer(peer, sdp)
        except HTTPError:
            if existing is not None:
                peer.release, existing.release = _nothing, release  # the old connection keeps its slot
            await self._release(peer)
            raise
        if existing is not None:  # a restart replaces the old connection only once the new one is answered
            await self._release(existing)
        self.peers[peer.pc_id] = peer
        return answer

    def _new_peer(self, pc_id: str, engine: Engine, voice: str | None, owner: str, release: Callable[[], None]) -> Peer:
        pc = RTCPeerConnection(rtc_configuration(self.ice_servers))
        peer: Peer

        def send(event: dict) -> None:
            self._send_event(peer, peer.channel, event)

        session = Session(engine=engine, send=send, metrics=self.metrics, voice=voice,
                          max_hold_s=self.max_hold_ms / 1000.0, max_turn_chars=self.limits.max_turn_chars, max_queued_turns=self.limits.max_queued_turns)
        if self.draining:
            session.drain()
        peer = Peer(pc_id, pc, session, owner, release, MessageRate(self.limits.message_rate, self.limits.message_burst))
        pc.addTrack(session.track)

        @pc.on("datachannel")
        def on_datachannel(channel) -> None:
            peer.channels.append(channel)
            if peer.channel is None or peer.channel.readyState != "open":
                peer.channel = channel

            @channel.on("message")
            def on_message(message) -> None:
                peer.channel = channel  # events go to the channel the client last spoke on
                allowed, report = peer.rate.allow()
                if allowed:
                    session.handle_message(message)
                elif report:
                    session.refuse("rate_limited", peer.rate.message)

            @channel.on("close")
            def on_close() -> None:
                peer.channels.remove(channel)
                if peer.channel is channel:  # fall back to another open channel, if any
                    peer.channel = next((c for c in reversed(peer.channels) if c.readyState == "open"), None)

            self._send_event(peer, channel, session.ready_event(list(self.engines)))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            log.info("peer %s: %s", pc_id, pc.connectionState)
            if pc.connectionState in ("failed", "closed") and self.peers.get(pc_id) is peer:
                await self.close_peer(pc_id)

        peer.connect_timer = asyncio.get_running_loop().call_later(
            self.connect_timeout, self._drop_if_unconnected, pc_id, pc)
        return peer

    def _send_event(self, peer: Peer, channel, event: dict) -> None:
        """Send one event on ``channel``; one that cannot go (too large for the peer, channel
        failing) is dropped and counted, never raised into the caller (the track's frame loop)."""
        if channel is None or channel.readyState != "open":
            return
        text = encode_event(event, peer.max_event_bytes)
        if text is None:
            self.metrics.events_dropped.labels("too_large").inc()
            kind = str(event.get("type"))
            if kind not in peer.refused_kinds:  # say so once per event type, if even that fits
                peer.refused_kinds.add(kind)
                log.warning("peer %s: %s events exceed its max-message-size (%d bytes); dropped",
                            peer.pc_id, kind, peer.max_event_bytes)
                notice = encode_event(Error(code="event_too_large", message=f"{kind} events do not fit your max-message-size").to_dict(),
                                      peer.max_event_bytes)
                if notice is not None:
                    self._send_text(peer, channel, notice)
            return
        self._send_text(peer, channel, text)

    def _send_text(self, peer: Peer, channel, text: str) -> None:
        try:
            channel.send(text)
        except Exception as exc:  # aiortc raises ValueError, InvalidStateError, ... mid-close
            self.metrics.events_dropped.labels("send_failed").inc()
            log.info("peer %s: an event could not be sent: %s", peer.pc_id, exc)

    async def _answer(self, peer: Peer, sdp: str) -> dict:
        try:
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            await peer.pc.setLocalDescription(await peer.pc.createAnswer())
        except Exception as exc:  # aiortc raises ValueError, AssertionError, ... on bad SDP
            raise HTTPError(400, "bad_sdp", f"the offer could not be used: {exc or type(exc).__name__}") from None
        peer.max_event_bytes = _max_event_bytes(sdp)
        return {"sdp": peer.pc.localDescription.sdp, "type": peer.pc.localDescription.type, "pc_id": peer.pc_id}

    async def add_candidates(self, body: dict, client: str = "local") -> None:
        """Add trickled ICE candidates (``PATCH /api/offer``) to a peer of ``client``.

        Raises:
            HTTPError: 400 for a malformed body, 404 for an unknown ``pc_id`` (or another client's).
        """
        peer = self.peers.get(body.get("pc_id")) if isinstance(body.get("pc_id"), str) else None
        if peer is None or peer.owner != client:
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
        """Close the session and the connection and drop every reference to them now (not
        when the connect timer fires: a closed connection must not outlive its close)."""
        peer.release()
        if peer.connect_timer is not None:
            peer.connect_timer.cancel()
            peer.connect_timer = None
        try:
            await peer.session.close()
        finally:
            await peer.pc.close()
            peer.pc.remove_all_listeners()  # the handlers close over the peer: break the cycle
            for channel in peer.channels:
                channel.remove_all_listeners()
            peer.channels.clear()
            peer.channel = None

    async def drain(self, timeout: float) -> bool:
        """Stop taking sessions and turns; wait up to ``timeout`` s for speaking turns to finish.

        Returns:
            True when every turn finished in time (the caller closes the worker afterwards).
        """
        self.draining = True
        self.metrics.draining.set(1)
        for session in self.sessions():
            session.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(s.busy for s in self.sessions()) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not any(s.busy for s in self.sessions())

    async def close(self) -> None:
        """Close every peer, then the engines."""
        await asyncio.gather(*(self.close_peer(pc_id) for pc_id in list(self.peers)))
        for engine in self.engines.values():
            await engine.close()


#: ``myna_breaker_state`` of each breaker state.
_BREAKER_LEVELS = {"closed": 0, "half_open": 1, "open": 2}


def _nothing() -> None:
    """A release function with nothing left to release."""


def _max_event_bytes(sdp: str) -> int:
    """Our 16 KiB cap, or less when the peer's SDP says so (``a=max-message-size``,
    RFC 8841 §6: absent means 64 KiB, 0 means any size)."""
    sizes = [int(m) for m in re.findall(r"^a=max-message-size:\s*(\d+)", sdp, flags=re.MULTILINE)]
    return min([MAX_MESSAGE_BYTES, *(n for n in sizes if n > 0)])


# -- HTTP layer --------------------------------------------------------------------------
def _error_response(status: int, code: str, message: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


@web.middleware
async def _json_errors(request: web.Request, handler):
    try:
        return await handler(request)
    except HTTPError as exc:  # also AuthError and LimitExceeded
        request.app[WORKER_KEY].metrics.errors.labels(exc.code).inc()
        return _error_response(exc.status, exc.code, exc.message, exc.retry_after)
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
    worker = request.app[WORKER_KEY]
    grant = worker.authorize(request)
    body = await _json_body(request)
    return web.json_response(await worker.offer(body, worker.client_of(request, grant), grant))


async def _patch_offer(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    grant = worker.authorize(request)
    await worker.add_candidates(await _json_body(request), worker.client_of(request, grant))
    return web.json_response({"status": "success"})


async def _healthz(request: web.Request) -> web.Response:
    """Readiness: may this worker take a new session now?"""
    worker = request.app[WORKER_KEY]
    status, headers = "ready", None
    if worker.draining:
        status = "draining"
    elif not worker.ready:
        status = "starting"
    elif worker.admission.full:
        status, headers = "full", {"Retry-After": str(RETRY_WHEN_FULL_S)}
    body = {"status": status, "engines": list(worker.engines), "sessions": worker.admission.total,
            "max_sessions": worker.limits.max_sessions, "auth": worker.auth is not None, "breakers": worker.breakers()}
    return web.json_response(body, status=200 if status == "ready" else 503, headers=headers)


async def _livez(request: web.Request) -> web.Response:
    """Liveness: the process serves requests (also while starting, full or draining)."""
    return web.json_response({"status": "alive"})


async def _metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    metrics = worker.metrics
    for name, state in worker.breakers().items():
        metrics.breaker.labels(name).set(_BREAKER_LEVELS[state])
    return web.Response(body=metrics.render(), headers={"Content-Type": metrics.content_type})


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(files("myna.web") / "index.html")


def _ice_ufrag(sdp: str) -> str | None:
    for line in sdp.splitlines():
        if line.startswith("a=ice-ufrag:"):
            return line.split(":", 1)[1].strip()
    return None


class AccessLogger(AbstractAccessLogger):
    """One ``aiohttp.access`` line per request: method, path (never the query: it may hold a
    token), status, bytes, time. Probe endpoints (``/healthz``, ``/livez``, ``/metrics``) log at
    debug, so a load balancer polling every second does not fill the log at info."""

    PROBES = frozenset({"/healthz", "/livez", "/metrics"})

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        level = logging.DEBUG if request.path in self.PROBES else logging.INFO
        if self.logger.isEnabledFor(level):
            self.logger.log(level, "%s %s %s %d %d %.1fms", request.remote, request.method, request.path,
                            response.status, response.body_length, 1000.0 * time)


def create_app(worker: Worker) -> web.Application:
    """The aiohttp application for ``worker``; engines load in the background at start-up."""
    app = web.Application(middlewares=[_json_errors], client_max_size=256 * 1024)
    app[WORKER_KEY] = worker
    app.router.add_post("/api/offer", _offer)
    app.router.add_patch("/api/offer", _patch_offer)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/livez", _livez)
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
