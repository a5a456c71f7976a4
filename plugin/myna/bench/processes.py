"""Processes a network benchmark runs beside itself: servers on loopback, and busy CPU load.

:class:`Server` starts a Python module that serves HTTP on a free 127.0.0.1 port (a Myna worker,
a peer's pipeline) and waits until its ``GET /healthz`` answers 200. :class:`BusyLoad` keeps N
processes spinning on the CPU for the length of a run, so that a loaded host is reproducible
(``myna bench ttfa --load N``).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far, from ``/proc``; None where it
    cannot be read (the process has ended, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, IndexError, ValueError):
        return None


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that was free a moment ago (TCP, or UDP with ``socket.SOCK_DGRAM``)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def random_port_range(low: int, high: int, size: int) -> tuple[int, int]:
    """A random range of ``size`` ports within [low, high), first and last (for a program that takes
    a range, such as an RTP port range; two of them rarely meet, and nothing checks they are free)."""
    start = random.randrange(low, high - size)
    return start, start + size - 1


class Server:
    """``python -m MODULE ARGS... --port P`` on a free loopback port, its output in a log file.

    Args:
        argv: the module and its arguments (it must take ``--port`` last and serve ``GET /healthz``).
        name: what to call it in errors.
        timeout: seconds to wait for ``/healthz`` to answer 200.
        log_path: where its output goes (default: a new temporary file).
        env: added to its environment.

    Raises:
        SystemExit: the server exited or did not become ready (the log's tail is in the message).
    """

    def __init__(self, argv: list[str], name: str, timeout: float = 180.0, log_path: str | None = None,
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if log_path is None:
            with tempfile.NamedTemporaryFile(prefix=f"myna-bench-{name}-", suffix=".log", delete=False) as f:
                log_path = f.name
        self.log_path = Path(log_path)
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", *argv, "--port", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        with open(self.log_path, errors="replace") as f:
            tail = f.read()[-2000:]
        raise SystemExit(f"the {name} did not become ready:\n{tail}")

    def stop(self) -> int:
        """Terminate it (kill after 15 s); returns its exit status."""
        return terminate(self.proc, 15)


def terminate(proc: subprocess.Popen, timeout: float, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` to a child still running, wait up to ``timeout`` seconds, then kill it;
    returns its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


class BusyLoad:
    """``n`` processes that spin on the CPU until :meth:`stop` (a context manager).

    Each is a plain Python busy loop at normal priority: on a host with C cores, N of them leave
    the benchmark max(0, C − N) idle cores, like other work sharing the machine.
    """

    def __init__(self, n: int):
        self.n = n
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> "BusyLoad":
        self._procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait()
        self._procs = []
