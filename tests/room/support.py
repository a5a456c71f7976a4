"""Helpers of the LiveKit tests (fixtures live in conftest.py, which test modules cannot import)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from inprocess import quick_start_args
from myna.bench.livekit_server import DEV_KEY, DEV_SECRET, LiveKitServer
from myna.bench.processes import terminate

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def room_name() -> str:
    return f"room-{uuid.uuid4().hex[:8]}"


def token(room: str, identity: str, **kw) -> str:
    from myna.room.tokens import participant_token

    return participant_token(DEV_KEY, DEV_SECRET, room, identity, **kw)


@contextlib.asynccontextmanager
async def myna_in_room(node: LiveKitServer, room: str, engine, identity: str = "myna", ttl_s: float | None = None, **kw):
    """Myna (in this process, on this loop) joined to ``room`` with a token valid ``ttl_s``
    seconds (None: 6 h); yields its RoomAgent (keyword arguments go to it)."""
    from livekit import rtc

    from myna.room.agent import RoomAgent
    from myna.room.tokens import participant_token
    from myna.sessions import Sessions

    lk_room = rtc.Room()
    agent = RoomAgent(lk_room, engine, kw.pop("sessions", None) or Sessions(), **kw)
    agent.attach()
    await lk_room.connect(node.url, participant_token(DEV_KEY, DEV_SECRET, room, identity, ttl_s=ttl_s))
    await agent.start()
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        yield agent
    finally:
        agent.stop()
        await task


class Myna:
    """A ``myna room`` or ``myna worker`` subprocess with the dev credentials; output in a log.
    :func:`inprocess.quick_start_args` unless the arguments say otherwise."""

    def __init__(self, *args: str, env: dict | None = None):
        args = (*args, *quick_start_args(args[0], args))
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / f"myna-{args[0]}-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", "LIVEKIT_API_KEY": DEV_KEY, "LIVEKIT_API_SECRET": DEV_SECRET}
        self.proc = subprocess.Popen([sys.executable, "-m", "myna.cli", *args], stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**environment, **(env or {})})

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def wait_for(self, text: str, count: int = 1, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.output().count(text) < count:
            assert self.proc.poll() is None or self.output().count(text) >= count, self.output()[-3000:]
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()[-3000:]}"
            await asyncio.sleep(0.1)

    async def exit_code(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            assert time.monotonic() < deadline, self.output()[-3000:]
            await asyncio.sleep(0.1)
        self._log.close()
        return self.proc.returncode

    def stop(self) -> int:
        terminate(self.proc, 30)
        self._log.close()
        return self.proc.returncode
