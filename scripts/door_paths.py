"""Which of the project's files and functions one turn runs through, door by door (measured).

    unshare -n sh -c 'ip link set lo up; .venv/bin/python scripts/door_paths.py [--checkout DIR] [--json OUT]'

Each door serves one short turn (``"Hello there."`` in one text chunk, then ``end_turn``) in a
process of its own, profiled (``sys.setprofile`` on every thread) from the moment the client has
its ``ready`` to the moment it has ``turn_done``; every function of the checkout's package that ran
is counted (model code included: the embedded voice's engine, the text front end, playout). The
doors: WebRTC (``myna serve`` and an aiortc client), the WebSocket (the same worker), a LiveKit
room (``myna room`` and a Python participant; needs livekit-server, ``scripts/setup.sh dev``) and
the in-process plug-in backend. ``--checkout`` measures another checkout (an older commit, say)
with this one's clients: the doors' contract is the same. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TEXT = "Hello there."
_TRACE_ENV = "MYNA_DOOR_TRACE"  # where the traced child writes what it ran


# -- the traced child ----------------------------------------------------------------------
def _trace_child(roots: list[str], argv: list[str]) -> None:
    """Run ``python -m ARGV`` (or a door script) recording the functions under ``roots`` that run
    between SIGUSR1 and SIGUSR2; the record goes to ``$MYNA_DOOR_TRACE`` at SIGUSR2."""
    import runpy
    import threading

    seen: set[tuple[str, str]] = set()
    state = {"on": False}
    ours: dict[str, str | None] = {}  # a code object's file → its real path, if the checkout's

    def profile(frame, event, arg):
        if state["on"] and event == "call":
            name = frame.f_code.co_filename
            if name not in ours:  # (an older layout is imported through links: follow them)
                real = os.path.realpath(name)
                ours[name] = real if real.startswith(tuple(roots)) else None
            if ours[name] is not None:
                seen.add((ours[name], frame.f_code.co_qualname))
        return None

    def start(*_):
        seen.clear()
        state["on"] = True

    def stop(*_):
        state["on"] = False
        Path(os.environ[_TRACE_ENV]).write_text(json.dumps(sorted(seen)))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.setprofile(profile)
    threading.setprofile(profile)
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


class Traced:
    """A traced child process running ``python -m MODULE ARGS`` from ``checkout``."""

    def __init__(self, checkout: Path, module: str, *args: str, env: dict | None = None, log: Path):
        self.checkout = checkout
        self.record = Path(tempfile.mktemp(suffix=".json"))
        roots = [str(checkout / d) for d in ("plugin", "server", "web")]
        code = (f"import sys; sys.path.insert(0, {str(HERE / 'scripts')!r}); import door_paths; "
                f"door_paths._trace_child({roots!r}, {[module, *args]!r})")
        self._log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {}), _TRACE_ENV: str(self.record)}, cwd=checkout)

    def start(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)

    async def stop(self) -> list[tuple[str, str]]:
        self.proc.send_signal(signal.SIGUSR2)
        for _ in range(100):
            if self.record.exists():
                break
            await asyncio.sleep(0.05)
        ran = [(str(Path(p).relative_to(self.checkout)), f) for p, f in json.loads(self.record.read_text())]
        self.record.unlink()
        return ran

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def _environment(checkout: Path) -> dict:
    """A child's environment: the checkout's package importable as from an install."""
    return {"PYTHONPATH": os.pathsep.join(str(checkout / d) for d in _package_roots(checkout))}


def _package_roots(checkout: Path) -> list[str]:
    """Folders to put on sys.path so ``import myna`` finds this checkout's package."""
    if (checkout / "plugin" / "myna").is_dir():
        return ["plugin", "server", "web"]
    # An older layout (plugin/ *is* the package): a link tree named myna.
    tree = Path(tempfile.mkdtemp()) / "myna"
    tree.mkdir()
    for entry in (checkout / "plugin").iterdir():
        (tree / entry.name).symlink_to(entry)
    (tree / "server").symlink_to(checkout / "server")
    (tree / "web").symlink_to(checkout / "web")
    return [str(tree.parent)]


# -- the doors -----------------------------------------------------------------------------
async def _worker(checkout: Path, logs: Path) -> tuple[Traced, str]:
    from myna.bench.processes import free_port
    from myna.rtc.client import wait_until_ready

    port = free_port()
    worker = Traced(checkout, "myna.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--engine", "piper",
                    "--phrase-cache-mb", "0", "--max-sessions", "4", env=_environment(checkout), log=logs / "serve.log")
    url = f"http://127.0.0.1:{port}"
    await wait_until_ready(url, timeout=120.0)
    return worker, url


async def webrtc(worker: Traced, url: str) -> list:
    from myna.rtc.client import MynaClient

    async with MynaClient(url, engine="piper") as client:
        await asyncio.sleep(0.5)
        worker.start()
        await client.speak(TEXT, tokens_per_s=None)
        return await worker.stop()


async def websocket(worker: Traced, url: str) -> list:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.ws_connect(url.replace("http", "ws") + "/v1/tts/stream") as ws:
        assert json.loads((await ws.receive()).data)["type"] == "ready"
        worker.start()
        await ws.send_str(json.dumps({"type": "text", "turn_id": "t", "text": TEXT}))
        await ws.send_str(json.dumps({"type": "end_turn", "turn_id": "t"}))
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "turn_done":
                break
        return await worker.stop()


async def room(checkout: Path, logs: Path) -> list:
    from myna.bench.livekit_server import DEV_KEY, DEV_SECRET, LiveKitServer, media_address
    from myna.room.client import RoomClient
    from myna.room.tokens import participant_token

    node = LiveKitServer(node_ip=media_address(), log_dir=logs).start()
    name = f"door-{os.getpid()}"
    myna = Traced(checkout, "myna.cli", "room", "--url", node.url, "--room", name, "--identity", "bot",
                  env={**_environment(checkout), "LIVEKIT_API_KEY": DEV_KEY, "LIVEKIT_API_SECRET": DEV_SECRET},
                  log=logs / "room.log")
    try:
        deadline = time.monotonic() + 120
        while "myna: in room" not in (logs / "room.log").read_text(errors="replace"):
            assert time.monotonic() < deadline and myna.proc.poll() is None, (logs / "room.log").read_text()[-2000:]
            await asyncio.sleep(0.1)
        async with RoomClient(node.url, participant_token(DEV_KEY, DEV_SECRET, name, "alice"), myna_identity="bot") as client:
            myna.start()
            await client.speak(TEXT, tokens_per_s=None)
            return await myna.stop()
    finally:
        myna.close()
        node.stop()


_PLUGIN = """
import asyncio, os, signal
from myna.integrations.backend import LocalBackend

async def main():
    backend = LocalBackend()
    await backend.start()
    os.kill(os.getpid(), signal.SIGUSR1)
    turn = await backend.open_turn()
    await turn.push_text({text!r})
    await turn.end_input()
    async for _ in turn:
        pass
    os.kill(os.getpid(), signal.SIGUSR2)
    await backend.aclose()

asyncio.run(main())
"""


async def plugin(checkout: Path, logs: Path) -> list:
    script = logs / "door_plugin.py"
    script.write_text(_PLUGIN.format(text=TEXT))
    child = Traced(checkout, "door_plugin", env={**_environment(checkout), "PYTHONPATH": f"{logs}{os.pathsep}" +
                                                 _environment(checkout)["PYTHONPATH"]}, log=logs / "plugin.log")
    try:
        await asyncio.to_thread(child.proc.wait, 120)
        ran = [(str(Path(p).relative_to(checkout)), f) for p, f in json.loads(child.record.read_text())]
        child.record.unlink()
        return ran
    finally:
        child.close()


async def measure(checkout: Path) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="door-paths-"))
    out = {}
    for door, run in (("webrtc", webrtc), ("websocket", websocket)):  # a worker each: nothing of the other's runs
        worker, url = await _worker(checkout, logs)
        try:
            out[door] = await run(worker, url)
        finally:
            worker.close()
    from myna.bench.livekit_server import find_livekit_server, missing_livekit_server

    if find_livekit_server() is not None:
        out["room"] = await room(checkout, logs)
    else:
        print(f"room door skipped: {missing_livekit_server()}", file=sys.stderr)
    out["plugin"] = await plugin(checkout, logs)
    return out


def summary(ran: list) -> dict:
    files = sorted({path for path, _ in ran})
    return {"files": len(files), "functions": len(ran), "paths": files}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", type=Path, default=HERE, help="the checkout whose doors are measured (default: this one)")
    p.add_argument("--json", metavar="OUT", help="write every door's files and functions here")
    args = p.parse_args()
    result = asyncio.run(measure(args.checkout.resolve()))
    for door, ran in result.items():
        s = summary(ran)
        print(f"{door:<10} {s['files']:>3} files {s['functions']:>4} functions")
        for path in s["paths"]:
            print(f"    {path}")
    if args.json:
        Path(args.json).write_text(json.dumps({door: summary(ran) | {"ran": ran} for door, ran in result.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
