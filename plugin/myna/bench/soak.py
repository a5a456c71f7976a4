"""``myna bench soak``: does a worker give back everything a session took?

Three parts, one JSON:

1. **Cycles.** ``--cycles`` × (connect → speak a short reply → close), over WebRTC and over
   the WebSocket alternately, ``--concurrency`` at a time, against a worker in this process.
   After ``--warmup`` cycles the process is measured (baseline), and again after the rest:
   RSS, open file descriptors, asyncio tasks, threads and live ``RTCPeerConnection`` objects
   (``gc``) — each should be back to its baseline (RSS within 20 MB). RSS is compared after
   glibc's ``malloc_trim`` at both points (what the allocator kept from freed memory is not a
   leak); raw RSS is given too, and every 100 cycles (a leak climbs; allocator growth levels
   off). Thread-pool workers are counted apart: a pool grows on demand up to its bound.
2. **Idle.** ``--idle-sessions`` connected sessions that say nothing, three windows of
   ``--idle-seconds``: the worker's CPU per idle session and idle sessions per core. The
   clients run in a child process, so only the worker's own CPU is counted.
3. **Long run** (``--long-minutes``, 0 skips it; 30 is a meaningful run): the worker's
   measured capacity of sessions (or ``--long-sessions``), every one speaking continuously
   (clients in a child process); frame-deadline deviation p99 (the paced track's wake-up
   lateness, per frame) and underruns in the first and the last ``--window-minutes``.

The cycles' clients share the worker's process (their objects are counted too: a leak on either
side shows). Run inside ``unshare -n sh -c 'ip link set lo up; …'``: everything is on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass


from myna.bench.simulate import percentile
from myna.extras import require

REPLY = "Thanks, that is all."
LONG_REPLY = ("The weather today is sunny, with a light breeze from the west. Tomorrow brings clouds in the "
              "morning and rain after noon, so keep an umbrella close.")
#: RSS growth over the measured cycles that counts as a leak.
RSS_GROWTH_LIMIT_MB = 20.0


def add_parser(subparsers) -> None:
    """Register ``soak`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("soak", help="session cycles, idle cost and a long run: is everything given back?",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=1000, help="connect-speak-close cycles (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=50, help="cycles before the baseline (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=4, help="cycles at once (default: %(default)s)")
    p.add_argument("--engine", default="piper", help="engine to load (default: %(default)s)")
    p.add_argument("--idle-sessions", type=int, default=8, help="idle sessions to measure (default: %(default)s; 0 skips)")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="idle measurement window, three of them (default: %(default)s)")
    p.add_argument("--long-minutes", type=float, default=0.0,
                   help="minutes of the run at capacity (default: %(default)s: skipped; 30 is a meaningful run)")
    p.add_argument("--window-minutes", type=float, default=5.0,
                   help="first/last window of the long run compared (default: %(default)s)")
    p.add_argument("--long-sessions", type=int, default=None, help="sessions in the long run (default: measured capacity)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


# -- the worker under test --------------------------------------------------------------------
@contextlib.asynccontextmanager
async def serve_in_process(worker, host: str = "127.0.0.1"):
    """Serve ``worker`` on ``host`` at a free port in this event loop; yields its base URL once
    its engines are ready. Everything is closed on exit."""
    from aiohttp import web

    from myna.rtc.ice import enable_loopback_candidates
    from myna.server.app import create_app

    enable_loopback_candidates()
    runner = web.AppRunner(create_app(worker), handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        await worker.loading
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class Counts:
    """What a process holds: the figures a leak makes grow."""

    rss_mb: float
    rss_trimmed_mb: float | None  # after glibc's malloc_trim: memory the allocator kept but nothing uses
    fds: int
    tasks: int
    threads: int  # not counting thread-pool workers (below)
    pool_threads: int  # workers of thread pools (the event loop's executor grows on demand, to a bound)
    peer_connections: int


def _rss_mb() -> float:
    """This process's resident memory (MB)."""
    import psutil

    return round(psutil.Process().memory_info().rss / 2**20, 1)


def counts() -> Counts:
    """This process's counts, after a full garbage collection (call on the event loop)."""
    import psutil
    from aiortc import RTCPeerConnection

    gc.collect()
    process = psutil.Process()
    rss_mb = _rss_mb()
    threads = threading.enumerate()
    pool = sum(t.name.startswith(("asyncio_", "ThreadPoolExecutor-")) for t in threads)  # executors' workers
    return Counts(
        rss_mb=rss_mb,
        rss_trimmed_mb=round(process.memory_info().rss / 2**20, 1) if _malloc_trim() else None,
        fds=process.num_fds(),
        tasks=len(asyncio.all_tasks()),
        threads=len(threads) - pool,
        pool_threads=pool,
        peer_connections=sum(isinstance(o, RTCPeerConnection) for o in gc.get_objects()),
    )


def _malloc_trim() -> bool:
    """Hand freed heap back to the OS (glibc); False where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


async def settle(worker, timeout: float = 10.0) -> None:
    """Wait until the worker holds no session (closed peers are noticed asynchronously)."""
    deadline = time.monotonic() + timeout
    while (worker.webrtc.peers or worker.streams) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # let closing tasks finish


# -- one cycle per transport --------------------------------------------------------------------
async def webrtc_cycle(url: str, text: str = REPLY) -> None:
    """Connect over WebRTC, speak ``text``, close.

    Raises:
        RuntimeError: the turn reported an error.
    """
    from myna.rtc.client import MynaClient

    async with MynaClient(url) as client:
        result = await client.speak(text, tokens_per_s=None, timeout=30)
    if "error" in result.event_types():
        raise RuntimeError(f"webrtc turn failed: {result.events}")


async def websocket_cycle(url: str, text: str = REPLY) -> None:
    """Connect to ``/v1/tts/stream``, speak ``text``, close.

    Raises:
        RuntimeError: the turn reported an error or the connection ended early.
    """
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
        await ws.send_json({"type": "text", "turn_id": "t", "text": text})
        await ws.send_json({"type": "end_turn", "turn_id": "t"})
        async with asyncio.timeout(30):
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    event = json.loads(msg.data)
                    if event["type"] == "error":
                        raise RuntimeError(f"websocket turn failed: {event}")
                    if event["type"] == "turn_done":
                        return
        raise RuntimeError("the websocket closed before turn_done")


async def run_cycles(url: str, n: int, concurrency: int, first: int = 0, rss_mb: list | None = None) -> int:
    """``n`` cycles, ``concurrency`` at a time, alternating WebRTC and WebSocket; returns failures.
    Every 100 cycles, RSS (MB) is appended to ``rss_mb`` (whether memory levels off or climbs)."""
    queue = iter(range(first, first + n))
    failures = 0

    async def lane() -> None:
        nonlocal failures
        for i in queue:
            try:
                await (webrtc_cycle(url) if i % 2 == 0 else websocket_cycle(url))
            except Exception as exc:
                failures += 1
                print(f"cycle {i} failed: {exc}", file=sys.stderr)
            if (i + 1) % 100 == 0:
                rss = _rss_mb()
                if rss_mb is not None:
                    rss_mb.append((i + 1, rss))
                print(f"  {i + 1} cycles, RSS {rss} MB", file=sys.stderr, flush=True)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return failures


async def soak_cycles(worker, url: str, cycles: int, warmup: int, concurrency: int) -> dict:
    """Warm-up cycles, baseline counts, the measured cycles, final counts."""
    failures = await run_cycles(url, warmup, concurrency)
    await settle(worker)
    baseline = counts()
    t0 = time.monotonic()
    trajectory: list[tuple[int, float]] = []
    failures += await run_cycles(url, cycles - warmup, concurrency, first=warmup, rss_mb=trajectory)
    seconds = time.monotonic() - t0
    await settle(worker)
    end = counts()
    return {"cycles": cycles, "warmup": warmup, "concurrency": concurrency, "failures": failures,
            "seconds": round(seconds, 1), "baseline": asdict(baseline), "end": asdict(end),
            "rss_growth_mb": round(_held_mb(end) - _held_mb(baseline), 1),
            "rss_raw_growth_mb": round(end.rss_mb - baseline.rss_mb, 1), "rss_mb_every_100_cycles": trajectory,
            "back_to_baseline": back_to_baseline(baseline, end)}


def _held_mb(c: Counts) -> float:
    """RSS the process holds for live data: after ``malloc_trim`` where there is one. (The raw
    RSS at a later point also holds the heap regrown after the trim at the baseline.)"""
    return c.rss_trimmed_mb if c.rss_trimmed_mb is not None else c.rss_mb


def back_to_baseline(baseline: Counts, end: Counts) -> dict[str, bool]:
    """Per count: is it back (RSS: within :data:`RSS_GROWTH_LIMIT_MB`)?"""
    return {"rss": _held_mb(end) - _held_mb(baseline) < RSS_GROWTH_LIMIT_MB, "fds": end.fds <= baseline.fds,
            "tasks": end.tasks <= baseline.tasks, "threads": end.threads <= baseline.threads,
            "peer_connections": end.peer_connections <= baseline.peer_connections}


# -- idle and long runs: clients in a child process ----------------------------------------------
async def _start_clients(url: str, sessions: int, speak: bool) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from myna.bench.soak import _client_farm; _client_farm()",
        json.dumps({"url": url, "sessions": sessions, "speak": speak}),
        stdout=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 120)  # {"connected": n} once all are up
    if not line:
        raise RuntimeError("the client process ended before connecting")
    return proc


async def _stop_clients(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()


async def idle_cost(worker, url: str, sessions: int, seconds: float, windows: int = 3) -> dict:
    """The worker's CPU with no session, then with ``sessions`` idle ones, over ``windows``
    windows of ``seconds`` each. Other processes on a shared machine inflate CPU time (caches,
    frequency); the least-disturbed window (the minimum) is the cost itself, the median what
    this run saw."""
    import psutil

    process = psutil.Process()

    async def cpu_over(window: float) -> float:
        c0, w0 = sum(process.cpu_times()[:2]), time.monotonic()
        await asyncio.sleep(window)
        return (sum(process.cpu_times()[:2]) - c0) / (time.monotonic() - w0)

    without = min([await cpu_over(seconds) for _ in range(windows)])
    proc = await _start_clients(url, sessions, speak=False)
    try:
        await asyncio.sleep(2.0)  # connections settle (DTLS, first frames)
        connected = len(worker.webrtc.peers)
        with_sessions = [await cpu_over(seconds) for _ in range(windows)]
    finally:
        await _stop_clients(proc)
    per_session = [max(c - without, 0.0) / max(connected, 1) for c in with_sessions]
    best, median = min(per_session), percentile(per_session, 50)
    return {"sessions": connected, "seconds": seconds, "windows": windows,
            "worker_cpu_cores_without": round(without, 4), "worker_cpu_cores_with": [round(c, 4) for c in with_sessions],
            "cpu_percent_per_session": round(100 * best, 2), "cpu_percent_per_session_median": round(100 * median, 2),
            "idle_sessions_per_core": round(1 / best) if best > 0 else None}


async def long_run(worker, url: str, sessions: int, minutes: float, window_minutes: float) -> dict:
    """``sessions`` speaking continuously for ``minutes``; the first and last windows compared."""
    engine = worker.default_engine
    lateness: list[tuple[float, float]] = []  # (time, lateness s) of every frame of every session
    hooked: set[int] = set()
    t0 = time.monotonic()
    samples: list[tuple[float, float]] = []  # (time, underruns so far)

    def underruns() -> float:
        return worker.metrics.registry.get_sample_value("myna_underruns_total", {"engine": engine}) or 0.0

    proc = await _start_clients(url, sessions, speak=True)
    try:
        t0 = time.monotonic()
        samples.append((0.0, underruns()))
        while time.monotonic() - t0 < minutes * 60:
            for peer in list(worker.webrtc.peers.values()):  # record every frame's deadline deviation
                track = peer.track
                if id(track) not in hooked:
                    hooked.add(id(track))
                    track.on_frame = lambda late: lateness.append((time.monotonic() - t0, late))
            await asyncio.sleep(1.0)
            samples.append((time.monotonic() - t0, underruns()))
    finally:
        await _stop_clients(proc)
    end = samples[-1][0]
    w = window_minutes * 60

    def window(lo: float, hi: float) -> dict:
        late = [1000.0 * x for t, x in lateness if lo <= t < hi]
        at = lambda t: min(samples, key=lambda s: abs(s[0] - t))[1]  # noqa: E731
        return {"from_s": round(lo), "to_s": round(hi), "frames": len(late),
                "deadline_p99_ms": round(percentile(late, 99), 2) if late else None,
                "underruns": int(at(hi) - at(lo))}

    first, last = window(0.0, min(w, end)), window(max(0.0, end - w), end)
    return {"sessions": sessions, "minutes": minutes, "window_minutes": window_minutes, "first": first, "last": last,
            "last_no_worse": (last["deadline_p99_ms"] or 0) <= 1.25 * (first["deadline_p99_ms"] or 0) + 0.5
                             and last["underruns"] <= first["underruns"]}


def _client_farm() -> None:
    """Child process: hold sessions against a worker (argv[1]: JSON ``url``, ``sessions``,
    ``speak``); prints ``{"connected": n}`` once connected, then runs until terminated."""
    from myna.rtc.client import MynaClient

    config = json.loads(sys.argv[1])

    async def hold(client: MynaClient) -> None:
        while True:
            if config["speak"]:
                await client.speak(LONG_REPLY, tokens_per_s=None, timeout=120)
                client.frames.clear()  # keep memory flat over a long run
                client.frame_pts.clear()
                client.history.clear()
            else:
                await asyncio.sleep(3600)

    async def main() -> None:
        clients = []
        for _ in range(config["sessions"]):
            client = MynaClient(config["url"])
            await client.connect()
            clients.append(client)
        print(json.dumps({"connected": len(clients)}), flush=True)
        await asyncio.gather(*(hold(c) for c in clients))

    asyncio.run(main())


# -- the command ------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    require("bench")  # psutil: the process's memory, threads and CPU
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from myna.engines.build import EngineOptions, build_engines
    from myna.rtc.ice import set_peer_timeout
    from myna.server.app import Worker
    from myna.limits import measure_capacity

    set_peer_timeout(30.0)
    worker = Worker(engines=build_engines(EngineOptions(engines=args.engine)))
    out: dict = {"machine": {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2),
                             "note": "shared machine: compare figures within this run"}}
    async with serve_in_process(worker) as url:
        if args.cycles:
            out["cycles"] = await soak_cycles(worker, url, args.cycles, min(args.warmup, args.cycles), args.concurrency)
            print_cycles(out["cycles"])
        if args.idle_sessions:
            out["idle"] = await idle_cost(worker, url, args.idle_sessions, args.idle_seconds)
            print_idle(out["idle"])
        if args.long_minutes:
            sessions = args.long_sessions or await measure_capacity(worker.engines[worker.default_engine])
            out["long_run"] = await long_run(worker, url, sessions, args.long_minutes, args.window_minutes)
            print_long(out["long_run"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def print_cycles(c: dict) -> None:
    print(f"\nSoak: {c['cycles']} cycles ({c['warmup']} warm-up), {c['concurrency']} at a time, WebRTC and WebSocket "
          f"alternately, {c['seconds']} s, {c['failures']} failed")
    print(f"{'':18}{'baseline':>10}{'end':>10}  back")
    for key in ("rss_trimmed_mb", "rss_mb", "fds", "tasks", "threads", "peer_connections", "pool_threads"):
        ok = c["back_to_baseline"].get("rss" if key == "rss_trimmed_mb" else key)
        back = "" if ok is None else "yes" if ok else "NO"
        print(f"{key:18}{c['baseline'][key]:>10}{c['end'][key]:>10}  {back}")
    print(f"RSS growth {c['rss_growth_mb']} MB after malloc_trim (target < {RSS_GROWTH_LIMIT_MB:g} MB), raw "
          f"{c['rss_raw_growth_mb']} MB; raw RSS every 100 cycles: "
          + " ".join(f"{mb:g}" for _, mb in c["rss_mb_every_100_cycles"]))


def print_idle(i: dict) -> None:
    print(f"\nIdle: {i['sessions']} connected sessions, {i['windows']} windows of {i['seconds']:g} s: worker CPU "
          f"{i['worker_cpu_cores_without']} cores without, {i['worker_cpu_cores_with']} with; "
          f"{i['cpu_percent_per_session']} % of a core per idle session (least-disturbed window; median "
          f"{i['cpu_percent_per_session_median']} %), {i['idle_sessions_per_core']} idle sessions per core")


def print_long(r: dict) -> None:
    print(f"\nLong run: {r['sessions']} sessions speaking continuously for {r['minutes']:g} min")
    for name in ("first", "last"):
        w = r[name]
        print(f"  {name:5} {r['window_minutes']:g} min ({w['from_s']}-{w['to_s']} s): deadline deviation p99 "
              f"{w['deadline_p99_ms']} ms over {w['frames']} frames, {w['underruns']} underruns")
    print(f"  last window no worse than the first: {'yes' if r['last_no_worse'] else 'NO'}")
