"""ICE settings for a worker: no STUN by default, loopback candidates, bounded dead-peer time.

aioice never offers 127.0.0.1 as a host candidate (RFC 8445 §5.1.1.1 forbids loopback
candidates), so in a namespace that holds only ``lo`` a peer gathers nothing and ICE never
starts. Loopback mode wraps ``aioice.ice.get_host_addresses`` so it also returns the loopback
addresses; aioice looks the function up at gathering time, so replacing the module attribute
works for every later peer connection (DESIGN.md §5).
"""

from __future__ import annotations

import ipaddress

import aioice.ice
from aiortc import RTCConfiguration, RTCIceServer

_original_get_host_addresses = aioice.ice.get_host_addresses


def is_loopback_host(host: str) -> bool:
    """True when ``host`` (an address or ``localhost``) is on the loopback range."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def enable_loopback_candidates() -> None:
    """Make every later ICE gathering in this process also offer 127.0.0.1 (and ::1 for IPv6)."""

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        addresses = _original_get_host_addresses(use_ipv4, use_ipv6)
        if use_ipv4 and "127.0.0.1" not in addresses:
            addresses.append("127.0.0.1")
        return addresses

    aioice.ice.get_host_addresses = get_host_addresses


def set_peer_timeout(seconds: float) -> None:
    """Bound the time to notice a peer that stopped answering.

    ICE consent freshness (RFC 7675) sends a check every ``CONSENT_INTERVAL`` and closes the
    connection after ``CONSENT_FAILURES`` misses; we keep three misses and space the checks so
    that a dead peer is dropped within about ``seconds`` (at most 1.2 × ``seconds``: aioice
    jitters each interval by ±20 %). Process-wide, like aioice's own defaults (5 s × 6).

    Raises:
        ValueError: when ``seconds`` is below 1.5 (checks would outpace their own timeouts).
    """
    if seconds < 1.5:
        raise ValueError("peer timeout must be at least 1.5 s")
    aioice.ice.CONSENT_FAILURES = 3
    aioice.ice.CONSENT_INTERVAL = seconds / 3


def rtc_configuration(ice_servers: list[str] | None = None) -> RTCConfiguration:
    """An RTCConfiguration with exactly the given STUN/TURN URLs (none by default).

    aiortc adds a public STUN server when ``iceServers`` is left ``None``; we always pass a
    list, so nothing leaves the machine unless the operator asks for it.
    """
    return RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in (ice_servers or [])])
