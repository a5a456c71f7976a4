"""A LiveKit server (and Redis) on this host, for tests, benchmarks and trying Myna in a room.

``scripts/setup.sh dev`` installs ``livekit-server`` v1.13.5 into the project's git-ignored
``.lk/bin/`` (with ``go install``) and Redis from Debian. :class:`LiveKitServer` starts one node
from a YAML config that keeps everything on this host (checked key by key against v1.13.5's
``config-sample.yaml``): signalling bound to 127.0.0.1, a fixed
``node_ip``, no external-IP discovery, a non-empty ``stun_servers`` so the server hands no
public STUN server to clients, one UDP port, no ICE/TCP port. Two nodes share a
:class:`RedisServer`; each then needs its own ports.

Media address. libwebrtc (the Rust core of the ``livekit`` Python SDK, and Chromium) ignores
loopback adapters: in a network namespace that holds only ``lo`` it gathers no candidate and
ICE times out (``wait_pc_connection timed out``; measured here). :func:`media_address` then
adds a veth pair *inside* the namespace (``mynalk0`` 10.77.0.1 ↔ ``mynalk1`` 10.77.0.2): both
ends stay in the namespace, so nothing can leave it, and the server advertises 10.77.0.1.
Outside such a namespace nothing is created and the server advertises 127.0.0.1.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from myna.bench.processes import free_port, terminate

#: The release ``scripts/setup.sh dev`` installs (the newest that ``go install`` accepts:
#: later tags carry ``replace`` directives in go.mod).
LIVEKIT_VERSION = "v1.13.5"
#: Where ``scripts/setup.sh dev`` puts the binary (git-ignored), relative to the project root.
LOCAL_BIN = Path(".lk/bin/livekit-server")
PROJECT_ROOT = Path(__file__).resolve().parents[3]

#: The key pair of servers started here (the secret is 32+ characters, as the server wants).
DEV_KEY = "myna-dev"
DEV_SECRET = "myna-dev-secret-not-for-production-0123456789"

VETH = ("mynalk0", "mynalk1")
VETH_ADDRESSES = ("10.77.0.1", "10.77.0.2")


def find_livekit_server() -> Path | None:
    """The ``livekit-server`` binary: ``$LIVEKIT_SERVER_BIN``, the project's ``.lk/bin``, or PATH."""
    for candidate in (os.environ.get("LIVEKIT_SERVER_BIN"), PROJECT_ROOT / LOCAL_BIN, shutil.which("livekit-server")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def missing_livekit_server() -> str:
    """Why no server can be started here, and what to install (for skips and errors)."""
    if shutil.which("go"):
        return "livekit-server is not installed: run `bash scripts/setup.sh dev` (it uses the Go toolchain found here)"
    return (f"livekit-server is not installed and Go is missing: install Go ≥ 1.26, then run "
            f"`bash scripts/setup.sh dev` (go install github.com/livekit/livekit-server/cmd/server@{LIVEKIT_VERSION})")


def _interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())  # this namespace's (sysfs may show the host's)


def isolated_namespace() -> bool:
    """True when this network namespace holds only ``lo`` (and our own veth pair)."""
    names = _interfaces()
    return bool(names) and all(n == "lo" or n in VETH for n in names)


def media_address() -> str:
    """The address livekit-server should advertise for media (its ``node_ip``).

    In an isolated namespace, creates the veth pair described in the module docstring (once)
    and returns 10.77.0.1; elsewhere returns 127.0.0.1.

    Raises:
        RuntimeError: the pair could not be created (``ip`` missing or no CAP_NET_ADMIN).
    """
    if not isolated_namespace():
        return "127.0.0.1"
    # Several processes of one test run (pytest-xdist) share the namespace: one creates the pair.
    with open(Path(tempfile.gettempdir()) / f"myna-veth-{os.getuid()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _create_veth()
    return VETH_ADDRESSES[0]


def _create_veth() -> None:
    if VETH[0] not in _interfaces():
        (a, b), (ip_a, ip_b) = VETH, VETH_ADDRESSES
        steps = [
            ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
            ["ip", "addr", "add", f"{ip_a}/30", "dev", a],
            ["ip", "addr", "add", f"{ip_b}/30", "dev", b],
            ["ip", "link", "set", a, "up"],
            ["ip", "link", "set", b, "up"],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(step)}: {done.stderr.strip()}")


def start_with_config(binary: Path, name: str, config: str, log_dir: Path | None) -> tuple[subprocess.Popen, Path]:
    """Write ``config`` to ``<log_dir>/<name>.yaml`` and start ``binary --config`` on it, its output
    in ``<log_dir>/<name>.log`` (``log_dir`` None: the temp dir). Returns the process and the log."""
    log_dir = log_dir or Path(tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    config_path = log_dir / f"{name}.yaml"
    config_path.write_text(config)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(binary), "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT)
    return proc, log_path


def wait_until_ready(proc: subprocess.Popen, log_path: Path, ready, timeout: float, name: str) -> None:
    """Wait until ``ready()`` is true.

    Raises:
        RuntimeError: ``proc`` exited first, or ``timeout`` s passed (the message holds the end of
            its log; the process is left to the caller to stop).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_tail(log_path)}")
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{name} was not ready within {timeout:.0f} s:\n{log_tail(log_path)}")


def log_tail(log_path: Path | None, chars: int = 3000) -> str:
    """The last ``chars`` characters of a log ("" before there is one)."""
    return log_path.read_text(errors="replace")[-chars:] if log_path and log_path.exists() else ""


@dataclass
class RedisServer:
    """``redis-server`` on 127.0.0.1 without persistence (Debian's package)."""

    port: int = field(default_factory=free_port)
    log_dir: Path | None = None
    proc: subprocess.Popen | None = field(init=False, default=None)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        """Start and wait until it answers PING.

        Raises:
            RuntimeError: redis-server is missing or did not answer within ``timeout`` s.
        """
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server; scripts/setup.sh dev does)")
        log = open((self.log_dir or Path(tempfile.gettempdir())) / f"redis-{self.port}.log", "wb")
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on {self.address}")

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 10)


@dataclass
class LiveKitServer:
    """One ``livekit-server`` node on this host.

    Args:
        node_ip: the media address it advertises (see :func:`media_address`).
        port: HTTP/WebSocket port (signalling, Twirp API, ``/agent``), bound to 127.0.0.1.
        udp_port: the one UDP port for media (bound on ``node_ip``).
        redis: a shared Redis for several nodes (None: a single node, in-process routing).
        keys: API key → secret.
        log_dir: where ``livekit-<port>.log`` goes (default: the temp dir).
        binary: the server binary (default: :func:`find_livekit_server`).
    """

    node_ip: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    udp_port: int = field(default_factory=lambda: free_port(socket.SOCK_DGRAM))
    redis: RedisServer | None = None
    keys: dict[str, str] = field(default_factory=lambda: {DEV_KEY: DEV_SECRET})
    log_dir: Path | None = None
    binary: Path | None = None
    proc: subprocess.Popen | None = field(init=False, default=None)
    log_path: Path | None = field(init=False, default=None)

    @property
    def url(self) -> str:
        """The WebSocket URL clients and workers connect to."""
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        """The server's YAML config (strict: every key is one v1.13.5 knows)."""
        keys = "\n".join(f"  {k}: {v}" for k, v in self.keys.items())
        redis = f"redis:\n  address: {self.redis.address}\n" if self.redis else ""
        return (
            f"port: {self.port}\n"
            "bind_addresses: [127.0.0.1]\n"
            "rtc:\n"
            f"  udp_port: {self.udp_port}\n"
            "  tcp_port: 0\n"  # no ICE/TCP listener (it would bind every interface)
            f"  node_ip: {self.node_ip}\n"
            "  use_external_ip: false\n"
            "  enable_loopback_candidate: true\n"
            f"  ips: {{includes: [{self.node_ip}/32]}}\n"
            "  stun_servers: [127.0.0.1:3478]\n"  # non-empty: no public STUN handed to clients
            f"keys:\n{keys}\n"
            f"{redis}"
            "logging: {level: info, pion_level: warn}\n"
            "room: {empty_timeout: 30, departure_timeout: 5}\n"
        )

    def start(self, timeout: float = 30.0) -> "LiveKitServer":
        """Start the node and wait until ``GET /`` answers 200 (node stats are fresh).

        Raises:
            RuntimeError: no binary, or the node exited or was not ready within ``timeout`` s
                (the message holds the end of its log).
        """
        binary = self.binary or find_livekit_server()
        if binary is None:
            raise RuntimeError(missing_livekit_server())
        self.proc, self.log_path = start_with_config(binary, f"livekit-{self.port}", self.config(), self.log_dir)
        try:
            wait_until_ready(self.proc, self.log_path, self._answers, timeout, "livekit-server")
        except RuntimeError:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.http_url, timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    @property
    def node_id(self) -> str | None:
        """The node's id (``ND_…``, from its start-up log line; None before it started)."""
        text = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
        marker = '"nodeID": "'
        at = text.find(marker)
        return text[at + len(marker):].split('"', 1)[0] if at >= 0 else None

    def log_tail(self, chars: int = 3000) -> str:
        return log_tail(self.log_path, chars)

    def kill(self) -> None:
        """Kill the node at once (SIGKILL): a server dying, for failure tests."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 10)
