"""LiveKit's SIP service (``livekit-sip``) beside a ``livekit-server`` on this host, and a phone line.

``livekit-sip`` turns each SIP call into a participant of kind SIP in a LiveKit room: it answers
INVITEs on its SIP port, asks the server (over the Redis bus they share) which inbound trunk the
called number belongs to and which dispatch rule puts the call in which room, joins that room,
and carries the call's audio both ways (G.711 at 8 kHz on the phone side, Opus at 48 kHz in the
room: the resampling is the bridge's). ``scripts/setup_livekit.sh dev`` builds it into
``.lk/bin`` from its Go module (v1.0.0, the newest the module proxy serves in full here), with
Debian's libopus and libsoxr.

:func:`open_phone_line` is what an operator does once: an inbound trunk for a number and a
dispatch rule that puts each call in a room of its own and dispatches an agent there (here,
``myna worker`` under its agent name). docs/phone.md shows the same with the
``lk`` CLI.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from myna.bench.livekit_server import DEV_KEY, DEV_SECRET, LiveKitServer, log_tail, start_with_config, wait_until_ready
from myna.bench.processes import free_port, random_port_range, terminate

#: The livekit-sip module version ``scripts/setup_livekit.sh`` builds.
LIVEKIT_SIP_VERSION = "v1.0.0"
_ROOT = Path(__file__).resolve().parents[3]


def find_livekit_sip() -> Path | None:
    """The ``livekit-sip`` binary of ``scripts/setup_livekit.sh dev`` (``.lk/bin``), if built."""
    path = _ROOT / ".lk" / "bin" / "livekit-sip"
    return path if path.exists() else None


def missing_livekit_sip() -> str:
    """What to run when ``livekit-sip`` is missing."""
    return ("livekit-sip is not built: run `bash scripts/setup.sh dev` (it builds "
            f"github.com/livekit/sip {LIVEKIT_SIP_VERSION} with Go and Debian's libopus-dev and libsoxr-dev)")


@dataclass
class SipBridge:
    """One ``livekit-sip`` for ``node`` (which must use Redis: trunks and rules live there).

    Args:
        node: the running server; the bridge joins rooms on it with the dev key pair.
        address: the address it announces in SIP and SDP and binds RTP on (the node's media
            address inside the tests' namespace).
        sip_port: its SIP port (UDP and TCP).
        rtp_ports: the UDP port range for calls' media.
        log_dir: where ``livekit-sip-<port>.log`` goes (default: the temp dir).
    """

    node: LiveKitServer
    address: str = "127.0.0.1"
    sip_port: int = field(default_factory=lambda: free_port(socket.SOCK_DGRAM))
    rtp_ports: tuple[int, int] = field(default_factory=lambda: random_port_range(40000, 49000, 200))
    log_dir: Path | None = None
    proc: subprocess.Popen | None = field(init=False, default=None)
    log_path: Path | None = field(init=False, default=None)

    def config(self) -> str:
        """The bridge's YAML config."""
        if self.node.redis is None:
            raise ValueError("livekit-sip needs a livekit-server with Redis (LiveKitServer(redis=...))")
        return (
            f"api_key: {DEV_KEY}\napi_secret: {DEV_SECRET}\nws_url: {self.node.url}\n"
            f"redis:\n  address: {self.node.redis.address}\n"
            f"sip_port: {self.sip_port}\n"
            f"rtp_port: {self.rtp_ports[0]}-{self.rtp_ports[1]}\n"
            "use_external_ip: false\n"
            f"nat_1_to_1_ip: {self.address}\n"
            "logging: {level: info}\n"
        )

    def start(self, timeout: float = 20.0) -> "SipBridge":
        """Start the bridge and wait until it listens for SIP (v1.0.0 serves no health endpoint:
        its log says so).

        Raises:
            RuntimeError: no binary, or it exited or was not listening within ``timeout`` s (the
                message holds the end of its log).
        """
        binary = find_livekit_sip()
        if binary is None:
            raise RuntimeError(missing_livekit_sip())
        self.proc, self.log_path = start_with_config(binary, f"livekit-sip-{self.sip_port}", self.config(), self.log_dir)
        try:
            wait_until_ready(self.proc, self.log_path, lambda: '"proto": "udp"' in self.log_tail(100_000), timeout,
                             "livekit-sip")
        except RuntimeError:
            self.stop()
            raise
        return self

    def uri(self, number: str) -> str:
        """The SIP URI that calls ``number`` through this bridge."""
        return f"sip:{number}@{self.address}:{self.sip_port}"

    def log_tail(self, chars: int = 3000) -> str:
        return log_tail(self.log_path, chars)

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc, 10)


async def open_phone_line(lk, number: str, agent_name: str, room_prefix: str = "call-") -> tuple[str, str]:
    """An inbound trunk for ``number`` and a dispatch rule that puts each call to it in a room of
    its own (``room_prefix`` + the caller + a random suffix) with ``agent_name`` dispatched there.

    Args:
        lk: a ``livekit.api.LiveKitAPI`` of the server the bridge serves.
        number: the called number (e.g. ``+15550100``), as the caller dials it.

    Returns:
        (trunk id, dispatch rule id).
    """
    from livekit import api

    trunk = await lk.sip.create_inbound_trunk(api.CreateSIPInboundTrunkRequest(
        trunk=api.SIPInboundTrunkInfo(name=f"myna {number}", numbers=[number])))
    rule = await lk.sip.create_dispatch_rule(api.CreateSIPDispatchRuleRequest(
        rule=api.SIPDispatchRule(dispatch_rule_individual=api.SIPDispatchRuleIndividual(room_prefix=room_prefix)),
        trunk_ids=[trunk.sip_trunk_id], name=f"myna {number}",
        room_config=api.RoomConfiguration(agents=[api.RoomAgentDispatch(agent_name=agent_name)])))
    return trunk.sip_trunk_id, rule.sip_dispatch_rule_id
