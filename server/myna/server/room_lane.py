"""The race page's "via LiveKit room" lane: ``myna serve --livekit-url URL``.

The lane is a browser participant of a LiveKit room that Myna (this worker, its default engine)
joins, so the page measures Myna through a room with the same onset rule as its direct lanes.

Routes (only with a LiveKit URL; key and secret from ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET``):

- ``GET /api/room``: ``{"available": true}`` when the lane can run here, else
  ``{"available": false, "error": {"code", "message"}}`` with code ``no_livekit`` (no LiveKit URL)
  or ``no_livekit_client`` (livekit-client not installed); always 200, so a page asking does not
  log a failed request.
- ``POST /api/room``: (with the worker's access token when it has keys, as ``/api/offer``)
  opens a fresh room with Myna in it (an optional JSON body of session defaults, as an offer's
  ``request_data``: the page sends ``{"phrase_cache": false}``) and answers
  ``{"url", "token", "room", "identity"}``: the server's URL, a join token for the browser, the
  room, and Myna's identity there. Myna leaves once the browser has left (or, if nobody joined,
  after :data:`JOIN_TIMEOUT_S`). Without a LiveKit URL: 404 ``no_livekit``.
- ``GET /vendor/livekit-client.mjs``: the ``livekit-client`` ESM bundle: ``$MYNA_LIVEKIT_CLIENT``,
  else where ``scripts/setup.sh dev`` installs it from npm (the git-ignored ``.lk/npm`` of the
  folder the worker runs in: a checkout); 404 ``no_livekit_client`` when it is not there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from myna.access import short_secret_notice
from myna.extras import require
from myna.messages import BadMessage, TurnDefaults, parse_turn_defaults

log = logging.getLogger(__name__)

CLIENT_BUNDLE = Path(".lk/npm/node_modules/livekit-client/dist/livekit-client.esm.mjs")
#: Seconds Myna waits in a lane's room for the browser before leaving.
JOIN_TIMEOUT_S = 60.0
MYNA_IDENTITY = "myna"
NO_CLIENT = ("no_livekit_client", "livekit-client is not installed (bash scripts/setup.sh dev)")


def client_bundle() -> Path | None:
    """The livekit-client ESM bundle (``$MYNA_LIVEKIT_CLIENT``, else :data:`CLIENT_BUNDLE` under the
    current folder), if it is there."""
    path = Path(os.environ.get("MYNA_LIVEKIT_CLIENT") or CLIENT_BUNDLE)
    return path if path.is_file() else None


@dataclass
class RoomLanes:
    """Rooms opened for the page's room lane, each with Myna in it.

    Args:
        worker: the worker whose default engine and sessions (limits, metrics, drain) the rooms use.
        url: the LiveKit server's WebSocket URL.
        key: API key (mints the tokens).
        secret: API secret.
    """

    worker: object
    url: str
    key: str
    secret: str
    agents: set = field(default_factory=set)
    _tasks: set = field(default_factory=set)

    async def open(self, defaults: TurnDefaults) -> dict:
        """A new room with Myna in it, its turns with ``defaults``; what the browser needs to join it."""
        from livekit import rtc

        from myna.room.agent import RoomAgent
        from myna.room.tokens import participant_token

        room_name = f"myna-lane-{uuid.uuid4().hex[:10]}"
        engine = self.worker.engines[self.worker.default_engine]
        room = rtc.Room()
        agent = RoomAgent(room, engine, self.worker.sessions, engines=[engine.name],
                          defaults=defaults, leave_when_empty=True)
        agent.attach()
        await room.connect(self.url, participant_token(self.key, self.secret, room_name, MYNA_IDENTITY),
                           rtc.RoomOptions(auto_subscribe=False, connect_timeout=10.0))
        await agent.start()
        task = asyncio.get_running_loop().create_task(self._serve(agent))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        browser = f"browser-{uuid.uuid4().hex[:8]}"
        return {"url": self.url, "token": participant_token(self.key, self.secret, room_name, browser),
                "room": room_name, "identity": MYNA_IDENTITY}

    async def _serve(self, agent) -> None:
        self.agents.add(agent)
        try:
            watchdog = asyncio.get_running_loop().call_later(
                JOIN_TIMEOUT_S, lambda: agent.others() or agent.stop())
            await agent.run()
            watchdog.cancel()
        finally:
            self.agents.discard(agent)

    async def close(self) -> None:
        """Leave every lane room."""
        for agent in list(self.agents):
            agent.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def add_room_lane(app: web.Application, worker, url: str | None) -> None:
    """Add ``GET``/``POST /api/room`` and ``GET /vendor/livekit-client.mjs`` to the worker's app.

    Raises:
        SystemExit: ``url`` is given without ``LIVEKIT_API_KEY`` / ``LIVEKIT_API_SECRET``.
    """
    lanes = None
    if url:
        require("livekit")
        key, secret = os.environ.get("LIVEKIT_API_KEY"), os.environ.get("LIVEKIT_API_SECRET")
        if not key or not secret:
            raise SystemExit("myna serve --livekit-url: set LIVEKIT_API_KEY and LIVEKIT_API_SECRET")
        short_secret_notice(secret, "LIVEKIT_API_SECRET")
        lanes = RoomLanes(worker, url, key, secret)

    def missing() -> tuple[str, str] | None:
        """Why the lane cannot run here: (code, message), or None."""
        if lanes is None:
            return "no_livekit", "this worker has no LiveKit server (myna serve --livekit-url URL)"
        if client_bundle() is None:
            return NO_CLIENT
        return None

    async def lane_available(request: web.Request) -> web.Response:
        why = missing()
        if why is None:
            return web.json_response({"available": True})
        return web.json_response({"available": False, "error": {"code": why[0], "message": why[1]}})

    async def open_room(request: web.Request) -> web.Response:
        if (why := missing()) is not None:
            return _error(404, *why)
        grant = worker.authorize(request)  # a worker with keys opens rooms only for token holders
        if grant is not None:
            grant.check_engine(worker.default_engine)
        if worker.draining:
            return _error(503, "draining", "the worker is shutting down; connect to another")
        if not worker.ready:
            return _error(503, "not_ready", "the worker is still loading its engines")
        defaults = TurnDefaults(voice=worker.engines.voice_for(worker.default_engine))
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                return _error(400, "bad_json", "request body: not valid JSON")
            if not isinstance(body, dict):
                return _error(400, "bad_request", "request body: a JSON object of session defaults")
            try:
                defaults = parse_turn_defaults(body, defaults)
            except BadMessage as exc:
                return _error(400, exc.code, f"request body: {exc.message}")
        try:
            return web.json_response(await lanes.open(defaults))
        except Exception as exc:  # the LiveKit server is unreachable or refused us
            log.warning("room lane: %s", exc)
            return _error(502, "livekit_unavailable", f"could not open a LiveKit room: {exc}")

    async def bundle(request: web.Request) -> web.StreamResponse:
        path = client_bundle()
        if path is None:
            return _error(404, *NO_CLIENT)
        return web.FileResponse(path, headers={"Content-Type": "text/javascript"})

    app.router.add_get("/api/room", lane_available)
    app.router.add_post("/api/room", open_room)
    app.router.add_get("/vendor/livekit-client.mjs", bundle)

    async def leave_rooms(app: web.Application):
        yield
        if lanes is not None:
            await lanes.close()

    app.cleanup_ctx.append(leave_rooms)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)
