"""``myna room`` (join one room), ``myna worker`` (serve the rooms LiveKit dispatches) and
``myna talk`` (a participant that speaks through Myna there and records its voice).

All take the server's WebSocket URL; the API key and secret come from ``LIVEKIT_API_KEY`` and
``LIVEKIT_API_SECRET`` (``myna room`` and ``myna talk`` may take a ready ``--token`` instead).
LiveKit's development keys (``livekit-server --dev``: ``devkey`` / ``secret``) are shorter than
HS256 wants: one log line says so (:func:`myna.access.short_secret_notice`). ``myna room`` and
``myna worker`` take the same
engine flags as ``myna serve`` (:func:`myna.engines.build.add_engine_arguments`: DSM, fallback,
the phrase cache) and its session flags (:func:`myna.sessions.add_session_arguments`: turn
limits, message rate, start budget, drain).

Drain: on SIGTERM or SIGINT, sessions refuse new turns and the turns speaking finish, up to
``--drain-timeout``, then Myna leaves (``myna worker`` first tells the server it drains, so new
dispatches go to other workers). A second signal exits at once.

One Myna per room: ``myna room`` into a room another Myna serves steps aside (prints so, exits 0).

Exit status: ``myna room`` returns 0 when it is stopped (Ctrl-C, SIGTERM) or the room ends
(closed, deleted, Myna removed) and 1 when the join is refused (bad or expired token, no
server) or the connection is lost. ``myna worker`` returns 0 when stopped and 1 when it cannot
reach the server after its retries.

When people leave: ``myna room`` stays while the room lives; LiveKit closes a room its
``departure_timeout`` (20 s by default) after the last participant other than agents left, and
``myna room`` then exits 0 (one log line says so when the room empties). ``myna worker``'s Myna
leaves each room ``--departure-timeout`` seconds after it emptied and the worker keeps serving.
``myna talk`` leaves as soon as its turns are spoken.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import re
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import NoReturn

import numpy as np

from myna.access import short_secret_notice
from myna.engines.build import EngineOptions, add_engine_arguments, build_engines
from myna.extras import require
from myna.limits import measure_capacity
from myna.messages import TurnDefaults
from myna.sessions import Sessions, add_session_arguments, limits_from_args

#: Seconds a worker's Myna stays in an emptied room (kept equal to myna.room.agent's, which
#: cannot be imported before the livekit extra is known to be there).
DEPARTURE_TIMEOUT = 20.0
#: Room endings that are not failures (the room's life ended, or Myna was asked to leave).
_NORMAL_ENDS = {"CLIENT_INITIATED", "ROOM_DELETED", "ROOM_CLOSED", "PARTICIPANT_REMOVED"}


def add_parsers(sub) -> None:
    """Register ``room`` and ``worker`` on the ``myna`` sub-command parser."""
    p = sub.add_parser("room", help="join one LiveKit room as a voice bot",
                       description="Join a LiveKit room and speak what participants stream to Myna "
                                   "(docs/livekit.md).")
    p.add_argument("--url", required=True, help="the LiveKit server's WebSocket URL, e.g. ws://127.0.0.1:7880")
    p.add_argument("--room", required=True, type=_room_name, help="room name")
    p.add_argument("--identity", default="myna", help="Myna's participant identity (default: %(default)s)")
    p.add_argument("--token", help="a join token (default: minted from LIVEKIT_API_KEY and LIVEKIT_API_SECRET)")
    _add_common(p)
    p.set_defaults(func=_room)

    p = sub.add_parser("worker", help="register with LiveKit and serve the rooms it dispatches",
                       description="Register with a LiveKit server for agent dispatch; join each room this "
                                   "worker is dispatched to (up to --capacity rooms), until no one but agents "
                                   "has been in it for --departure-timeout seconds.")
    p.add_argument("--url", required=True, help="the LiveKit server's WebSocket URL, e.g. ws://127.0.0.1:7880")
    p.add_argument("--agent-name", default="myna", help="agent name to register (default: %(default)s)")
    p.add_argument("--capacity", type=int, default=None,
                   help="rooms this worker takes at once; job requests beyond them are refused and go to another "
                        "worker (default: the default engine's capacity, measured at start-up as for "
                        "`myna serve --max-sessions`)")
    p.add_argument("--departure-timeout", type=float, default=DEPARTURE_TIMEOUT, metavar="S",
                   help="seconds Myna stays in a room after the last participant other than agents left, for "
                        "someone to come back (a page reload) (default: %(default)s)")
    p.add_argument("--http-port", type=int, default=0, help="health endpoint port on 127.0.0.1 (default: any free port)")
    p.add_argument("--max-retry", type=int, default=16, help="attempts to reach the server before exiting (default: %(default)s)")
    _add_common(p)
    p.set_defaults(func=_worker)

    p = sub.add_parser("talk", help="speak through Myna in a LiveKit room and record its voice",
                       description="Join a LiveKit room as a participant, stream each TEXT to Myna there as one turn "
                                   "(topic myna.text, in token-sized chunks as an LLM writes them), record Myna's "
                                   "audio track to a WAV file and print the time to first audio. Myna must be in the "
                                   "room (`myna room`) or be dispatched to it: --dispatch AGENT_NAME asks the server "
                                   "to dispatch a running `myna worker` first. Leaves once the turns are spoken. "
                                   "Exits 2 on bad input (nothing to speak, an unwritable file, a bad --wait or "
                                   "--token-rate, --identity set to Myna's), 1 when the join or the dispatch is "
                                   "refused, no Myna comes, Myna leaves, a turn brings no audio, or the file cannot "
                                   "be written; 130/143 when interrupted (SIGINT/SIGTERM).")
    p.add_argument("text", nargs="+", help="what to say (each argument is one turn)")
    p.add_argument("--url", required=True, help="the LiveKit server's WebSocket URL, e.g. ws://127.0.0.1:7880")
    p.add_argument("--room", required=True, type=_room_name, help="room name")
    p.add_argument("--identity", default=None, help="your participant identity (default: talk- and a random suffix)")
    p.add_argument("--token", help="a join token (default: minted from LIVEKIT_API_KEY and LIVEKIT_API_SECRET)")
    p.add_argument("--dispatch", metavar="AGENT_NAME",
                   help="first dispatch this agent (a `myna worker`'s --agent-name, `myna` by default) to the "
                        "room through the server's API (needs LIVEKIT_API_KEY and LIVEKIT_API_SECRET)")
    p.add_argument("--myna", metavar="IDENTITY", help="Myna's identity in the room (default: the Myna that is there)")
    p.add_argument("-o", "--output", type=Path, default=Path("talk.wav"), help="WAV file to write (default: %(default)s)")
    p.add_argument("--token-rate", type=float, default=30.0,
                   help="tokens per second, like an LLM (0: all at once; default: %(default)s)")
    p.add_argument("--wait", type=float, default=30.0, metavar="S",
                   help="seconds to wait for the join and for Myna to be ready in the room (default: %(default)s)")
    p.add_argument("--trim", action=argparse.BooleanOptionalAction, default=True,
                   help="start each turn's audio at its first audible sample (default); --no-trim keeps it from "
                        "the first text chunk sent, TTFA silence included")
    p.set_defaults(func=_talk)


def _room_name(value: str) -> str:
    """``--room``'s value: a name (an empty one would fail in the SDK with a traceback)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("must name a room (it is empty)")
    return value


def _add_common(p) -> None:
    p.add_argument("--speak-for", nargs="+", metavar="IDENTITY",
                   help="only these participants may speak through Myna (default: everyone)")
    add_engine_arguments(p)
    add_session_arguments(p)


def _credentials(command: str = "room") -> tuple[str, str]:
    key, secret = os.environ.get("LIVEKIT_API_KEY"), os.environ.get("LIVEKIT_API_SECRET")
    if not key or not secret:
        hint = "; --dispatch needs them" if command == "talk" else ""
        raise SystemExit(f"myna: set LIVEKIT_API_KEY and LIVEKIT_API_SECRET (or pass --token to `myna {command}`{hint})")
    short_secret_notice(secret, "LIVEKIT_API_SECRET")
    return key, secret


async def _start_engines(args: argparse.Namespace):
    """The command's engines, started and their phrase cache filled (progress on stdout)."""
    engines = build_engines(EngineOptions.from_args(args))
    print(f"myna: loading {', '.join(engines)} ...", flush=True)
    t0 = time.monotonic()
    await engines.start()
    await engines.warm_up()
    print(f"myna: engines ready in {time.monotonic() - t0:.1f} s", flush=True)
    return engines


def _exit(code: int) -> NoReturn:
    """End the process with ``code`` once Myna has left its rooms, without finalising the
    interpreter (streams and logs flushed first). The LiveKit FFI's native threads call into
    Python (log records, events) until the process ends; the interpreter ends a thread that
    takes the GIL while it finalises with pthread_exit, which cannot unwind through the Rust
    thread's frames, and the process aborts (SIGABRT: exit −6 after a clean drain)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _sessions(args: argparse.Namespace) -> Sessions:
    sessions = Sessions(limits=limits_from_args(args), max_hold_s=args.max_hold_ms / 1000.0)
    sessions.metrics.set_limits(sessions.limits)
    return sessions


def _on_signals(first, name: str) -> None:
    """``first()`` on the first SIGINT/SIGTERM; a second one exits at once (128 + signal)."""
    loop = asyncio.get_running_loop()
    seen = False

    def on_signal(sig: signal.Signals) -> None:
        nonlocal seen
        if seen:
            print(f"{name}: {sig.name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + sig)
        seen = True
        first()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)


async def _drain(sessions: Sessions, timeout: float, then) -> None:
    """Drain ``sessions`` (up to ``timeout`` s, saying so), then ``then()``."""
    print(f"myna: draining: {sessions.speaking()} session(s) speaking, up to {timeout:g} s "
          "(a second signal exits now)", flush=True)
    finished = await sessions.drain(timeout)
    print("myna: leaving" + ("" if finished else " (drain timed out)"), flush=True)
    then()


# -- room ---------------------------------------------------------------------------------
def _room(args: argparse.Namespace) -> NoReturn:
    require("livekit")
    _exit(asyncio.run(_run_room(args)))


async def _run_room(args: argparse.Namespace) -> int:
    from livekit import rtc

    from myna.room.agent import RoomAgent
    from myna.room.tokens import participant_token

    if args.token:
        token = args.token
    else:
        key, secret = _credentials()
        token = participant_token(key, secret, args.room, args.identity, agent=True)
    sessions = _sessions(args)
    engines = await _start_engines(args)
    try:
        room = rtc.Room()
        agent = RoomAgent(room, engines[engines.default], sessions, engines=list(engines),
                          defaults=TurnDefaults(voice=engines.voice_for(engines.default)),
                          speak_for=frozenset(args.speak_for) if args.speak_for else None)
        agent.attach()
        try:
            await room.connect(args.url, token, rtc.RoomOptions(auto_subscribe=False, connect_timeout=10.0))
        except rtc.ConnectError as exc:
            print(f"myna room: could not join {args.room!r} at {args.url}: {exc}", file=sys.stderr)
            return 1
        await agent.start()
        if agent.stepped_aside is not None:
            print(f"myna: {agent.stepped_aside!r} serves room {args.room!r} already; stepping aside", flush=True)
            await agent.run()
            return 0
        draining: list[asyncio.Task] = []
        _on_signals(lambda: draining.append(asyncio.ensure_future(_drain(sessions, args.drain_timeout, agent.stop))),
                    "myna room")
        print(f"myna: in room {args.room!r} as {room.local_participant.identity!r} (Ctrl-C leaves)", flush=True)
        await agent.run()
        await asyncio.gather(*draining, return_exceptions=True)
    finally:
        await engines.close()
    reason = rtc.DisconnectReason.Name(agent.disconnect_reason) if agent.disconnect_reason is not None else "CLIENT_INITIATED"
    print(f"myna: left room {args.room!r} ({reason})", flush=True)
    return 0 if reason in _NORMAL_ENDS else 1


# -- worker -------------------------------------------------------------------------------
def _worker(args: argparse.Namespace) -> NoReturn:
    require("livekit")
    _exit(asyncio.run(_run_worker(args)))


async def _run_worker(args: argparse.Namespace) -> int:
    from myna.room.worker import RoomWorker, agent_server

    key, secret = _credentials()
    sessions = _sessions(args)
    engines = await _start_engines(args)
    try:
        capacity = args.capacity
        if capacity is None:
            capacity = await measure_capacity(engines[engines.default])
            print(f"myna: capacity of {engines.default} on this host: {capacity} rooms (measured)", flush=True)
        worker = RoomWorker(engines, capacity=capacity, sessions=sessions,
                            speak_for=frozenset(args.speak_for) if args.speak_for else None,
                            departure_timeout=args.departure_timeout)
        server = agent_server(worker, args.url, key, secret, agent_name=args.agent_name, http_port=args.http_port,
                              max_retry=args.max_retry, drain_timeout=args.drain_timeout)
        server.on("worker_registered", lambda worker_id, _info: print(
            f"myna: worker {worker_id} registered as agent {args.agent_name!r} at {args.url} "
            f"(capacity {capacity} rooms)", flush=True))
        running = asyncio.ensure_future(server.run())
        stopping = asyncio.Event()
        _on_signals(stopping.set, "myna worker")
        stop = asyncio.ensure_future(stopping.wait())
        await asyncio.wait([running, stop], return_when=asyncio.FIRST_COMPLETED)
        if stopping.is_set() and not running.done():
            print(f"myna: draining: {sessions.speaking()} session(s) speaking in {worker.accepted} room(s), up to "
                  f"{args.drain_timeout:g} s; new dispatches go to other workers (a second signal exits now)", flush=True)
            t0 = time.monotonic()
            finished = await worker.drain(server, args.drain_timeout)
            print(f"myna: drained: every turn finished in {time.monotonic() - t0:.1f} s; shutting down" if finished else
                  f"myna: drain timed out after {args.drain_timeout:g} s: turns still speaking are cut; shutting down",
                  flush=True)
        stop.cancel()
        await server.aclose()
        try:
            await running
        except Exception as exc:
            print(f"myna worker: {exc}", file=sys.stderr)
            return 1
        return 0
    finally:
        await engines.close()


# -- talk ---------------------------------------------------------------------------------
#: Samples kept before the first audible one when trimming (10 ms at 48 kHz), as `myna say` does.
_TRIM_MARGIN = 480


def _talk(args: argparse.Namespace) -> NoReturn:
    problem = _talk_input_error(args)
    if problem is not None:
        print(f"myna talk: {problem}", file=sys.stderr)
        _exit(2)
    require("livekit")
    if getattr(args, "log_level", "info") != "debug":
        logging.getLogger("livekit").setLevel(logging.ERROR)  # the SDK's INFO/WARNING lines (--log-level debug shows them)
    _exit(asyncio.run(_run_talk(args)))


def _talk_input_error(args: argparse.Namespace) -> str | None:
    """What is wrong with ``myna talk``'s options (None: nothing), before anything is joined."""
    if not (math.isfinite(args.wait) and args.wait >= 0):
        return f"--wait must be a number of seconds, 0 or more (not {args.wait:g})"
    if not (math.isfinite(args.token_rate) and args.token_rate >= 0):
        return f"--token-rate must be a number of tokens per second, 0 or more (not {args.token_rate:g})"
    if args.identity is not None and args.identity == (args.myna or "myna"):
        return (f"--identity {args.identity!r} is Myna's identity in the room: joining as it would push Myna out "
                "(pick another, or leave it out)")
    return None


def _short_tokens(message: str) -> str:
    """``message`` with any JWT in it cut to its first characters (an error must not print the token)."""
    return re.sub(r"eyJ[\w-]+\.[\w-]+\.[\w-]*", lambda m: m.group(0)[:12] + "...", message)


def _error_lines(n: int, events: list[dict]) -> list[str]:
    """One line per distinct error event of turn ``n``, repeats counted (not one line each)."""
    counts: dict[tuple[str, str], int] = {}
    for event in events:
        if event["type"] == "error":
            key = (event.get("code", ""), event.get("message", ""))
            counts[key] = counts.get(key, 0) + 1
    return [f"myna talk: turn {n}: error {code}: {message}" + (f" ({count} times)" if count > 1 else "")
            for (code, message), count in counts.items()]


async def _run_talk(args: argparse.Namespace) -> int:
    """Exit status: 0, 1 (refused, no Myna, Myna left, a turn failed, the file unwritten), 2 (bad
    input), 128 + the signal when interrupted (SIGINT 130, SIGTERM 143: the room left, what was
    recorded written)."""
    from livekit import api, rtc

    from myna.audio.onset import first_audible_sample
    from myna.audio.playout import SAMPLE_RATE
    from myna.audio.wavfile import unwritable, write_wav
    from myna.room.client import JoinTimeout, MynaLeft, RoomClient
    from myna.room.tokens import participant_token
    from myna.text.symbols import normalise

    empty = next((text for text in args.text if not normalise(text)), None)
    if empty is not None:
        print(f"myna talk: nothing to speak in {empty!r}: the text has no letters or digits", file=sys.stderr)
        return 2
    problem = unwritable(args.output)  # before joining, not after the turns
    if problem is not None:
        print(f"myna talk: cannot write {args.output}: {problem}", file=sys.stderr)
        return 2
    identity = args.identity or f"talk-{uuid.uuid4().hex[:6]}"

    # Ctrl-C / SIGTERM: cancel this task, leave the room, write what was recorded, exit 128 + signal.
    loop, main = asyncio.get_running_loop(), asyncio.current_task()
    caught: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if caught:
            os._exit(128 + sig)
        caught.append(sig)
        main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    def interrupted() -> int:
        while main.uncancel():
            pass
        print("myna talk: interrupted", file=sys.stderr, flush=True)
        return 128 + caught[0]

    client, pieces, failed = None, [], False
    try:
        if args.token and not args.dispatch:
            token = args.token
        else:
            key, secret = _credentials("talk")
            token = args.token or participant_token(key, secret, args.room, identity)
        if args.dispatch:
            try:
                async with api.LiveKitAPI(args.url, key, secret) as lk:
                    dispatch = await asyncio.wait_for(lk.agent_dispatch.create_dispatch(
                        api.CreateAgentDispatchRequest(agent_name=args.dispatch, room=args.room)), max(1.0, args.wait))
            except (asyncio.CancelledError, KeyboardInterrupt):
                raise
            except Exception as exc:  # TwirpError, aiohttp's errors, a bad URL: one line, not a traceback
                print(f"myna talk: could not dispatch agent {args.dispatch!r} to room {args.room!r} at {args.url}: "
                      f"{str(exc) or type(exc).__name__}", file=sys.stderr)
                return 1
            print(f"myna talk: dispatched agent {args.dispatch!r} to room {args.room!r} ({dispatch.id}); "
                  "a `myna worker` registered under that name joins it", flush=True)
        client = RoomClient(args.url, token, myna_identity=args.myna)
        try:
            await client.connect(timeout=args.wait)
        except rtc.ConnectError as exc:
            print(f"myna talk: could not join room {args.room!r} at {args.url}: {_short_tokens(str(exc))}",
                  file=sys.stderr)
            return 1
        except JoinTimeout:
            print(f"myna talk: could not join room {args.room!r} at {args.url}: no answer in {args.wait:g} s "
                  "(--wait)", file=sys.stderr)
            return 1
        except TimeoutError:
            print(f"myna talk: no Myna ready in room {args.room!r} after {args.wait:g} s: start one there "
                  f"(`myna room --url {args.url} --room {args.room}`), or dispatch a running `myna worker` "
                  "(--dispatch AGENT_NAME)", file=sys.stderr)
            return 1
        myna = client.myna()
        print(f"myna talk: in room {args.room!r} as {identity!r}; Myna is {myna.identity!r} "
              f"(engine {client.ready.get('engine')})", flush=True)
        for n, text in enumerate(args.text, 1):
            try:
                result = await client.speak(text, tokens_per_s=args.token_rate or None)
            except MynaLeft:
                failed = True
                print(f"myna talk: turn {n}: Myna left the room", file=sys.stderr, flush=True)
                break
            for line in _error_lines(n, result.events):
                failed = True
                print(line, file=sys.stderr)
            onset = first_audible_sample(result.pcm, SAMPLE_RATE)
            if onset is None:
                failed = True
                print(f"myna talk: turn {n}: no audible audio came back", file=sys.stderr)
                continue
            pcm = result.pcm[max(0, onset - _TRIM_MARGIN):] if args.trim else result.pcm
            pieces.append(pcm)
            print(f"turn {n}: {len(pcm) / SAMPLE_RATE:.2f} s of audio; server TTFA {_ms(result.server_ttfa_ms)}, "
                  f"perceived TTFA {_ms(result.perceived_ttfa_ms)} (first text chunk sent to first audible sample "
                  "received)", flush=True)
        status = 1 if failed or not pieces else 0
    except asyncio.CancelledError:
        if not caught:
            raise
        status = interrupted()
    finally:
        if client is not None and hasattr(client, "room"):
            try:
                await client.close()
            except asyncio.CancelledError:
                if not caught:
                    raise
                while main.uncancel():
                    pass
            except Exception:  # leaving a room that failed to join, or a timed-out disconnect
                pass
    if pieces:
        pcm = np.concatenate(pieces)
        try:
            write_wav(args.output, pcm, SAMPLE_RATE)
        except OSError as exc:
            print(f"myna talk: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
            return status if caught else 1
        print(f"wrote {args.output} ({len(pcm) / SAMPLE_RATE:.2f} s at {SAMPLE_RATE} Hz)", flush=True)
    return status


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"
