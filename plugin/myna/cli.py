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
import wave
from pathlib import Path

import numpy as np

from myna import __version__
from myna.extras import MissingExtra, extra_for, require

log = logging.getLogger("myna")

DEFAULT_PORT = 8080


DEFAULT_ENGINES = "piper,piper-sentence,piper-whole"


def _engines(names: str, dsm: dict | None = None) -> dict:
    """Engines by name; ``dsm`` holds the DSM engine's options (see :func:`_dsm_options`)."""
    from myna.engines import ENGINE_NAMES
    from myna.engines.piper import VARIANT_NAMES, PiperEngine

    engines = {}
    piper = None  # the Piper variants share one loaded voice and its threads
    for name in (n.strip() for n in names.split(",") if n.strip()):
        if name not in ENGINE_NAMES:
            raise SystemExit(f"myna: unknown engine {name!r} (available: {', '.join(ENGINE_NAMES)})")
        if name in VARIANT_NAMES:
            piper = piper or PiperEngine()
            engines[name] = piper if name == "piper" else piper.variant(name, VARIANT_NAMES[name])
        elif name == "dsm":
            require("dsm")  # before anything loads; main() turns it into one line saying what to install
            from myna.engines.dsm import DSMEngine

            if not (dsm or {}).get("checkpoint"):
                raise SystemExit("myna: the dsm engine needs --dsm-checkpoint PATH_OR_REPO")
            engines[name] = DSMEngine(**dsm)
    return engines


def _with_fallback(engines: dict, fallback: str, after_ms: float, stall_ms: float) -> dict:
    """``engines`` with every engine but ``fallback`` wrapped in a
    :class:`~myna.engines.fallback.FallbackEngine` in front of it."""
    from myna.engines.fallback import FallbackEngine

    return {name: engine if name == fallback else
            FallbackEngine(engine, engines[fallback], after_ms=after_ms, stall_ms=stall_ms)
            for name, engine in engines.items()}


def _add_dsm_options(p, voice: bool = True) -> None:
    g = p.add_argument_group("dsm engine")
    g.add_argument("--dsm-checkpoint", metavar="PATH_OR_REPO", help="DSM TTS checkpoint folder or Hugging Face repo id")
    if voice:
        g.add_argument("--voice", dest="dsm_voice", metavar="PATH", help="DSM voice file (.safetensors, speaker_wavs)")
    g.add_argument("--n-q", type=int, default=32, help="codebooks generated (default: %(default)s; clamped to the model's)")
    g.add_argument("--guidance", default=None, metavar="VALUE",
                   help="CFG-distilled guidance value, e.g. 2.0 (default: the model's)")


def _dsm_options(args: argparse.Namespace, voice: str | None = None) -> dict:
    return {"checkpoint": args.dsm_checkpoint, "voice": voice or getattr(args, "dsm_voice", None),
            "n_q": args.n_q, "guidance": args.guidance}


# -- serve --------------------------------------------------------------------------------
def _add_serve(sub) -> None:
    p = sub.add_parser("serve", help="run the WebRTC worker and its web page",
                       description="Run the worker: WebRTC signaling, the latency page, /healthz and /metrics.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s; a loopback address also turns on loopback ICE candidates; "
                        "any other needs --api-key/--api-secret or --insecure)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help="TCP port, 1-65535 (default: %(default)s)")
    p.add_argument("--engine", default=DEFAULT_ENGINES,
                   help="engines to load, comma-separated; the first is the default (default: %(default)s; "
                        "the piper-* strategies share one loaded voice)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="opt-in STUN/TURN server URL (repeatable); none by default, so nothing leaves the host")
    p.add_argument("--ice-loopback", action="store_true", help="offer 127.0.0.1 as an ICE candidate even when binding elsewhere")
    p.add_argument("--peer-timeout", type=float, default=30.0,
                   help="seconds without any answer to ICE consent checks before a peer is dropped "
                        "(RFC 7675; default: %(default)s)")
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds a new peer may take to connect (default: %(default)s)")
    p.add_argument("--max-hold-ms", type=_non_negative_ms, default=100.0, metavar="MS",
                   help="the longest a turn's ready first audio may be held before it plays (default: %(default)s; "
                        "reported as first_audio.pre_roll_ms)")
    _add_phrase_cache_options(p)
    g = p.add_argument_group("fallback")
    from myna.engines import ENGINE_NAMES

    g.add_argument("--fallback", metavar="ENGINE", choices=ENGINE_NAMES,
                   help="every other loaded engine falls back to ENGINE (loaded too if not in --engine) when it "
                        "fails, starts late or stalls mid-turn; the rest of the turn is spoken by ENGINE")
    g.add_argument("--fallback-after-ms", type=_non_negative_ms, default=500.0, metavar="MS",
                   help="switch when a turn's first audio has not come MS after its first word (default: %(default)s)")
    g.add_argument("--fallback-stall-ms", type=_non_negative_ms, default=1000.0, metavar="MS",
                   help="silence mid-turn, while words wait, before the switch (default: %(default)s)")
    _add_access_options(p)
    _add_dsm_options(p)
    p.add_argument("--livekit-url", metavar="WS_URL", help="add the page's \"via LiveKit room\" lane through this LiveKit "
                                                           "server (LIVEKIT_API_KEY and LIVEKIT_API_SECRET from the environment)")
    p.set_defaults(func=_serve)


def _add_phrase_cache_options(p, default_mb: float | None = None) -> None:
    from myna.engines.phrase_cache import DEFAULT_MB

    g = p.add_argument_group("phrase cache (synthesised units kept in memory; myna.engines.phrase_cache)")
    g.add_argument("--phrase-cache-mb", type=_megabytes, default=DEFAULT_MB if default_mb is None else default_mb,
                   metavar="MB", help="memory bound of the phrase cache, MB; 0 turns it off (default: %(default)s)")
    g.add_argument("--phrase-cache-warm", metavar="FILE",
                   help="phrases to synthesise into the cache at start-up, one per line, before /healthz is ready "
                        "(default: the package's list of common openings; 'none': no warm-up)")


def _megabytes(value: str) -> float:
    try:
        mb = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of megabytes: {value!r}") from None
    if not (mb == 0.0 or 1e-6 <= mb <= 1_000_000.0):  # a size under one byte would be no cache
        raise argparse.ArgumentTypeError("must be 0 (off) or from 0.000001 (one byte) to 1000000 MB")
    return mb


def _phrase_cache(args: argparse.Namespace):
    """The worker's phrase cache and warm-up phrases from the flags: ``(None, [])`` when off.

    Raises:
        SystemExit: the warm-up file cannot be read.
    """
    from myna.engines.phrase_cache import PhraseCache, read_phrases

    if not args.phrase_cache_mb:
        return None, []
    warm = args.phrase_cache_warm
    try:
        phrases = [] if warm == "none" else read_phrases(warm)
    except (OSError, UnicodeDecodeError) as exc:
        raise SystemExit(f"myna: cannot read --phrase-cache-warm {warm}: {getattr(exc, 'strerror', None) or exc}") from None
    return PhraseCache(int(args.phrase_cache_mb * 1e6)), phrases


def _non_negative_ms(value: str) -> float:
    try:
        ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {value!r}") from None
    if not 0.0 <= ms <= 10_000.0:
        raise argparse.ArgumentTypeError("must be from 0 to 10000 ms")
    return ms
def _port(text: str) -> int:
    """argparse type of a TCP port to listen on."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is a number from 1 to 65535, not {text!r}")
    return port


def _add_access_options(p) -> None:
    from myna.server.limits import Limits

    d = Limits()
    g = p.add_argument_group("access (tokens, limits, drain; 0 turns a limit off)")
    g.add_argument("--api-key", default=os.environ.get("MYNA_API_KEY"),
                   help="API key: with --api-secret, offers and the WebSocket need an access token (env MYNA_API_KEY)")
    g.add_argument("--api-secret", default=os.environ.get("MYNA_API_SECRET"), help="API secret (env MYNA_API_SECRET)")
    g.add_argument("--insecure", action="store_true", help="allow binding a non-loopback address without keys")
    g.add_argument("--max-sessions", type=int, default=None,
                   help="sessions at once (default: the default engine's capacity, measured at start-up)")
    g.add_argument("--max-sessions-per-client", type=int, default=d.max_sessions_per_client,
                   help="sessions per token identity (per address without keys) (default: %(default)s)")
    g.add_argument("--offer-rate", type=float, default=d.offer_rate,
                   help="offers and WebSocket connections per second per client (default: %(default)s)")
    g.add_argument("--offer-burst", type=int, default=d.offer_burst, help="offers back to back before --offer-rate applies (default: %(default)s)")
    g.add_argument("--message-rate", type=float, default=d.message_rate, help="client messages per second per session (default: %(default)s)")
    g.add_argument("--message-burst", type=int, default=d.message_burst, help="messages back to back (default: %(default)s)")
    g.add_argument("--max-turn-chars", type=int, default=d.max_turn_chars, help="characters per turn (default: %(default)s)")
    g.add_argument("--max-queued-turns", type=int, default=d.max_queued_turns, help="turns queued per session (default: %(default)s)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM or SIGINT, seconds to let speaking turns finish before closing (default: %(default)s)")


def _limits(args: argparse.Namespace):
    from myna.server.limits import Limits

    def on(value):
        return value if value else None  # 0 turns a limit off

    return Limits(max_sessions=on(args.max_sessions), max_sessions_per_client=on(args.max_sessions_per_client),
                  offer_rate=on(args.offer_rate), offer_burst=args.offer_burst, message_rate=on(args.message_rate),
                  message_burst=args.message_burst, max_turn_chars=on(args.max_turn_chars),
                  max_queued_turns=on(args.max_queued_turns))


def _serve(args: argparse.Namespace) -> int:
    from myna.server.room_lane import add_room_lane
    from myna.rtc.ice import enable_loopback_candidates, is_loopback_host, set_peer_timeout
    from myna.server.app import Worker, create_app
    from myna.server.auth import Authenticator

    keys = (args.api_key, args.api_secret)
    if any(keys) and not all(keys):
        raise SystemExit("myna serve: --api-key and --api-secret go together (or MYNA_API_KEY and MYNA_API_SECRET)")
    if not all(keys) and not is_loopback_host(args.host) and not args.insecure:
        raise SystemExit(f"myna serve: refusing to listen on {args.host} without access keys: anyone who can reach it "
                         "could use it. Set --api-key/--api-secret (mint tokens with `myna token`), or pass --insecure.")
    if args.ice_loopback or is_loopback_host(args.host):
        enable_loopback_candidates()
    set_peer_timeout(args.peer_timeout)
    cache, warm = _phrase_cache(args)
    names = args.engine
    listed = [n.strip() for n in names.split(",") if n.strip()]
    if args.fallback and not set(listed) - {args.fallback}:
        raise SystemExit(f"myna serve: --fallback {args.fallback}: no other engine in --engine to fall back from")
    if args.fallback and args.fallback not in listed:
        names += f",{args.fallback}"  # loaded after the others: the first stays the default
    engines = _engines(names, _dsm_options(args))
    if args.fallback:
        engines = _with_fallback(engines, args.fallback, args.fallback_after_ms, args.fallback_stall_ms)
    worker = Worker(engines=engines, ice_servers=args.ice_server,
                    connect_timeout=args.connect_timeout, max_hold_ms=args.max_hold_ms, limits=_limits(args),
                    auth=Authenticator(*keys) if all(keys) else None, measure_capacity=args.max_sessions is None,
                    phrase_cache=cache, warm_phrases=warm)
    app = create_app(worker)
    add_room_lane(app, worker, args.livekit_url)  # POST /api/room, GET /vendor/livekit-client.mjs
    return asyncio.run(_run_server(app, worker, args.host, args.port, drain_timeout=args.drain_timeout))


async def _run_server(app, worker, host: str, port: int, drain_timeout: float = 0.0) -> int:
    """Serve until SIGINT/SIGTERM, then drain (up to ``drain_timeout`` s) and exit 0; a second
    signal exits at once."""
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
        print(f"myna {__version__}: loading {', '.join(worker.engines)} on http://{shown}:{port}/ ...", flush=True)
        t0 = time.monotonic()
        await worker.loading
        capacity = f", at most {worker.limits.max_sessions} sessions" if worker.limits.max_sessions else ""
        print(f"myna: ready in {time.monotonic() - t0:.1f} s{capacity}: open http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
        await stop.wait()
        busy = sum(s.busy for s in worker.sessions())
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
    p.add_argument("--engine", default=None, help="engine (default: piper locally, the worker's default remotely)")
    p.add_argument("--voice", default=None, help="voice name (default: the engine's)")
    p.add_argument("--token-rate", type=float, default=30.0,
                   help="tokens per second when streaming to a worker, like an LLM (0: all at once; default: %(default)s)")
    p.add_argument("--trim", action=argparse.BooleanOptionalAction, default=True,
                   help="with --server, start the file at the first audible sample, for listening (default); "
                        "--no-trim keeps the recording from the first text chunk sent, TTFA silence included, for measuring")
    _add_dsm_options(p, voice=False)
    p.set_defaults(func=_say)


class _SayError(Exception):
    """Bad input to ``myna say``: one line for the user, exit status 2."""


def _say(args: argparse.Namespace) -> int:
    from myna.text.normalise import normalise

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
    if path.is_dir():
        raise _SayError(f"cannot write {path}: it is a folder")
    existed = path.exists()
    try:
        with open(path, "ab"):  # appending leaves an existing file as it is
            pass
    except OSError as exc:
        raise _SayError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not existed:
        path.unlink(missing_ok=True)


async def _say_remote(args: argparse.Namespace, url: str) -> int:
    from myna.audio.onset import first_audible_sample
    from myna.rtc.client import MynaClient, wait_until_ready

    try:
        await wait_until_ready(url, timeout=60.0, starting=False)
        async with MynaClient(url, engine=args.engine, voice=args.voice, token=args.token) as client:
            result = await client.speak(args.text, tokens_per_s=args.token_rate or None)
    except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
        print(f"myna say: {exc or type(exc).__name__}", file=sys.stderr)
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
    from myna.engines import AudioChunk, EngineError

    name = args.engine or "piper"
    dsm_voice = args.voice if name == "dsm" and args.voice and Path(args.voice).is_file() else None
    engine = _engines(name, _dsm_options(args, dsm_voice))[name]
    if dsm_voice:
        args.voice = None  # a DSM voice file is the engine's default voice, not a voice name
    print(f"loading {engine.name} ...", flush=True)
    try:
        await engine.start()
        t0 = time.monotonic()
        stream = engine.stream(args.voice)
        stream.push_text(args.text)
        stream.end_input()
        pieces, first = [], None
        async for item in stream:
            if isinstance(item, AudioChunk):
                first = first if first is not None else time.monotonic() - t0
                pieces.append(item.pcm)
        total = time.monotonic() - t0
    except EngineError as exc:
        print(f"myna say: {exc.message}", file=sys.stderr)
        return 1
    finally:
        await engine.close()
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    _write_wav(args.output, (np.clip(pcm, -1, 1) * 32767).astype(np.int16), engine.sample_rate)
    seconds = len(pcm) / engine.sample_rate
    print(f"wrote {args.output} ({seconds:.2f} s at {engine.sample_rate} Hz)")
    print(f"first audio after {_ms(first and first * 1000)}, whole reply in {total * 1000:.0f} ms (RTF {total / max(seconds, 1e-9):.3f})")
    return 0


def _write_wav(path: Path, pcm: np.ndarray, sample_rate: int) -> None:
    try:
        with open(path, "wb") as f, wave.open(f, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(sample_rate)
            w.writeframes(pcm.astype("<i2").tobytes())
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
    engines = [e.strip() for e in args.engines.split(",") if e.strip()] if args.engines else None
    print(mint_token(args.api_key, args.api_secret, args.identity, args.ttl, engines, args.max_sessions))
    return 0


# -- bench --------------------------------------------------------------------------------
def _add_bench(sub) -> None:
    from myna.bench import add_parsers

    p = sub.add_parser("bench", help="benchmarks (print a table, --json writes the figures)")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="myna", description="Myna: real-time speech for voice agents.")
    parser.add_argument("--version", action="version", version=f"myna {__version__}")
    _add_global_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    _add_serve(sub)
    _add_say(sub)
    _add_token(sub)
    _add_bench(sub)
    from myna.room.cli import add_parsers as add_room_parsers  # `myna room`, `myna worker`

    add_room_parsers(sub)
    args = parser.parse_args(argv)
    _configure_logging(args.log_level, args.log_format)
    if args.log_level != "debug":
        logging.getLogger("aioice").setLevel(logging.WARNING)  # one INFO line per ICE check
    try:
        return args.func(args) or 0
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
