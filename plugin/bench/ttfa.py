"""``myna bench ttfa``: perceived time to first audio over real WebRTC on loopback.

An aiortc client (:class:`myna.rtc.client.MynaClient`) runs N concurrent sessions against a
worker, streams a sentence as LLM-like token chunks at a fixed rate, and measures perceived
TTFA on the received audio (DESIGN.md §4). Beside it, in the same run, the same text is
synthesised whole by the engine in-process, the way a non-streaming pipeline would: its
synthesis time, and the TTFA such a pipeline would have (the whole reply has to be written
first, then synthesised).

Without ``--server`` the benchmark starts its own ``myna serve`` on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np

DEFAULT_TEXT = "Sure, I can help with that: your table for four is booked at seven tonight."


def add_parser(subparsers) -> None:
    """Register ``ttfa`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("ttfa", help="perceived TTFA over WebRTC on loopback, against whole-reply synthesis",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--server", metavar="URL", help="a running worker (default: start one on 127.0.0.1)")
    p.add_argument("--engine", default="piper", help="engine to race (default: %(default)s)")
    p.add_argument("--concurrency", default="1", help="comma-separated session counts (default: %(default)s)")
    p.add_argument("--turns", type=int, default=20, help="turns per session (default: %(default)s)")
    p.add_argument("--token-rate", type=float, default=30.0, help="tokens per second (default: %(default)s)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the sentence to speak")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from myna.rtc.client import token_chunks

    server = None if args.server else _start_worker(args.engine)
    url = args.server or server[1]
    try:
        rows = []
        for n in [int(c) for c in args.concurrency.split(",")]:
            rows.append(await _race(url, args.engine, n, args.turns, args.text, args.token_rate))
        whole = await _whole_reply(args.engine, args.text)
    finally:
        if server:
            server[0].terminate()
            server[0].wait(timeout=15)
    text_ms = 1000.0 * (len(token_chunks(args.text)) - 1) / args.token_rate
    result = {
        "engine": args.engine,
        "text": args.text,
        "words": len(args.text.split()),
        "token_rate": args.token_rate,
        "text_stream_ms": round(text_ms, 1),
        "streaming": rows,
        "whole_reply": {
            "synthesis_ms": _stats(whole),
            "ttfa_ms_p50": round(text_ms + float(np.median(whole)), 1),
        },
    }
    _print(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


async def _race(url: str, engine: str, sessions: int, turns: int, text: str, rate: float) -> dict:
    from myna.rtc.client import MynaClient

    async def one() -> list:
        out = []
        async with MynaClient(url, engine=engine) as client:
            for _ in range(turns):
                out.append(await client.speak(text, tokens_per_s=rate))
        return out

    results = [r for rs in await asyncio.gather(*(one() for _ in range(sessions))) for r in rs]
    perceived = [r.perceived_ttfa_ms for r in results if r.perceived_ttfa_ms is not None]
    server = [r.server_ttfa_ms for r in results if r.server_ttfa_ms is not None]
    audio_ms = [r.events[-1].get("audio_ms", 0.0) for r in results]
    return {
        "sessions": sessions,
        "perceived_ttfa_ms": _stats(perceived),
        "server_ttfa_ms": _stats(server),
        "silent_turns": len(results) - len(perceived),
        "underruns": sum(r.events[-1].get("underruns", 0) for r in results),
        "audio_ms_p50": float(np.median(audio_ms)),
    }


async def _whole_reply(engine_name: str, text: str, repeats: int = 10) -> list[float]:
    """Milliseconds to synthesise ``text`` in one piece, in-process (one synthesis thread)."""
    from myna.engines.piper import PiperEngine

    if engine_name != "piper":
        raise SystemExit(f"bench ttfa: no whole-reply baseline for engine {engine_name!r}")
    engine = PiperEngine(workers=1)
    await engine.start()
    times = []
    try:
        for _ in range(repeats):
            t0 = time.perf_counter()
            await engine.synthesize(text)
            times.append(1000.0 * (time.perf_counter() - t0))
    finally:
        await engine.close()
    return times


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    p25, p50, p75, p95 = np.percentile(values, [25, 50, 75, 95])
    return {"n": len(values), "p50": round(p50, 1), "p25": round(p25, 1), "p75": round(p75, 1),
            "iqr": round(p75 - p25, 1), "p95": round(p95, 1)}


def _print(result: dict) -> None:
    print(f"engine {result['engine']}: {result['words']} words streamed at {result['token_rate']:.0f} tokens/s "
          f"(text fully written after {result['text_stream_ms']:.0f} ms)")
    print(f"{'sessions':>8} {'perceived p50':>14} {'IQR (p25-p75)':>16} {'p95':>8} {'server p50':>11} {'n':>4} {'underruns':>9}")
    for row in result["streaming"]:
        p, s = row["perceived_ttfa_ms"], row["server_ttfa_ms"]
        if not p["n"]:
            print(f"{row['sessions']:>8} {'no audio':>14}")
            continue
        print(f"{row['sessions']:>8} {p['p50']:>11.0f} ms {p['iqr']:>6.0f} ({p['p25']:.0f}-{p['p75']:.0f}) "
              f"{p['p95']:>5.0f} ms {s.get('p50', float('nan')):>8.0f} ms {p['n']:>4} {row['underruns']:>9}")
    w = result["whole_reply"]
    print(f"whole-reply synthesis of the same text: p50 {w['synthesis_ms']['p50']:.0f} ms "
          f"(n={w['synthesis_ms']['n']}); a non-streaming pipeline's TTFA ≈ {w['ttfa_ms_p50']:.0f} ms")
    best = result["streaming"][0]["perceived_ttfa_ms"]
    if best.get("n"):
        print(f"streaming perceived TTFA / whole-reply synthesis time: {best['p50'] / w['synthesis_ms']['p50']:.2f}; "
              f"/ non-streaming TTFA: {best['p50'] / w['ttfa_ms_p50']:.2f}")


def _start_worker(engine: str) -> tuple[subprocess.Popen, str]:
    from myna.rtc.ice import enable_loopback_candidates

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    enable_loopback_candidates()  # our client talks to a worker on loopback
    proc = subprocess.Popen([sys.executable, "-m", "myna.cli", "--log-level", "warning", "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--engine", engine], stdout=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("bench ttfa: the worker did not become ready")
