"""``myna bench ttfa --transport livekit``: Myna through a LiveKit room beside the direct path.

One Myna process (:func:`serve_both`) serves both transports with one loaded engine: the
direct WebRTC path (``myna serve``'s app, aiortc) and a LiveKit room (``myna worker``'s
dispatch machinery, the SDK's native Opus and pacing), against a ``livekit-server`` started
here. Everything is measured side by side in one run:

1. **Perceived TTFA at 1 session.** The same text at the same token rate, turns alternating
   between a direct session (:class:`myna.rtc.client.MynaClient`) and a room participant
   (:class:`myna.room.client.RoomClient`, text over ``myna.text``); first text chunk sent →
   first audible sample received (myna.audio.onset). Each client is its transport's natural
   receiver (aiortc; libwebrtc with its jitter buffer).
2. **Interrupt.** Mid-turn barge-ins: how long after the interrupt returned (the RPC's answer
   in the room; the data-channel send on the direct path) audio of the turn was still heard.
3. **CPU per speaking session.** N sessions per path, each speaking one long reply; over a
   window where all N speak, the Myna process's CPU time (``time.process_time``, all threads,
   the SDK's native ones included) and its synthesis threads' CPU time (from /proc). Send path =
   process − synthesis; sessions per core = N × window ÷ CPU seconds. The send path is split
   into the SDK's native threads (libwebrtc and tokio: Opus, pacing, RTP; ``native_*``) and the
   rest (Python: Myna's pacer and the SDK's Python side on the job threads), to show whose CPU
   it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

AGENT_NAME = "myna-bench"
LONG_TEXT = ("Sure, here is the whole plan for the trip. We leave on Monday at eight, drive north along the "
             "coast, and stop for lunch in the old harbour town. In the afternoon we walk along the cliffs, "
             "then check in at the small hotel by the lighthouse. On Tuesday we take the ferry to the island, "
             "rent bicycles, and ride around it before the evening boat back. ") * 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--transport livekit`` options of ``myna bench ttfa``."""
    g = p.add_argument_group("--transport livekit")
    g.add_argument("--interrupts", type=int, default=5, help="barge-ins per path (default: %(default)s)")
    g.add_argument("--cpu-sessions", type=int, default=4, help="speaking sessions per path for CPU (default: %(default)s)")
    g.add_argument("--cpu-window", type=float, default=8.0, help="seconds of CPU measurement per path (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    """Entry point of ``myna bench ttfa --transport livekit``."""
    from myna.extras import require
    from myna.bench.livekit_server import find_livekit_server, missing_livekit_server

    require("livekit")
    if find_livekit_server() is None:
        raise SystemExit(f"bench ttfa --transport livekit: {missing_livekit_server()}")
    engine = args.engines.split(",")[0].strip()
    result = asyncio.run(_run(args, engine))
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


async def _run(args: argparse.Namespace, engine: str) -> dict:
    from myna.bench.livekit_server import LiveKitServer, media_address

    node = LiveKitServer(node_ip=media_address()).start()
    host = MynaHost.start(node, engine)
    try:
        rate = args.token_rate or None
        ttfa = await _ttfa(host, node, args.text, rate, args.turns)
        interrupts = await _interrupts(host, node, args.interrupts)
        cpu = {path: await _cpu(host, node, path, args.cpu_sessions, args.cpu_window) for path in ("direct", "room")}
    finally:
        host.stop()
        node.stop()
    return {"benchmark": "ttfa-livekit", "engine": engine, "text": args.text, "token_rate": args.token_rate,
            "turns": args.turns, "cpus": os.cpu_count(), "note": "shared machine: compare the paths within this run",
            "ttfa": ttfa, "interrupt": interrupts, "cpu": cpu}


# -- 1. TTFA ------------------------------------------------------------------------------
async def _ttfa(host: "MynaHost", node, text: str, rate: float | None, turns: int) -> dict:
    from myna.rtc.client import MynaClient

    results: dict[str, list] = {"direct": [], "room": []}
    async with MynaClient(host.url) as direct, room_client(node.url) as room:
        for _ in range(turns):
            results["direct"].append(await direct.speak(text, tokens_per_s=rate))
            results["room"].append(await room.speak(text, tokens_per_s=rate))
            _progress(f"ttfa direct {_ms(results['direct'][-1].perceived_ttfa_ms)}, room {_ms(results['room'][-1].perceived_ttfa_ms)}")
    return {path: {"perceived_ttfa_ms": _stats([r.perceived_ttfa_ms for r in rs if r.perceived_ttfa_ms is not None]),
                   "server_ttfa_ms": _stats([r.server_ttfa_ms for r in rs if r.server_ttfa_ms is not None]),
                   "silent_turns": sum(r.perceived_ttfa_ms is None for r in rs)}
            for path, rs in results.items()}


# -- 2. interrupt ---------------------------------------------------------------------------
async def _interrupts(host: "MynaHost", node, trials: int) -> dict:
    from myna.rtc.client import MynaClient

    lags: dict[str, list[float]] = {"direct": [], "room": []}
    async with MynaClient(host.url) as direct, room_client(node.url) as room:
        for i in range(trials):
            for path, client in (("direct", direct), ("room", room)):
                lags[path].append(await _one_interrupt(path, client, f"i{i}"))
                await asyncio.sleep(0.3)  # the next turn starts in silence
        tails = host.cpu()["room_interrupt_tails_ms"]
        _progress(f"interrupt lag direct {lags['direct']}, room {lags['room']}; room source tails {tails}")
    result = {path: {"lag_ms": _stats(v), "max_ms": round(max(v), 1) if v else None} for path, v in lags.items()}
    result["room"]["sender_tail_ms"] = _stats(tails)
    result["room"]["sender_tail_max_ms"] = max(tails) if tails else None
    return result


async def _one_interrupt(path: str, client, turn_id: str) -> float:
    """ms from the interrupt returning to the end of the last audible block of the turn."""
    from myna.audio.onset import first_audible_sample

    if path == "room":
        _, _, sender = await client.start_turn(LONG_TEXT, tokens_per_s=None, turn_id=turn_id)
    else:
        client.send({"type": "text", "turn_id": turn_id, "text": LONG_TEXT})
    await _event(client, "first_audio", turn_id)
    await asyncio.sleep(0.7)
    if path == "room":
        await client.interrupt()
    else:
        client.send({"type": "interrupt"})
    returned = time.monotonic()
    await _event(client, "turn_done", turn_id)
    if path == "room":
        await sender
    await asyncio.sleep(0.5)
    last = returned
    for arrival, pcm in client.frames:
        if arrival > returned - 0.5 and first_audible_sample(pcm, 48_000) is not None:
            last = max(last, arrival)
    return round(1000.0 * (last - returned), 1)


async def _event(client, kind: str, turn_id: str, timeout: float = 60.0) -> dict:
    """Wait until ``client`` (either kind) has received event ``kind`` of ``turn_id``."""
    deadline = time.monotonic() + timeout
    while True:
        for event in client.history:
            if event["type"] == kind and event.get("turn_id") == turn_id:
                return event
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {kind} for turn {turn_id}")
        await asyncio.sleep(0.01)


# -- 3. CPU per speaking session ---------------------------------------------------------------
async def _cpu(host: "MynaHost", node, path: str, sessions: int, window: float) -> dict:
    from myna.rtc.client import MynaClient

    clients = [MynaClient(host.url) if path == "direct" else room_client(node.url) for _ in range(sessions)]
    await asyncio.gather(*(c.__aenter__() for c in clients))
    try:
        for i, client in enumerate(clients):
            if path == "direct":
                client.send({"type": "text", "turn_id": f"cpu{i}", "text": LONG_TEXT})
                client.send({"type": "end_turn", "turn_id": f"cpu{i}"})
            else:
                await client.start_turn(LONG_TEXT, tokens_per_s=None, turn_id=f"cpu{i}")
        await asyncio.gather(*(_event(c, "first_audio", f"cpu{i}") for i, c in enumerate(clients)))
        await asyncio.sleep(1.0)
        before = host.cpu()
        await asyncio.sleep(window)
        after = host.cpu()
        done = [e for c in clients for e in c.history if e["type"] == "turn_done"]
    finally:
        await asyncio.gather(*(c.__aexit__(None, None, None) for c in clients), return_exceptions=True)
    process = after["process_s"] - before["process_s"]
    synthesis = after["synthesis_s"] - before["synthesis_s"]
    native = _grown(before["native_threads_s"], after["native_threads_s"])
    speaking = sessions * (after["at"] - before["at"])
    row = {"sessions": sessions, "window_s": round(after["at"] - before["at"], 2),
           "process_cpu_s": round(process, 3), "synthesis_cpu_s": round(synthesis, 3),
           "cpu_ms_per_session_s": round(1000 * process / speaking, 2),
           "send_cpu_ms_per_session_s": round(1000 * (process - synthesis) / speaking, 2),
           "native_cpu_ms_per_session_s": round(1000 * native / speaking, 2),
           "sessions_per_core": round(speaking / process, 1) if process > 0 else None,
           "send_sessions_per_core": round(speaking / (process - synthesis), 1) if process > synthesis else None,
           "turns_ended_in_window": len(done)}
    if path == "room":  # the source ran dry mid-speech (a gap filled with silence)
        row["source_gaps"] = after["room_source_gaps"] - before["room_source_gaps"]
    _progress(f"cpu {path}: {row}")
    return row


def room_client(url: str):
    """A :class:`~myna.room.client.RoomClient` (not connected yet) in a new room of the
    LiveKit server at ``url``, with Myna (agent :data:`AGENT_NAME`) dispatched into it."""
    from myna.room.client import RoomClient
    from myna.room.tokens import participant_token
    from myna.bench.livekit_server import DEV_KEY, DEV_SECRET

    room = f"bench-{os.urandom(4).hex()}"
    return RoomClient(url, participant_token(DEV_KEY, DEV_SECRET, room, "listener", agent_dispatch=AGENT_NAME))


# -- the Myna process ------------------------------------------------------------------------
class MynaHost:
    """The Myna process under test (a subprocess running :func:`serve_both`)."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc, self.url, self.log_path = proc, url, log_path

    @classmethod
    def start(cls, node, engine: str) -> "MynaHost":
        from myna.bench.livekit_server import DEV_KEY, DEV_SECRET
        from myna.bench.processes import free_port

        port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="myna-bench-host-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LIVEKIT_API_KEY": DEV_KEY, "LIVEKIT_API_SECRET": DEV_SECRET}
        proc = subprocess.Popen([sys.executable, "-m", "myna.bench.room", "--port", str(port), "--livekit-url", node.url,
                                 "--engine", engine], stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        host = cls(proc, f"http://127.0.0.1:{port}", log.name)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if host._get("/bench/cpu").get("registered"):
                    return host
            except OSError:
                pass
            time.sleep(0.3)
        host.stop()
        with open(log.name, errors="replace") as f:
            raise SystemExit(f"bench ttfa: the Myna process did not become ready:\n{f.read()[-3000:]}")

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as r:
            return json.loads(r.read())

    def cpu(self) -> dict:
        return self._get("/bench/cpu")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_both(argv: list[str] | None = None) -> int:
    """The Myna process: ``myna serve``'s app on ``--port`` and ``myna worker`` (agent name
    :data:`AGENT_NAME`) on ``--livekit-url``, one engine, plus ``GET /bench/cpu``."""
    import logging

    from aiohttp import web

    from myna.engines.build import EngineOptions, build_engines
    from myna.rtc.ice import enable_loopback_candidates
    from myna.server.app import Worker, create_app

    p = argparse.ArgumentParser(prog="myna.bench.room")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--livekit-url", required=True)
    p.add_argument("--engine", default="piper")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    enable_loopback_candidates()

    async def main() -> None:
        from myna.room.worker import RoomWorker, agent_server

        worker = Worker(engines=build_engines(EngineOptions(engines=args.engine)))
        app = create_app(worker)
        state = {"registered": False}

        async def cpu(request: web.Request) -> web.Response:
            outputs = [agent.output for agent in list(rooms.agents) if agent.output]
            tails = [ms for output in outputs for ms in output.interrupt_tails_ms]
            return web.json_response({"registered": state["registered"] and worker.ready, "at": time.monotonic(),
                                      "process_s": time.process_time(), "synthesis_s": _threads_cpu("piper"),
                                      "native_threads_s": _native_threads_cpu(),
                                      "room_interrupt_tails_ms": tails,
                                      "room_source_gaps": sum(output.source_gaps for output in outputs)})

        app.router.add_get("/bench/cpu", cpu)
        rooms = RoomWorker(worker.engines, capacity=64, sessions=worker.sessions)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
        await worker.loading
        server = agent_server(rooms, args.livekit_url, os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"],
                              agent_name=AGENT_NAME)
        server.on("worker_registered", lambda *_: state.update(registered=True))
        try:
            await server.run()
        finally:
            await server.aclose()
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    return 0


def _threads_cpu(prefix: str) -> float:
    """CPU seconds (user + system) of this process's threads named ``prefix…`` (the engine's
    synthesis threads: onnxruntime runs on the calling thread), from /proc."""
    return sum(_thread_cpu(t.native_id) for t in threading.enumerate() if t.name.startswith(prefix) and t.native_id)


def _native_threads_cpu() -> dict[str, float]:
    """CPU seconds by thread id (a string: JSON keys) of this process's named native threads:
    those Python did not start and that named themselves (libwebrtc's ``AudioEncoderQueue``,
    ``network_thread``…, tokio's workers); unnamed ones (e.g. onnxruntime's pool) keep the
    process's name and are left out."""
    python = {t.native_id for t in threading.enumerate()}
    own_name = _thread_comm(os.getpid())
    return {tid: _thread_cpu(int(tid)) for tid in os.listdir("/proc/self/task")
            if int(tid) not in python and _thread_comm(int(tid)) not in (own_name, None)}


def _grown(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds threads spent between two :func:`_native_threads_cpu` readings: each live
    thread's growth (a thread that ended took its count with it: summing the totals would go
    down; one that started counts whole)."""
    return sum(max(0.0, cpu - before.get(tid, 0.0)) for tid, cpu in after.items())


def _thread_comm(tid: int) -> str | None:
    try:
        with open(f"/proc/self/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:  # the thread just ended
        return None


def _thread_cpu(tid: int) -> float:
    """CPU seconds (user + system) of thread ``tid`` of this process (0 once it has ended)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


# -- output -------------------------------------------------------------------------------
def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    p25, p50, p75, p95 = np.percentile(values, [25, 50, 75, 95])
    return {"n": len(values), "p50": round(float(p50), 1), "p25": round(float(p25), 1), "p75": round(float(p75), 1),
            "p95": round(float(p95), 1)}


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f} ms"


def _progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def format_table(result: dict) -> str:
    """Both paths side by side: TTFA, interrupt, CPU per speaking session."""
    t, i, c = result["ttfa"], result["interrupt"], result["cpu"]
    rate = f"{result['token_rate']:.0f} tokens/s" if result["token_rate"] else "all at once"
    lines = [f"Direct WebRTC (aiortc) vs a LiveKit room (livekit-server {_server_version()}), engine {result['engine']}, "
             f"text at {rate}, {result['cpus']} CPUs (shared machine: compare within this run)",
             f"{'path':<8} {'TTFA p50':>9} {'p25–p75':>11} {'p95':>7} {'server p50':>10} {'n':>3} "
             f"{'interrupt lag p50/max':>22} {'CPU ms/s':>9} {'send ms/s':>10} {'sessions/core':>14} {'send-only':>10}"]
    for path in ("direct", "room"):
        p, s = t[path]["perceived_ttfa_ms"], t[path]["server_ttfa_ms"]
        lag = i[path]["lag_ms"]
        row = c[path]
        lines.append(
            f"{path:<8} {_fmt(p.get('p50')):>6} ms {_fmt(p.get('p25')) + '–' + _fmt(p.get('p75')):>11} {_fmt(p.get('p95')):>4} ms "
            f"{_fmt(s.get('p50')):>7} ms {p['n']:>3} {_fmt(lag.get('p50')) + ' / ' + _fmt(i[path]['max_ms']) + ' ms':>22} "
            f"{row['cpu_ms_per_session_s']:>9} {row['send_cpu_ms_per_session_s']:>10} {_fmt(row['sessions_per_core'], 1):>14} "
            f"{_fmt(row['send_sessions_per_core'], 1):>10}")
    d, r = t["direct"]["perceived_ttfa_ms"], t["room"]["perceived_ttfa_ms"]
    if d.get("n") and r.get("n"):
        lines.append(f"Room TTFA p50 − direct TTFA p50 = {r['p50'] - d['p50']:+.0f} ms (target ≤ +30 ms).")
    if c["direct"]["sessions_per_core"] and c["room"]["sessions_per_core"]:
        lines.append(f"Speaking sessions per core, room ÷ direct: {c['room']['sessions_per_core'] / c['direct']['sessions_per_core']:.2f}× "
                     f"with synthesis, {(c['room']['send_sessions_per_core'] or 0) / (c['direct']['send_sessions_per_core'] or 1):.2f}× "
                     f"send path only (target ≥ 3×; {c['room']['sessions']} sessions, {c['room']['window_s']} s windows).")
    r = c["room"]
    if r.get("native_cpu_ms_per_session_s") is not None:
        lines.append(f"Room send path per session: {r['native_cpu_ms_per_session_s']} ms/s in the SDK's native threads "
                     f"(libwebrtc, tokio), {round(r['send_cpu_ms_per_session_s'] - r['native_cpu_ms_per_session_s'], 2)} ms/s "
                     f"in Python threads (Myna's pacer and the SDK's Python side); direct send path "
                     f"{c['direct']['send_cpu_ms_per_session_s']} ms/s.")
    lines.append("TTFA: first text chunk sent → first audible sample received. Interrupt lag: interrupt returned → end of "
                 "the last audible block of the turn received. CPU: the Myna process, per speaking session per second.")
    return "\n".join(lines)


def _fmt(value, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _server_version() -> str:
    from myna.bench.livekit_server import LIVEKIT_VERSION

    return LIVEKIT_VERSION


if __name__ == "__main__":
    sys.exit(serve_both())
