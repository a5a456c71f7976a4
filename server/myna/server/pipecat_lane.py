"""The race page's Pipecat lanes: Pipecat's own pipeline beside Myna, on the same voice.

Where ``pipecat-ai[piper]`` is installed (``bash scripts/setup.sh race``), ``myna serve`` offers
two lanes that run Pipecat's code, not a re-implementation of it: its SmallWebRTC transport and
its in-process ``PiperTTSService`` loaded with Myna's embedded voice, fed the page's text as an
LLM service's frames (:mod:`myna.bench.pipecat_peer`, the peer ``myna bench ttfa --peer
pipecat`` measures). ``request_data.engine`` picks the service's text aggregation:
``"sentence"`` (Pipecat's default) or ``"token"``.

The peer runs in a child process of the worker (as a Pipecat bot would run beside Myna, not on
Myna's event loop), started on the first offer (loading Pipecat and the voice takes a few
seconds) and stopped with the worker. Only signaling passes through the worker: the offer is
relayed to the child, and media and the data channel then go straight between the browser and
the child. Its ICE candidates are loopback ones when the worker's are (a browser on this
machine; ``myna serve`` on a loopback host or with ``--ice-loopback``), else every interface's.

Routes (``myna serve --no-pipecat-lane`` leaves both out):

- ``GET /api/pipecat``: ``{"available": true}``, or ``{"available": false, "error": {"code",
  "message"}}`` with code ``no_pipecat`` when ``pipecat-ai[piper]`` is not installed (the message
  names the command that installs it); always 200, so a page asking does not log a failed request.
- ``POST /api/pipecat/offer``: SmallWebRTC signaling (``{"sdp", "type", "request_data"}``),
  with the worker's access token when it has keys, as ``/api/offer``; answered with the peer's
  answer. 404 ``no_pipecat``; 503 ``draining`` / ``not_ready``, and ``full`` while the peer runs
  :data:`MAX_CONNECTIONS` pipelines (the relay cannot see a browser leave, so the peer's own count
  is the bound: the worker's session limits count Myna's sessions, not these); 502
  ``pipecat_failed`` when the peer process did not start (its log is the worker's stderr; the next
  try waits :data:`RETRY_START_AFTER_S`). The peer's own port answers anyone on this machine,
  as a Pipecat bot's would.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

import aiohttp
from aiohttp import web

from myna.errors import HTTPError
from myna.extras import MissingExtra, require
from myna.server.app import json_body

log = logging.getLogger(__name__)

#: Seconds the peer process may take to import Pipecat and load the voice.
START_TIMEOUT_S = 90.0
#: Seconds a relayed offer may take (the peer builds the pipeline before it answers).
OFFER_TIMEOUT_S = 30.0
#: Pipelines the peer runs at once (a page opens two; a page that was just reloaded may still hold
#: its old two while the peer notices them close); an offer past it is 503 ``full``.
MAX_CONNECTIONS = 8
#: Seconds after a failed start before the next offer tries again (each try is a new process).
RETRY_START_AFTER_S = 30.0


def missing_pipecat() -> str | None:
    """Why the lanes cannot run here (the install hint of the ``race`` extra), or None."""
    try:
        require("race")
    except MissingExtra as exc:
        return str(exc)
    return None


class PipecatPeer:
    """The peer process (``python -m myna.bench.pipecat_peer``), started on first use.

    Args:
        loopback: offer loopback ICE candidates only (the worker's own rule).
    """

    def __init__(self, loopback: bool):
        self.loopback = loopback
        self._proc: asyncio.subprocess.Process | None = None
        self._url: str | None = None
        self._starting: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None
        self._failed: tuple[float, str] | None = None  # (when, why) of the last failed start

    async def offer(self, body: dict) -> tuple[int, dict]:
        """Relay an offer; returns the peer's status and JSON answer.

        Raises:
            RuntimeError: the peer process could not be started, or answered no JSON.
            HTTPError: 503 ``full``: the peer runs :data:`MAX_CONNECTIONS` pipelines.
        """
        url = await self._running()
        async with self._http.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as res:
            connections = (await res.json(content_type=None)).get("connections", 0)
        if connections >= MAX_CONNECTIONS:
            raise HTTPError(503, "full", f"the Pipecat lanes run {connections} connections, the most they take", 5)
        async with self._http.post(f"{url}/api/offer", json=body,
                                   timeout=aiohttp.ClientTimeout(total=OFFER_TIMEOUT_S)) as res:
            try:
                return res.status, await res.json(content_type=None)
            except ValueError:
                raise RuntimeError(f"the Pipecat peer answered {res.status} without JSON") from None

    async def _running(self) -> str:
        if self._proc is not None and self._proc.returncode is not None:
            log.warning("pipecat lane: the peer process exited with %s; starting it again", self._proc.returncode)
            self._proc = self._url = None
        if self._url is not None:
            return self._url
        loop = asyncio.get_running_loop()
        if self._failed is not None and loop.time() - self._failed[0] < RETRY_START_AFTER_S:
            raise RuntimeError(self._failed[1])
        if self._starting is None or self._starting.done():
            self._starting = asyncio.get_running_loop().create_task(self._start())
        try:
            return await asyncio.shield(self._starting)
        except RuntimeError as exc:
            self._failed = (loop.time(), str(exc))
            raise

    async def _start(self) -> str:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # --exit-with-stdin: the peer stops when this process ends, however it ends (a second
        # Ctrl-C exits at once, skipping clean-up), as its end of the pipe closes.
        args = [sys.executable, "-m", "myna.bench.pipecat_peer", "--port", str(port), "--exit-with-stdin"]
        if not self.loopback:
            args.append("--any-interface")
        log.info("pipecat lane: starting Pipecat's SmallWebRTC + PiperTTSService (port %d)", port)
        self._proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while asyncio.get_running_loop().time() < deadline:
            if self._proc.returncode is not None:
                raise RuntimeError(f"the Pipecat peer exited with {self._proc.returncode} while starting (see the log)")
            try:
                async with self._http.get(f"{url}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as res:
                    if res.status == 200:
                        self._url = url
                        return url
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.2)  # (polling a child's readiness: no event to wait on across processes)
        await self.close()
        raise RuntimeError(f"the Pipecat peer was not ready within {START_TIMEOUT_S:.0f} s")

    async def close(self) -> None:
        """Stop the peer process (SIGTERM, then SIGKILL after 5 s) and the relay's client."""
        proc, self._proc, self._url = self._proc, None, None
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._http is not None:
            await self._http.close()
            self._http = None


def add_pipecat_lane(app: web.Application, worker, loopback: bool) -> None:
    """Add ``GET /api/pipecat`` and ``POST /api/pipecat/offer`` to the worker's app.

    Args:
        worker: the :class:`myna.server.app.Worker` (its token check, readiness and drain).
        loopback: the peer offers loopback ICE candidates only.
    """
    missing = missing_pipecat()
    peer = PipecatPeer(loopback) if missing is None else None

    async def available(request: web.Request) -> web.Response:
        if peer is None:
            return web.json_response({"available": False, "error": {"code": "no_pipecat", "message": missing}})
        return web.json_response({"available": True})

    async def offer(request: web.Request) -> web.Response:
        if peer is None:
            raise HTTPError(404, "no_pipecat", missing)
        worker.authorize(request)  # a worker with keys relays offers only for token holders
        worker.refuse_while_draining()
        if not worker.ready:
            raise HTTPError(503, "not_ready", "the worker is still loading its engines")
        try:
            status, answer = await peer.offer(await json_body(request))
        except (RuntimeError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("pipecat lane: %s", exc)
            raise HTTPError(502, "pipecat_failed", f"Pipecat's peer did not answer: {exc}") from None
        return web.json_response(answer, status=status)

    app.router.add_get("/api/pipecat", available)
    app.router.add_post("/api/pipecat/offer", offer)

    async def stop_peer(app: web.Application):
        yield
        if peer is not None:
            await peer.close()

    app.cleanup_ctx.append(stop_peer)

