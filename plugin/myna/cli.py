"""The ``myna`` command line: ``serve``, ``say``, ``token`` and ``bench``."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np

import myna
from myna.access import short_secret_notice
from myna.audio.turns import to_s16
from myna.audio.wavfile import unwritable, write_wav
from myna.extras import MissingExtra, extra_for

log = logging.getLogger("myna")

DEFAULT_PORT = 8080


# -- serve --------------------------------------------------------------------------------
def _add_serve(sub) -> None:
    from myna.engines.build import SERVE_ENGINES, add_engine_arguments
    from myna.sessions import add_session_arguments

    p = sub.add_parser("serve", help="run the WebRTC worker and its web page",
                       description="Run the worker: WebRTC signaling, the latency page, the streaming WebSocket, "
                                   "/healthz and /metrics.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s; a loopback address also turns on loopback ICE candidates; "
                        "any other needs --api-key/--api-secret or --insecure)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help="TCP port, 1-65535 (default: %(default)s)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="opt-in STUN/TURN server URL (repeatable); none by default, so nothing leaves the host")
    p.add_argument("--ice-loopback", action="store_true", help="offer 127.0.0.1 as an ICE candidate even when binding elsewhere")
    p.add_argument("--peer-timeout", type=float, default=30.0,
                   help="seconds without any answer to ICE consent checks before a peer is dropped "
                        "(RFC 7675; default: %(default)s)")
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds a new peer may take to connect (default: %(default)s)")
    p.add_argument("--ws-heartbeat", type=float, default=10.0,
                   help="seconds between pings on /v1/tts/stream; a client that has not answered within half of "
                        "it is dropped and its session freed (0: none; default: %(default)s)")
    p.add_argument("--livekit-url", metavar="WS_URL", help="add the page's \"via LiveKit room\" lane through this LiveKit "
                                                           "server (LIVEKIT_API_KEY and LIVEKIT_API_SECRET from the environment)")
    p.add_argument("--no-pipecat-lane", dest="pipecat_lane", action="store_false",
                   help="leave out the page's Pipecat lanes (Pipecat's own SmallWebRTC + PiperTTSService in a child "
                        "process started on the page's first offer; offered where pipecat-ai[piper] is installed)")
    add_engine_arguments(p, engines=SERVE_ENGINES)
    g = p.add_argument_group("access (tokens)")
    g.add_argument("--api-key", default=os.environ.get("MYNA_API_KEY"),
                   help="API key: with --api-secret, offers and the WebSocket need an access token (env MYNA_API_KEY)")
    g.add_argument("--api-secret", default=os.environ.get("MYNA_API_SECRET"), help="API secret (env MYNA_API_SECRET)")
    g.add_argument("--insecure", action="store_true", help="allow binding a non-loopback address without keys")
    add_session_arguments(p, admission=True)
    p.set_defaults(func=_serve)


def _port(text: str) -> int:
    """argparse type of a TCP port to listen on."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is a number from 1 to 65535, not {text!r}")
    return port


def _serve(args: argparse.Namespace) -> int:
    from myna.engines.build import EngineOptions, build_engines
    from myna.rtc.ice import enable_loopback_candidates, is_loopback_host, set_peer_timeout
    from myna.server.app import Worker, create_app
    from myna.server.auth import Authenticator
    from myna.server.pipecat_lane import add_pipecat_lane
    from myna.server.room_lane import add_room_lane
    from myna.sessions import limits_from_args

    keys = (args.api_key, args.api_secret)
    if any(keys) and not all(keys):
        raise SystemExit("myna serve: --api-key and --api-secret go together (or MYNA_API_KEY and MYNA_API_SECRET)")
    if not all(keys) and not is_loopback_host(args.host) and not args.insecure:
        raise SystemExit(f"myna serve: refusing to listen on {args.host} without access keys: anyone who can reach it "
                         "could use it. Set --api-key/--api-secret (mint tokens with `myna token`), or pass --insecure.")
    short_secret_notice(args.api_secret, "the API secret (--api-secret, MYNA_API_SECRET)")
    engines = build_engines(EngineOptions.from_args(args))
    loopback = args.ice_loopback or is_loopback_host(args.host)
    if loopback:
        enable_loopback_candidates()
    set_peer_timeout(args.peer_timeout)
    worker = Worker(engines=engines, ice_servers=args.ice_server, connect_timeout=args.connect_timeout,
                    ws_heartbeat=args.ws_heartbeat,
                    max_hold_ms=args.max_hold_ms, limits=limits_from_args(args),
                    auth=Authenticator(*keys) if all(keys) else None, measure_capacity=args.max_sessions is None)
    app = create_app(worker)
    add_room_lane(app, worker, args.livekit_url)  # POST /api/room, GET /vendor/livekit-client.mjs
    if args.pipecat_lane:
        add_pipecat_lane(app, worker, loopback)  # GET /api/pipecat, POST /api/pipecat/offer
    return asyncio.run(run_server(app, worker, args.host, args.port, drain_timeout=args.drain_timeout))


async def run_server(app, worker, host: str, port: int, drain_timeout: float = 0.0) -> int:
    """Serve ``app`` (of ``worker``, a :class:`myna.server.app.Worker`) until SIGINT/SIGTERM,
    then drain (up to ``drain_timeout`` s) and exit 0; a second signal exits at once."""
    from aiohttp import web

    from myna.server.app import AccessLogger

    runner = web.AppRunner(app, handle_signals=False, access_log_class=AccessLogger)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            print(f"myna: {sig.name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await web.TCPSite(runner, host, port).start()
        shown = f"[{host}]" if ":" in host else host
        print(f"myna {myna.__version__}: loading {', '.join(worker.engines)} on http://{shown}:{port}/ ...", flush=True)
        t0 = time.monotonic()
        await worker.loading
        capacity = f", at most {worker.limits.max_sessions} sessions" if worker.limits.max_sessions else ""
        print(f"myna: ready in {time.monotonic() - t0:.1f} s{capacity}: open http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
        await stop.wait()
        busy = worker.sessions.speaking()
        print(f"myna: draining: {busy} session(s) speaking, up to {drain_timeout:g} s (a second signal exits now)", flush=True)
        finished = await worker.drain(drain_timeout)
        print("myna: shutting down" + ("" if finished else " (drain timed out)"), flush=True)
        return 0
    except OSError as exc:
        print(f"myna: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        log.debug("start-up failed", exc_info=True)
        print(f"myna: start-up failed: {exc} (--log-level debug shows where)", file=sys.stderr)
        return 1
    finally:
        await runner.cleanup()


# -- say ----------------------------------------------------------------------------------
def _add_say(sub) -> None:
    from myna.engines.build import add_engine_arguments

    p = sub.add_parser("say", help="speak text to a WAV file, locally or through a running worker",
                       description="Synthesise TEXT to a WAV file. With --server, stream it over WebRTC to a "
                                   "running worker as token-sized chunks and record what comes back. "
                                   "Exits 2 on bad input (nothing to speak, a bad URL, an unwritable file), "
                                   "1 when the worker or the synthesis fails.")
    p.add_argument("text", help="what to say")
    p.add_argument("-o", "--output", type=Path, default=Path("myna.wav"), help="WAV file to write (default: %(default)s)")
    p.add_argument("--server", metavar="URL", help="a running worker's base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--token", default=None, help="access token for a worker with keys (default: env MYNA_TOKEN, "
                                                 "else one minted from MYNA_API_KEY and MYNA_API_SECRET)")
    p.add_argument("--token-rate", type=float, default=30.0,
                   help="tokens per second when streaming to a worker, like an LLM (0: all at once; default: %(default)s)")
    p.add_argument("--speed", type=_speed, default=None, metavar="X",
                   help="pace, 0.5 to 2.0 times the voice's own (default: 1.0); an engine that speaks at its own "
                        "pace (dsm) refuses any other (unsupported_speed)")
    p.add_argument("--trim", action=argparse.BooleanOptionalAction, default=True,
                   help="with --server, start the file at the first audible sample, for listening (default); "
                        "--no-trim keeps the recording from the first text chunk sent, TTFA silence included, for measuring")
    # Locally the engine flags build the engine as `myna serve` would (--engine: piper by default;
    # no phrase cache, one turn has nothing to gain from it); with --server, --engine and --voice
    # choose among the worker's (default: its default).
    add_engine_arguments(p, engines=None, phrase_cache_mb=0.0, engines_help="piper locally, the worker's default remotely")
    p.set_defaults(func=_say)


def _speed(text: str) -> float:
    """``--speed``: a number from 0.5 to 2.0 (argparse turns the error into a usage line)."""
    from myna.engines.base import EngineError, check_speed

    try:
        return check_speed(float(text))
    except (ValueError, EngineError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number from 0.5 to 2.0") from None


class _SayError(Exception):
    """Bad input to ``myna say``: one line for the user, exit status 2."""


def _say(args: argparse.Namespace) -> int:
    from myna.text.symbols import normalise

    try:
        if not normalise(args.text):
            raise _SayError(f"nothing to speak in {args.text!r}: the text has no letters or digits")
        _check_writable(args.output)
        if args.server:
            return asyncio.run(_say_remote(args, _server_url(args.server)))
        return asyncio.run(_say_local(args))
    except _SayError as exc:
        print(f"myna say: {exc}", file=sys.stderr)
        return 2


def _server_url(text: str) -> str:
    """The worker's base URL from ``--server``, checked before anything is sent.

    Raises:
        _SayError: not an http(s) URL with a host, or a port out of range.
    """
    from urllib.parse import urlsplit

    url = urlsplit(text.strip())
    try:
        url.port  # noqa: B018 (raises ValueError when out of range)
    except ValueError:
        raise _SayError(f"--server {text!r}: the port must be a number from 1 to 65535") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise _SayError(f"--server {text!r} is not a worker URL: give it with its scheme, e.g. http://127.0.0.1:8080")
    return text.strip().rstrip("/")


def _check_writable(path: Path) -> None:
    """Fail before synthesis, not after it, when the WAV file cannot be written.

    Raises:
        _SayError: the path is a folder, its folder is missing, or opening it for writing fails.
    """
    problem = unwritable(path)
    if problem is not None:
        raise _SayError(f"cannot write {path}: {problem}")


async def _say_remote(args: argparse.Namespace, url: str) -> int:
    from myna.audio.onset import first_audible_sample
    from myna.rtc.client import MynaClient, wait_until_ready

    try:
        await wait_until_ready(url, timeout=60.0, starting=False)
        async with MynaClient(url, engine=args.engines, voice=args.voice, token=args.token) as client:
            result = await client.speak(args.text, tokens_per_s=args.token_rate or None, speed=args.speed)
    except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
        print(f"myna say: {str(exc) or type(exc).__name__}", file=sys.stderr)
        return 1
    errors = [event for event in result.events if event["type"] == "error"]
    for event in errors:
        print(f"error {event['code']}: {event['message']}", file=sys.stderr)
    onset = first_audible_sample(result.pcm, 48_000)
    if onset is None:
        print("myna say: the worker sent no audible audio", file=sys.stderr)
        return 1
    pcm = result.pcm[max(0, onset - _TRIM_MARGIN) :] if args.trim else result.pcm
    _write_wav(args.output, pcm, 48_000)
    trimmed = f", {max(0, onset - _TRIM_MARGIN) / 48:.0f} ms of silence before the first sound left out" if args.trim else ""
    print(f"wrote {args.output} ({len(pcm) / 48000:.2f} s at 48000 Hz{trimmed})")
    print(f"server TTFA: {_ms(result.server_ttfa_ms)}   perceived TTFA: {_ms(result.perceived_ttfa_ms)}")
    return 1 if errors else 0


#: Samples kept before the first audible one when trimming (10 ms at 48 kHz): the onset
#: detector fires on a 10 ms window, so the attack of the first sound stays whole.
_TRIM_MARGIN = 480


async def _say_local(args: argparse.Namespace) -> int:
    """Synthesise the text as fast as the engine can (no session: nobody listens in real time),
    on engines built as ``myna serve`` builds them."""
    from myna.engines import AudioChunk, EngineError, ErrorEvent
    from myna.engines.build import EngineOptions, build_engines

    options = EngineOptions.from_args(args)
    options.engines = options.engines or "piper"
    engines = build_engines(options)
    engine = engines[engines.default]
    print(f"loading {engine.name} ...", flush=True)
    try:
        await engines.start()
        await engines.warm_up()  # (only with --phrase-cache-mb: off by default for one turn)
        t0 = time.monotonic()
        stream = engine.stream(engines.voice_for(engine.name))
        if args.speed is not None and args.speed != 1.0:
            stream.set_speed(args.speed)
        stream.push_text(args.text)
        stream.end_input()
        pieces, first = [], None
        async for item in stream:
            if isinstance(item, AudioChunk):
                first = first if first is not None else time.monotonic() - t0
                pieces.append(item.pcm)
            elif isinstance(item, ErrorEvent):
                print(f"myna say: {item.code}: {item.message}", file=sys.stderr)
        total = time.monotonic() - t0
    except EngineError as exc:
        print(f"myna say: {exc.message}", file=sys.stderr)
        return 1
    finally:
        await engines.close()
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    _write_wav(args.output, to_s16(pcm), engine.sample_rate)
    seconds = len(pcm) / engine.sample_rate
    print(f"wrote {args.output} ({seconds:.2f} s at {engine.sample_rate} Hz)")
    print(f"first audio after {_ms(first and first * 1000)}, whole reply in {total * 1000:.0f} ms (RTF {total / max(seconds, 1e-9):.3f})")
    return 0


def _write_wav(path: Path, pcm: np.ndarray, sample_rate: int) -> None:
    try:
        write_wav(path, pcm, sample_rate)
    except OSError as exc:
        raise _SayError(f"cannot write {path}: {exc.strerror or exc}") from None


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


# -- token --------------------------------------------------------------------------------
def _add_token(sub) -> None:
    p = sub.add_parser("token", help="mint an access token for a worker that has keys",
                       description="Print an access token (a LiveKit-style HS256 JWT) for a worker started with "
                                   "--api-key/--api-secret. Clients send it as 'Authorization: Bearer TOKEN'.")
    p.add_argument("--identity", required=True, help="who the token is for (owner of its sessions)")
    p.add_argument("--ttl", default="1h", type=_duration, help="lifetime: 90s, 30m, 1h, 7d (default: %(default)s)")
    p.add_argument("--engines", default=None, help="engines the token may use, comma-separated (default: any)")
    p.add_argument("--max-sessions", type=int, default=None, help="sessions the identity may hold at once (default: the worker's cap)")
    p.add_argument("--api-key", default=os.environ.get("MYNA_API_KEY"), help="API key (env MYNA_API_KEY)")
    p.add_argument("--api-secret", default=os.environ.get("MYNA_API_SECRET"), help="API secret (env MYNA_API_SECRET)")
    p.set_defaults(func=_token)


def _duration(text: str) -> datetime.timedelta:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 30m, 1h, 7d)")
    unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    return datetime.timedelta(seconds=float(match.group(1)) * unit)


def _token(args: argparse.Namespace) -> int:
    from myna.server.auth import mint_token

    if not (args.api_key and args.api_secret):
        print("myna token: needs --api-key and --api-secret (or MYNA_API_KEY and MYNA_API_SECRET)", file=sys.stderr)
        return 2
    short_secret_notice(args.api_secret, "the API secret (--api-secret, MYNA_API_SECRET)")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else None
    print(mint_token(args.api_key, args.api_secret, args.identity, args.ttl, engines, args.max_sessions))
    return 0


# -- bench --------------------------------------------------------------------------------
def _add_bench(sub, full: bool) -> None:
    """``myna bench``; its benchmarks (tooling, :mod:`myna.bench`) are imported only when the
    command is ``bench`` (``full``), so no other command loads them."""
    p = sub.add_parser("bench", help="benchmarks (print a table, --json writes the figures)")
    if full:
        from myna.bench import add_parsers

        add_parsers(p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK"))


def _add_global_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """``--log-level`` and ``--log-format``; on a sub-command they default to unset, so the
    top-level value stands unless the option is given after the sub-command."""
    parser.add_argument("--log-level", default="info" if top else argparse.SUPPRESS,
                        choices=["debug", "info", "warning", "error"], help="log verbosity (default: info)")
    parser.add_argument("--log-format", default="text" if top else argparse.SUPPRESS, choices=["text", "json"],
                        help="log lines as text or as one JSON object each, for log shippers (default: text)")


class _CommandParser(argparse.ArgumentParser):
    """A sub-command's parser: it takes the global options too, so ``myna serve --log-level
    warning`` works like ``myna --log-level warning serve`` (nested sub-commands inherit it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _add_global_options(self, top=False)


class _Version(argparse.Action):
    """``--version``: prints ``myna VERSION`` from the installed package's metadata
    (pyproject.toml's ``version``), read only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"myna {myna.__version__}")
        parser.exit()


#: The sub-commands, in the order ``myna --help`` lists them.
COMMANDS = ("serve", "say", "token", "bench", "room", "worker", "talk")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The ``myna`` parser for the command line ``argv`` (the benchmarks are registered only for
    ``myna bench``)."""
    parser = argparse.ArgumentParser(prog="myna", description="Myna: real-time speech for voice agents.")
    parser.add_argument("--version", action=_Version, help="show the version (the installed package's) and exit")
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    _add_serve(sub)
    _add_say(sub)
    _add_token(sub)
    _add_bench(sub, full=next((a for a in argv if a in COMMANDS), None) == "bench")
    from myna.room.cli import add_parsers as add_room_parsers  # `myna room`, `myna worker`, `myna talk`

    add_room_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from myna.engines.build import EngineOptionsError

    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    _configure_logging(args.log_level, args.log_format)
    if args.log_level != "debug":
        logging.getLogger("aioice").setLevel(logging.WARNING)  # one INFO line per ICE check
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request (fetching a Piper voice)
    try:
        return args.func(args) or 0
    except EngineOptionsError as exc:
        print(f"myna {args.command}: {exc}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        extra = exc.extra if isinstance(exc, MissingExtra) else extra_for(exc.name)
        if extra is None:
            raise
        print(f"myna: {exc if isinstance(exc, MissingExtra) else MissingExtra(extra, exc.name)}", file=sys.stderr)
        return 1


def _configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s",
                                           rename_fields={"asctime": "time", "levelname": "level", "name": "logger"}))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


if __name__ == "__main__":
    sys.exit(main())
