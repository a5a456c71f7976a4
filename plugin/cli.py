"""The ``myna`` command line: ``serve``, ``say`` and ``bench``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
import wave
from pathlib import Path

import numpy as np

from myna import __version__

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
            from myna.engines.dsm import DSMEngine

            if not (dsm or {}).get("checkpoint"):
                raise SystemExit("myna: the dsm engine needs --dsm-checkpoint PATH_OR_REPO")
            engines[name] = DSMEngine(**dsm)
    return engines


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
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s; a loopback address also turns on loopback ICE candidates)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default: %(default)s)")
    p.add_argument("--engine", default=DEFAULT_ENGINES,
                   help="engines to load, comma-separated; the first is the default (default: %(default)s; "
                        "the piper-* strategies share one loaded voice)")
    p.add_argument("--ice-server", action="append", default=[], metavar="URL",
                   help="opt-in STUN/TURN server URL (repeatable); none by default, so nothing leaves the host")
    p.add_argument("--ice-loopback", action="store_true", help="offer 127.0.0.1 as an ICE candidate even when binding elsewhere")
    p.add_argument("--peer-timeout", type=float, default=10.0, help="seconds to detect a peer that stopped answering (default: %(default)s)")
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds a new peer may take to connect (default: %(default)s)")
    _add_dsm_options(p)
    p.add_argument("--livekit-url", metavar="WS_URL", help="add the page's \"via LiveKit room\" lane through this LiveKit "
                                                           "server (LIVEKIT_API_KEY and LIVEKIT_API_SECRET from the environment)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from myna.server.room_lane import add_room_lane
    from myna.rtc.ice import enable_loopback_candidates, is_loopback_host, set_peer_timeout
    from myna.server.app import Worker, create_app

    if args.ice_loopback or is_loopback_host(args.host):
        enable_loopback_candidates()
    set_peer_timeout(args.peer_timeout)
    worker = Worker(engines=_engines(args.engine, _dsm_options(args)), ice_servers=args.ice_server, connect_timeout=args.connect_timeout)
    app = create_app(worker)
    add_room_lane(app, worker, args.livekit_url)  # POST /api/room, GET /vendor/livekit-client.mjs
    return asyncio.run(_run_server(app, worker, args.host, args.port))


async def _run_server(app, worker, host: str, port: int) -> int:
    from aiohttp import web

    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await web.TCPSite(runner, host, port).start()
        shown = f"[{host}]" if ":" in host else host
        print(f"myna {__version__}: loading {', '.join(worker.engines)} on http://{shown}:{port}/ ...", flush=True)
        t0 = time.monotonic()
        await worker.loading
        print(f"myna: ready in {time.monotonic() - t0:.1f} s: open http://{shown}:{port}/ (Ctrl-C stops)", flush=True)
        await stop.wait()
        print("myna: shutting down", flush=True)
        return 0
    except OSError as exc:
        print(f"myna: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        log.exception("start-up failed")
        print(f"myna: start-up failed: {exc}", file=sys.stderr)
        return 1
    finally:
        await runner.cleanup()


# -- say ----------------------------------------------------------------------------------
def _add_say(sub) -> None:
    p = sub.add_parser("say", help="speak text to a WAV file, locally or through a running worker",
                       description="Synthesise TEXT to a WAV file. With --server, stream it over WebRTC to a "
                                   "running worker as token-sized chunks and record what comes back.")
    p.add_argument("text", help="what to say")
    p.add_argument("-o", "--output", type=Path, default=Path("myna.wav"), help="WAV file to write (default: %(default)s)")
    p.add_argument("--server", metavar="URL", help="a running worker, e.g. http://127.0.0.1:8080")
    p.add_argument("--engine", default=None, help="engine (default: piper locally, the worker's default remotely)")
    p.add_argument("--voice", default=None, help="voice name (default: the engine's)")
    p.add_argument("--token-rate", type=float, default=30.0,
                   help="tokens per second when streaming to a worker, like an LLM (0: all at once; default: %(default)s)")
    _add_dsm_options(p, voice=False)
    p.set_defaults(func=_say)


def _say(args: argparse.Namespace) -> int:
    if args.server:
        return asyncio.run(_say_remote(args))
    return asyncio.run(_say_local(args))


async def _say_remote(args: argparse.Namespace) -> int:
    from myna.rtc.client import MynaClient, wait_until_ready

    url = args.server.rstrip("/")
    try:
        await wait_until_ready(url, timeout=60.0)
        async with MynaClient(url, engine=args.engine, voice=args.voice) as client:
            result = await client.speak(args.text, tokens_per_s=args.token_rate or None)
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"myna say: {exc or type(exc).__name__}", file=sys.stderr)
        return 1
    _write_wav(args.output, result.pcm, 48_000)
    for event in result.events:
        if event["type"] == "error":
            print(f"error {event['code']}: {event['message']}", file=sys.stderr)
    print(f"wrote {args.output} ({len(result.pcm) / 48000:.2f} s at 48000 Hz)")
    print(f"server TTFA: {_ms(result.server_ttfa_ms)}   perceived TTFA: {_ms(result.perceived_ttfa_ms)}")
    return 0


async def _say_local(args: argparse.Namespace) -> int:
    from myna.engines import AudioChunk

    name = args.engine or "piper"
    dsm_voice = args.voice if name == "dsm" and args.voice and Path(args.voice).is_file() else None
    engine = _engines(name, _dsm_options(args, dsm_voice))[name]
    if dsm_voice:
        args.voice = None  # a DSM voice file is the engine's default voice, not a voice name
    print(f"loading {engine.name} ...", flush=True)
    await engine.start()
    try:
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
    finally:
        await engine.close()
    pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    _write_wav(args.output, (np.clip(pcm, -1, 1) * 32767).astype(np.int16), engine.sample_rate)
    seconds = len(pcm) / engine.sample_rate
    print(f"wrote {args.output} ({seconds:.2f} s at {engine.sample_rate} Hz)")
    print(f"first audio after {_ms(first and first * 1000)}, whole reply in {total * 1000:.0f} ms (RTF {total / max(seconds, 1e-9):.3f})")
    return 0


def _write_wav(path: Path, pcm: np.ndarray, sample_rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.astype("<i2").tobytes())


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


# -- bench --------------------------------------------------------------------------------
def _add_bench(sub) -> None:
    from myna.bench import add_parsers

    p = sub.add_parser("bench", help="benchmarks (print a table, --json writes the figures)")
    add_parsers(p.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="myna", description="Myna: real-time speech for voice agents.")
    parser.add_argument("--version", action="version", version=f"myna {__version__}")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="log verbosity (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve(sub)
    _add_say(sub)
    _add_bench(sub)
    from myna.room.cli import add_parsers as add_room_parsers  # `myna room`, `myna worker`

    add_room_parsers(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level != "debug":
        logging.getLogger("aioice").setLevel(logging.WARNING)  # one INFO line per ICE check
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
