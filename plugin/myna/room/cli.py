"""``myna room`` (join one room) and ``myna worker`` (serve the rooms LiveKit dispatches).

Both take the server's WebSocket URL; the API key and secret come from ``LIVEKIT_API_KEY`` and
``LIVEKIT_API_SECRET`` (``myna room`` may take a ready ``--token`` instead).

Exit status: ``myna room`` returns 0 when it is stopped (Ctrl-C, SIGTERM) or the room ends
(closed, deleted, Myna removed) and 1 when the join is refused (bad or expired token, no
server) or the connection is lost. ``myna worker`` returns 0 when stopped and 1 when it cannot
reach the server after its retries.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

#: Room endings that are not failures (the room's life ended, or Myna was asked to leave).
_NORMAL_ENDS = {"CLIENT_INITIATED", "ROOM_DELETED", "ROOM_CLOSED", "PARTICIPANT_REMOVED"}


def add_parsers(sub) -> None:
    """Register ``room`` and ``worker`` on the ``myna`` sub-command parser."""
    p = sub.add_parser("room", help="join one LiveKit room as a voice bot",
                       description="Join a LiveKit room and speak what participants stream to Myna "
                                   "(README: LiveKit rooms).")
    p.add_argument("--url", required=True, help="the LiveKit server's WebSocket URL, e.g. ws://127.0.0.1:7880")
    p.add_argument("--room", required=True, help="room name")
    p.add_argument("--identity", default="myna", help="Myna's participant identity (default: %(default)s)")
    p.add_argument("--token", help="a join token (default: minted from LIVEKIT_API_KEY and LIVEKIT_API_SECRET)")
    _add_common(p)
    p.set_defaults(func=_room)

    p = sub.add_parser("worker", help="register with LiveKit and serve the rooms it dispatches",
                       description="Register with a LiveKit server for agent dispatch; join each room this "
                                   "worker is dispatched to, until no one but agents is left in it.")
    p.add_argument("--url", required=True, help="the LiveKit server's WebSocket URL, e.g. ws://127.0.0.1:7880")
    p.add_argument("--agent-name", default="myna", help="agent name to register (default: %(default)s)")
    p.add_argument("--capacity", type=int, default=max(1, 4 * ((os.cpu_count() or 2) - 1)),
                   help="speaking sessions before this worker reports itself full (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=0, help="health endpoint port on 127.0.0.1 (default: any free port)")
    p.add_argument("--max-retry", type=int, default=16, help="attempts to reach the server before exiting (default: %(default)s)")
    _add_common(p)
    p.set_defaults(func=_worker)


def _add_common(p) -> None:
    p.add_argument("--engine", default="piper", help="engine to speak with (default: %(default)s)")
    p.add_argument("--voice", default=None, help="voice name (default: the engine's)")
    p.add_argument("--speak-for", nargs="+", metavar="IDENTITY",
                   help="only these participants may speak through Myna (default: everyone)")


def require_livekit(what: str) -> None:
    """Exit with one line when the ``livekit`` extra is missing (``what`` needs it).

    Raises:
        SystemExit: ``livekit`` or ``livekit-agents`` cannot be imported.
    """
    try:
        import livekit.agents  # noqa: F401
        import livekit.rtc  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"myna: {what} needs the livekit extra ({exc.name} is missing): "
                         f"bash scripts/setup.sh livekit, or pip install -e '.[livekit]'") from None


def _credentials() -> tuple[str, str]:
    key, secret = os.environ.get("LIVEKIT_API_KEY"), os.environ.get("LIVEKIT_API_SECRET")
    if not key or not secret:
        raise SystemExit("myna: set LIVEKIT_API_KEY and LIVEKIT_API_SECRET (or pass --token to `myna room`)")
    return key, secret


async def _start_engine(args: argparse.Namespace):
    from myna.cli import _engines

    engine = _engines(args.engine)[args.engine]
    if args.voice is not None and args.voice not in engine.voices:
        raise SystemExit(f"myna: {args.engine} has no voice {args.voice!r}; available: {engine.voices}")
    await engine.start()
    return engine


def _on_signals(stop) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


# -- room ---------------------------------------------------------------------------------
def _room(args: argparse.Namespace) -> int:
    require_livekit("myna room")
    return asyncio.run(_run_room(args))


async def _run_room(args: argparse.Namespace) -> int:
    from livekit import api, rtc

    from myna.metrics import Metrics
    from myna.room.agent import RoomAgent

    if args.token:
        token = args.token
    else:
        key, secret = _credentials()
        token = (api.AccessToken(key, secret).with_identity(args.identity).with_name(args.identity).with_kind("agent")
                 .with_grants(api.VideoGrants(room_join=True, room=args.room, can_publish=True, can_subscribe=True,
                                              can_publish_data=True, can_update_own_metadata=True)).to_jwt())
    engine = await _start_engine(args)
    try:
        room = rtc.Room()
        agent = RoomAgent(room, engine, Metrics(), voice=args.voice,
                          speak_for=frozenset(args.speak_for) if args.speak_for else None)
        agent.attach()
        try:
            await room.connect(args.url, token, rtc.RoomOptions(auto_subscribe=False, connect_timeout=10.0))
        except rtc.ConnectError as exc:
            print(f"myna room: could not join {args.room!r} at {args.url}: {exc}", file=sys.stderr)
            return 1
        await agent.start()
        _on_signals(agent.stop)
        print(f"myna: in room {args.room!r} as {room.local_participant.identity!r} (Ctrl-C leaves)", flush=True)
        await agent.run()
    finally:
        await engine.close()
    reason = rtc.DisconnectReason.Name(agent.disconnect_reason) if agent.disconnect_reason is not None else "CLIENT_INITIATED"
    print(f"myna: left room {args.room!r} ({reason})", flush=True)
    return 0 if reason in _NORMAL_ENDS else 1


# -- worker -------------------------------------------------------------------------------
def _worker(args: argparse.Namespace) -> int:
    require_livekit("myna worker")
    return asyncio.run(_run_worker(args))


async def _run_worker(args: argparse.Namespace) -> int:
    from myna.room.worker import RoomWorker, agent_server

    key, secret = _credentials()
    engine = await _start_engine(args)
    try:
        worker = RoomWorker(engine, capacity=args.capacity, voice=args.voice,
                            speak_for=frozenset(args.speak_for) if args.speak_for else None)
        server = agent_server(worker, args.url, key, secret, agent_name=args.agent_name, http_port=args.http_port,
                              max_retry=args.max_retry)
        server.on("worker_registered", lambda worker_id, _info: print(
            f"myna: worker {worker_id} registered as agent {args.agent_name!r} at {args.url} "
            f"(capacity {args.capacity} speaking sessions)", flush=True))
        running = asyncio.ensure_future(server.run())
        stopping = asyncio.Event()
        _on_signals(stopping.set)
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait([running, stop], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        await server.aclose()
        try:
            await running
        except Exception as exc:
            print(f"myna worker: {exc}", file=sys.stderr)
            return 1
        return 0
    finally:
        await engine.close()
