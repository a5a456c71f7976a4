"""The worker's aiohttp application: its engines and sessions, and the HTTP routes.

Routes:

- ``POST /api/offer``, ``PATCH /api/offer``: the WebRTC door (:mod:`myna.server.webrtc`;
  Pipecat SmallWebRTC compatible).
- ``GET /v1/tts/stream``: the WebSocket door (:mod:`myna.server.tts_stream`).
- ``POST /v1/audio/speech``, ``GET /v1/models``: the OpenAI speech door (:mod:`myna.server.speech`;
  its errors are OpenAI's shape).
- ``GET /healthz``: readiness. 200 ``ready`` once every engine has loaded and warmed up (and
  the phrase cache is filled);
  503 ``starting`` before, ``full`` at the session cap (with ``Retry-After``), ``draining``
  after SIGTERM.
- ``GET /livez``: liveness, 200 while the process serves (draining included).
- ``GET /metrics``: Prometheus text format.
- ``GET /``: the web page (package ``myna.web``).

With keys configured, offers and the WebSocket need an access token (:mod:`myna.server.auth`);
every session is opened through the worker's :class:`~myna.sessions.Sessions` (limits,
admission, drain). Every error is JSON ``{"error": {"code", "message"}}`` with a 4xx status
(503 when full, draining or starting; 429 and 503 refusals carry ``Retry-After``), its code
also in the ``Myna-Error`` header (a refused WebSocket handshake shows no body); an
unexpected exception is logged and answered with a bare 500 of the same shape, never a traceback.

Graceful drain (:meth:`Worker.drain`): readiness turns 503 ``draining``, new offers and
WebSocket connections get 503, sessions refuse new turns (``error`` ``draining``) and the turns
already speaking finish, up to a timeout; idle WebSocket connections are closed at once with
1001, busy ones once their turns are done; then the app's cleanup closes everything.

A refusal that sends the client elsewhere (every 503 and 429, on any door: a refused WebSocket
upgrade, ``POST /v1/audio/speech``, ``POST /api/offer``, ``/healthz``), and every response of
a draining worker, closes its TCP connection (``Connection: close``, then the socket is
closed; :func:`close_connection_when_refused`): behind a TCP load balancer a client's retry
then opens a new connection, which may reach another worker, instead of coming back to this
one over the kept-alive connection of its refusal.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from myna.engines import Engine
from myna.engines.build import Engines
from myna.errors import HTTPError
from myna.limits import RETRY_WHEN_FULL_S, Limits, measure_capacity
from myna.messages import quote_input
from myna.metrics import Metrics
from myna.server.auth import Authenticator, Grant, bearer_token
from myna.server.speech import add_speech
from myna.server.tts_stream import add_tts_stream
from myna.server.webrtc import Peers
from myna.sessions import Sessions

log = logging.getLogger(__name__)

WORKER_KEY = web.AppKey("worker", "Worker")
#: Longest request line and header field the HTTP parser takes (bytes): room for a token of
#: :data:`myna.server.auth.MAX_TOKEN_BYTES` in ``Authorization`` or ``?access_token=``, which is
#: refused in the contract's JSON (431) when larger. Past this the parser itself answers 400.
MAX_HEADER_BYTES = 256 * 1024
#: Response header naming the contract error code of every refusal (the body has it too).
ERROR_HEADER = "Myna-Error"
#: Statuses of a refusal another worker may not give (503: draining, full, starting; 429: over
#: a client's sessions or offer rate here): the response closes its connection.
RETRY_ELSEWHERE_STATUSES = frozenset({429, 503})


@dataclass
class Worker:
    """Engines, sessions and settings of one worker process.

    Args:
        engines: the engines (:func:`myna.engines.build.build_engines`, or a dict by name); the
            first is the default.
        ice_servers: STUN/TURN URLs offered to aiortc (none by default: nothing leaves the host).
        connect_timeout: seconds a new peer may take to connect before it is dropped.
        max_hold_ms: the start rule's budget: the longest a turn's ready first audio may be held
            (``myna serve --max-hold-ms``; :mod:`myna.audio.playout`).
        limits: session caps and rates (none by default; ``myna serve`` sets its own).
        auth: checks access tokens (None: no token needed; clients are told apart by address).
        measure_capacity: at start-up, set ``limits.max_sessions`` (when None) to the default
            engine's measured capacity (:func:`myna.limits.measure_capacity`), before the
            phrase cache is filled.
        ws_heartbeat: seconds between the WebSocket door's pings (``myna serve --ws-heartbeat``);
            a client that has not answered one within half of it is dropped and its session
            freed (0: no pings).
    """

    engines: Engines | dict[str, Engine]
    ice_servers: list[str] = field(default_factory=list)
    connect_timeout: float = 30.0
    max_hold_ms: float = 100.0
    limits: Limits = field(default_factory=Limits.off)
    auth: Authenticator | None = None
    measure_capacity: bool = False
    ws_heartbeat: float = 10.0
    metrics: Metrics = field(default_factory=Metrics)
    streams: set = field(default_factory=set)  # open /v1/tts/stream connections
    ready: bool = False
    loading: asyncio.Task | None = None  # engine start-up, running once the app has started
    sessions: Sessions = field(init=False)
    webrtc: Peers = field(init=False)

    def __post_init__(self) -> None:
        self.engines = Engines.of(self.engines)
        self.sessions = Sessions(self.metrics, self.limits, self.max_hold_ms / 1000.0)
        self.webrtc = Peers(self, self.ice_servers, self.connect_timeout)
        if self.engines.phrase_cache is not None:
            self.metrics.watch_phrase_cache(self.engines.phrase_cache)

    @property
    def default_engine(self) -> str:
        return self.engines.default

    @property
    def draining(self) -> bool:
        return self.sessions.draining

    async def start(self) -> None:
        """Load and warm up every engine (and measure capacity if asked), then fill the phrase
        cache (capacity is measured without it); ready afterwards."""
        await self.engines.start()
        if self.measure_capacity and self.limits.max_sessions is None:
            self.limits.max_sessions = await measure_capacity(self.engines[self.default_engine])
            log.info("capacity of %s on this host: %d sessions", self.default_engine, self.limits.max_sessions)
        await self.engines.warm_up()
        self.metrics.set_limits(self.limits)
        self.ready = True

    # -- who is asking, and what for ---------------------------------------------------------
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

    def refuse_while_draining(self) -> None:
        """Raises HTTPError 503 ``draining`` once the worker drains."""
        if self.draining:
            raise HTTPError(503, "draining", "the worker is shutting down; connect to another", RETRY_WHEN_FULL_S)

    def admit(self, client: str, grant: Grant | None) -> Callable[[], None]:
        """Take a session slot for ``client``; returns its release function.

        Raises:
            HTTPError: 503 ``draining`` / ``not_ready``; :class:`LimitExceeded` 503 or 429.
        """
        self.refuse_while_draining()
        if not self.ready:
            raise HTTPError(503, "not_ready", "the worker is still loading its engines")
        return self.sessions.admit(client, grant.max_sessions if grant is not None else None)

    def choose(self, engine_name: str | None, voice: str | None, grant: Grant | None) -> tuple[Engine, str | None]:
        """The engine and voice a client asks for (None: the defaults), checked against what is
        loaded and what its token allows: the same answer for the WebRTC offer and the WebSocket.

        Raises:
            HTTPError: 400 ``unknown_engine`` or ``unknown_voice``.
            AuthError: 403 ``forbidden`` (the token may not use the engine).
        """
        name = engine_name or self.default_engine
        if name not in self.engines:
            raise HTTPError(400, "unknown_engine", f"unknown engine {quote_input(name)}; loaded: {', '.join(self.engines)}")
        engine = self.engines[name]
        if voice is not None and voice not in engine.voices:
            raise HTTPError(400, "unknown_voice", f"{name} has no voice {quote_input(voice)}; available: {engine.voices}")
        if grant is not None:
            grant.check_engine(name)
        return engine, voice if voice is not None else self.engines.voice_for(name)

    def breakers(self) -> dict[str, str]:
        """The circuit breaker state of each engine with a fallback (``closed``, ``open``,
        ``half_open``; :class:`myna.engines.fallback.CircuitBreaker`), by engine name."""
        return self.engines.breakers()

    async def drain(self, timeout: float) -> bool:
        """Stop taking sessions and turns; wait up to ``timeout`` s for speaking turns to finish.
        Idle WebSocket connections are closed at once (1001 "going away"), the others as soon
        as their turns are done, so a pooling client reconnects (behind a load balancer, to
        another worker) instead of finding out at its next turn.

        Returns:
            True when every turn finished in time (the caller closes the worker afterwards).
        """
        self.sessions.start_drain()
        for connection in list(self.streams):
            connection.drain()
        return await self.sessions.drain(timeout)

    async def close(self) -> None:
        """Close every peer, then the engines."""
        await self.webrtc.close()
        await self.engines.close()


#: ``myna_breaker_state`` of each breaker state.
_BREAKER_LEVELS = {"closed": 0, "half_open": 1, "open": 2}


# -- HTTP layer --------------------------------------------------------------------------
def _error_response(status: int, code: str, message: str, retry_after: int | None = None) -> web.Response:
    # The code rides in a header too: a WebSocket client sees a refused handshake's status and
    # headers, never its body.
    headers = {ERROR_HEADER: code}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def close_connection_when_refused(response: web.StreamResponse, draining: bool = False) -> None:
    """Mark ``response`` to close its TCP connection (``Connection: close``; the server closes
    the socket once it is sent) when it is a refusal in :data:`RETRY_ELSEWHERE_STATUSES`, or
    when the worker is ``draining`` (an accepted WebSocket upgrade excepted: its connection
    is the WebSocket). Called for every response before its headers go out
    (``on_response_prepare``); any door may call it on a response it writes itself."""
    if response.status in RETRY_ELSEWHERE_STATUSES or (draining and response.status != 101):
        response.force_close()
        response.headers["Connection"] = "close"  # (aiohttp set its headers before the hook ran)


async def _on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    close_connection_when_refused(response, request.app[WORKER_KEY].draining)


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


async def json_body(request: web.Request) -> dict:
    """A request's body as a JSON object.

    Raises:
        HTTPError: 400 ``bad_body`` (unreadable), ``bad_json`` (not JSON), ``bad_request`` (not
            an object); aiohttp's 413 for a body over the app's ``client_max_size``.
    """
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
    body = await json_body(request)
    return web.json_response(await worker.webrtc.offer(body, worker.client_of(request, grant), grant))


async def _patch_offer(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    grant = worker.authorize(request)
    await worker.webrtc.add_candidates(await json_body(request), worker.client_of(request, grant))
    return web.json_response({"status": "success"})


async def _healthz(request: web.Request) -> web.Response:
    """Readiness: may this worker take a new session now?"""
    worker = request.app[WORKER_KEY]
    status, headers = "ready", None
    if worker.draining:
        status = "draining"
    elif not worker.ready:
        status = "starting"
    elif worker.sessions.admission.full:
        status, headers = "full", {"Retry-After": str(RETRY_WHEN_FULL_S)}
    body = {"status": status, "engines": list(worker.engines), "sessions": worker.sessions.admission.total,
            "max_sessions": worker.limits.max_sessions, "auth": worker.auth is not None, "breakers": worker.breakers()}
    return web.json_response(body, status=200 if status == "ready" else 503, headers=headers)


async def _voices(request: web.Request) -> web.Response:
    """``GET /v1/voices``: every voice of every loaded engine the token may use: ``name``,
    ``engine``, ``language`` (the voice config's; null when unknown), ``sample_rate`` (Hz), ``speakers``,
    and ``scripts`` (the scripts it reads) where the engine says."""
    worker = request.app[WORKER_KEY]
    grant = worker.authorize(request)
    voices = []
    for name, engine in worker.engines.items():
        if grant is not None and grant.engines is not None and name not in grant.engines:
            continue
        voices += [{"name": v["name"], "engine": name, "language": v["language"], "sample_rate": v["sample_rate"],
                    "speakers": v["speakers"], **({"scripts": v["scripts"]} if v.get("scripts") else {})}
                   for v in engine.voice_catalogue()]
    return web.json_response({"voices": voices})


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
    app = web.Application(middlewares=[_json_errors], client_max_size=256 * 1024,
                          handler_args={"max_line_size": MAX_HEADER_BYTES, "max_field_size": MAX_HEADER_BYTES})
    app[WORKER_KEY] = worker
    app.on_response_prepare.append(_on_response_prepare)  # refusals close their connections
    app.router.add_post("/api/offer", _offer)
    app.router.add_patch("/api/offer", _patch_offer)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/voices", _voices)
    app.router.add_get("/", _index)
    app.router.add_static("/static/", path=str(files("myna.web")), show_index=False)
    add_tts_stream(app, worker)  # GET /v1/tts/stream
    add_speech(app, worker)  # POST /v1/audio/speech, GET /v1/models

    async def start_engines(app: web.Application):
        worker.loading = asyncio.create_task(worker.start())
        yield
        worker.loading.cancel()
        await asyncio.gather(worker.loading, return_exceptions=True)
        await worker.close()

    app.cleanup_ctx.append(start_engines)
    return app
