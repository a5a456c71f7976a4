"""``myna bench ttfa``: the headless latency race, perceived time to first audio over WebRTC.

For each concurrency level N and each engine (strategy), an aiortc client
(:class:`myna.rtc.client.MynaClient`) opens N sessions against a worker at once; every session
streams a sentence as LLM-like token chunks at a fixed rate, ``--turns`` times, and perceived
TTFA is measured on the received audio (DESIGN.md §4: first text chunk sent → first audible
sample received). Engines run one after the other within a level, so they are compared side by
side under the same load. The table has the shape of published TTS serving tables: concurrency →
first-audio latency (p50, IQR, p95) and real-time factor.

RTF is the worker's engine busy time (wall seconds with at least one synthesis running) per
second of audio it produced during that engine's run at that level, all sessions together:
compute ÷ audio, lower is better, above 1 the engine cannot keep up. It needs the worker this
benchmark starts itself (which exposes its engines' counters); with ``--server`` it is left out.

Beside it, in the same run, the same text is synthesised whole in-process, the way a
non-streaming pipeline would: its synthesis time and the TTFA such a pipeline would have (the
whole reply has to be written first, then synthesised).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

DEFAULT_TEXT = "Sure, I can help with that: your table for four is booked at seven tonight."
DEFAULT_ENGINES = "piper,piper-sentence,piper-whole"
STATS_PATH = "/bench/engine-stats"


def add_parser(subparsers) -> None:
    """Register ``ttfa`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("ttfa", help="headless latency race: perceived TTFA and RTF per engine and concurrency",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--server", metavar="URL", help="a running worker (default: start one on 127.0.0.1); "
                   "RTF then shows as —: only a worker started here reports its engines' busy time")
    p.add_argument("--engines", "--engine", dest="engines", default=DEFAULT_ENGINES,
                   help="comma-separated engines (strategies) to race (default: %(default)s)")
    p.add_argument("--concurrency", default="1,4", help="comma-separated session counts (default: %(default)s)")
    p.add_argument("--turns", type=int, default=2, help="turns per session (default: %(default)s)")
    p.add_argument("--token-rate", type=float, default=30.0, help="tokens per second, 0 for all at once (default: %(default)s)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the sentence to speak")
    p.add_argument("--baseline-repeats", type=int, default=5,
                   help="whole-reply syntheses for the non-streaming baseline, 0 to skip (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="plot TTFA and RTF against concurrency (needs matplotlib)")
    p.add_argument("--transport", choices=["webrtc", "livekit"], default="webrtc",
                   help="livekit: through a LiveKit room beside the direct path, same run (myna.room.bench)")
    from myna.room.bench import add_arguments as add_livekit_arguments

    add_livekit_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.transport == "livekit":
        from myna.room import bench

        return bench.run(args)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    if not engines or not levels or min(levels) < 1 or args.turns < 1:
        raise SystemExit("bench ttfa: need at least one engine, concurrency levels ≥ 1 and --turns ≥ 1")
    if args.plot:
        _require_matplotlib()
    result = asyncio.run(_run(args, engines, levels))
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


async def _run(args: argparse.Namespace, engines: list[str], levels: list[int]) -> dict:
    from myna.rtc.client import token_chunks, wait_until_ready

    worker = None if args.server else _start_worker(engines)
    url = (args.server or worker.url).rstrip("/")
    rate = args.token_rate or None
    t_start = time.monotonic()
    rows = []
    try:
        await wait_until_ready(url, timeout=120.0)
        for n in levels:
            for engine in engines:
                rows.append(await _race(url, engine, n, args.turns, args.text, rate))
                row = rows[-1]
                print(f"  {engine:<16} ×{n:<3} perceived p50 {_fmt(row['perceived_ttfa_ms'].get('p50'))} ms, "
                      f"RTF {_fmt(row['rtf'], 3)}", file=sys.stderr, flush=True)
    finally:
        if worker:
            worker.stop()
    text_ms = 1000.0 * (len(token_chunks(args.text)) - 1) / rate if rate else 0.0
    result = {
        "benchmark": "ttfa",
        "engines": engines,
        "concurrency": levels,
        "turns_per_session": args.turns,
        "text": args.text,
        "words": len(args.text.split()),
        "token_rate": args.token_rate,
        "text_stream_ms": round(text_ms, 1),
        "cpus": os.cpu_count(),
        "race_wall_s": round(time.monotonic() - t_start, 1),
        "rows": rows,
        "whole_reply": None,
    }
    piper_family = [e for e in engines if e.startswith("piper")]
    if args.baseline_repeats > 0 and piper_family:
        whole = await _whole_reply(args.text, args.baseline_repeats)
        result["whole_reply"] = {
            "synthesis_ms": _stats(whole),
            "ttfa_ms_p50": round(text_ms + float(np.median(whole)), 1),
        }
    return result


async def _race(url: str, engine: str, sessions: int, turns: int, text: str, rate: float | None) -> dict:
    """``sessions`` concurrent sessions on ``engine``, ``turns`` turns each."""
    from myna.rtc.client import MynaClient

    before = await _engine_stats(url, engine)
    t0 = time.monotonic()

    async def one() -> list:
        out = []
        async with MynaClient(url, engine=engine) as client:
            for _ in range(turns):
                out.append(await client.speak(text, tokens_per_s=rate))
        return out

    results = [r for rs in await asyncio.gather(*(one() for _ in range(sessions))) for r in rs]
    wall = time.monotonic() - t0
    after = await _engine_stats(url, engine)
    perceived = [r.perceived_ttfa_ms for r in results if r.perceived_ttfa_ms is not None]
    server = [r.server_ttfa_ms for r in results if r.server_ttfa_ms is not None]
    done = [next((e for e in r.events if e["type"] == "turn_done"), {}) for r in results]
    errors = [e for r in results for e in r.events if e["type"] == "error"]
    rtf = None
    if before and after and after["audio_s"] > before["audio_s"]:
        rtf = round((after["busy_s"] - before["busy_s"]) / (after["audio_s"] - before["audio_s"]), 4)
    return {
        "engine": engine,
        "sessions": sessions,
        "turns": len(results),
        "perceived_ttfa_ms": _stats(perceived),
        "server_ttfa_ms": _stats(server),
        "rtf": rtf,
        "silent_turns": len(results) - len(perceived),
        "errors": len(errors),
        "underruns": int(sum(d.get("underruns", 0) or 0 for d in done)),
        "audio_ms_p50": round(float(np.median([d.get("audio_ms", 0.0) or 0.0 for d in done])), 1) if done else None,
        "wall_s": round(wall, 2),
    }


async def _engine_stats(url: str, engine: str) -> dict | None:
    """The worker's synthesis counters for ``engine`` (only the worker started here has them)."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}{STATS_PATH}", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return None
                return (await resp.json()).get(engine)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def _whole_reply(text: str, repeats: int) -> list[float]:
    """Milliseconds to synthesise ``text`` in one piece, in-process (one synthesis thread)."""
    from myna.engines.piper import PiperEngine

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
    return {"n": len(values), "p50": round(float(p50), 1), "p25": round(float(p25), 1), "p75": round(float(p75), 1),
            "iqr": round(float(p75 - p25), 1), "p95": round(float(p95), 1)}


def _fmt(value, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def format_table(result: dict) -> str:
    """The race as a serving table: per engine, concurrency → first-audio latency and RTF."""
    rate = f"{result['token_rate']:.0f} tokens/s" if result["token_rate"] else "all at once"
    lines = [
        f"Perceived TTFA over WebRTC on loopback: {result['words']} words streamed at {rate} "
        f"(text fully written after {result['text_stream_ms']:.0f} ms), {result['turns_per_session']} turn(s) per session, "
        f"{result['cpus']} CPUs",
        f"{'engine':<16} {'sessions':>8} {'TTFA p50':>9} {'IQR (p25–p75)':>19} {'p95':>9} {'server p50':>10} "
        f"{'RTF':>6} {'n':>4} {'silent':>6} {'underruns':>9}",
    ]
    for row in result["rows"]:
        p, s = row["perceived_ttfa_ms"], row["server_ttfa_ms"]
        if not p["n"]:
            lines.append(f"{row['engine']:<16} {row['sessions']:>8} {'no audio':>9} {'':>19} {'':>9} {'':>10} "
                         f"{_fmt(row['rtf'], 3):>6} {0:>4} {row['silent_turns']:>6} {row['underruns']:>9}")
            continue
        iqr = f"{p['iqr']:.0f} ({p['p25']:.0f}–{p['p75']:.0f})"
        lines.append(f"{row['engine']:<16} {row['sessions']:>8} {p['p50']:>6.0f} ms {iqr:>19} {p['p95']:>6.0f} ms "
                     f"{_fmt(s.get('p50')):>7} ms {_fmt(row['rtf'], 3):>6} {p['n']:>4} {row['silent_turns']:>6} "
                     f"{row['underruns']:>9}")
    lines.append("TTFA: first text chunk sent → first audible sample received (ms). RTF: engine busy seconds per "
                 "audio second, all sessions together (lower is better; > 1 cannot keep up).")
    if any(row["rtf"] is None for row in result["rows"]):
        lines.append("RTF —: not measured; only a worker this benchmark starts itself reports its engines' busy "
                     "time (not one given with --server).")
    w = result.get("whole_reply")
    if w and w["synthesis_ms"].get("n"):
        lines.append(f"Whole-reply synthesis of the same text in-process: p50 {w['synthesis_ms']['p50']:.0f} ms "
                     f"(n={w['synthesis_ms']['n']}); a non-streaming pipeline's TTFA ≈ {w['ttfa_ms_p50']:.0f} ms "
                     f"(text written, then synthesised).")
        for row in result["rows"]:
            if row["sessions"] == result["concurrency"][0] and row["perceived_ttfa_ms"].get("n"):
                ratio = row["perceived_ttfa_ms"]["p50"] / w["ttfa_ms_p50"]
                lines.append(f"  {row['engine']:<16} at {row['sessions']} session(s): perceived TTFA / non-streaming TTFA = {ratio:.2f}")
    return "\n".join(lines)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("bench ttfa: --plot needs matplotlib (pip install 'matplotlib>=3.8,<4')") from None


def plot(result: dict, path: str) -> None:
    """Two panels against concurrency: perceived TTFA (p50, IQR band, p95) and RTF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for engine in result["engines"]:
        rows = [r for r in result["rows"] if r["engine"] == engine and r["perceived_ttfa_ms"].get("n")]
        if not rows:
            continue
        x = [r["sessions"] for r in rows]
        p50 = [r["perceived_ttfa_ms"]["p50"] for r in rows]
        line, = ax_t.plot(x, p50, marker="o", label=engine)
        ax_t.fill_between(x, [r["perceived_ttfa_ms"]["p25"] for r in rows], [r["perceived_ttfa_ms"]["p75"] for r in rows],
                          color=line.get_color(), alpha=0.18, linewidth=0)
        ax_t.plot(x, [r["perceived_ttfa_ms"]["p95"] for r in rows], linestyle=":", color=line.get_color())
        rtf = [(r["sessions"], r["rtf"]) for r in rows if r["rtf"] is not None]
        if rtf:
            ax_r.plot([a for a, _ in rtf], [b for _, b in rtf], marker="o", color=line.get_color(), label=engine)
    w = result.get("whole_reply")
    if w:
        ax_t.axhline(w["ttfa_ms_p50"], color="grey", linestyle="--", linewidth=1, label="non-streaming (whole reply)")
    ax_t.set(xlabel="concurrent sessions", ylabel="perceived TTFA (ms)",
             title="First audio: p50, IQR band, p95 dotted")
    ax_r.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax_r.set(xlabel="concurrent sessions", ylabel="RTF (compute s / audio s)", title="Real-time factor (lower is better)")
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["concurrency"], [str(c) for c in result["concurrency"]])
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    fig.suptitle(f"myna bench ttfa · {result['words']} words at {result['token_rate']:.0f} tokens/s · "
                 f"{result['cpus']} CPUs", fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the worker this benchmark starts ---------------------------------------------------
class _Worker:
    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc, self.url, self.log_path = proc, url, log_path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _start_worker(engines: list[str]) -> _Worker:
    from myna.rtc.ice import enable_loopback_candidates

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    enable_loopback_candidates()  # our client talks to a worker on loopback
    log = tempfile.NamedTemporaryFile(prefix="myna-bench-worker-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "myna.bench.ttfa", "--port", str(port), "--engines", ",".join(engines)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                if r.status == 200:
                    return _Worker(proc, url, log.name)
        except OSError:
            time.sleep(0.2)
    proc.kill()
    with open(log.name, errors="replace") as f:
        tail = f.read()[-2000:]
    raise SystemExit(f"bench ttfa: the worker did not become ready:\n{tail}")


def _serve_instrumented(argv: list[str] | None = None) -> int:
    """``myna serve`` on loopback plus ``GET /bench/engine-stats`` (synthesis counters per engine)."""
    from aiohttp import web

    from myna.cli import _engines, _run_server
    from myna.rtc.ice import enable_loopback_candidates
    from myna.server.app import Worker, create_app

    p = argparse.ArgumentParser(prog="myna.bench.ttfa")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--engines", default=DEFAULT_ENGINES)
    args = p.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING)
    enable_loopback_candidates()
    worker = Worker(engines=_engines(args.engines))
    app = create_app(worker)

    async def engine_stats(request: web.Request) -> web.Response:
        return web.json_response({name: e.compute_stats() for name, e in worker.engines.items() if hasattr(e, "compute_stats")})

    app.router.add_get(STATS_PATH, engine_stats)
    return asyncio.run(_run_server(app, worker, "127.0.0.1", args.port))


if __name__ == "__main__":
    sys.exit(_serve_instrumented())
