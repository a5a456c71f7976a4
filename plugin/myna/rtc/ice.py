"""ICE settings for a worker: no STUN by default, loopback candidates, RFC 7675 consent.

aioice never offers 127.0.0.1 as a host candidate (RFC 8445 §5.1.1.1 forbids loopback
candidates), so in a namespace that holds only ``lo`` a peer gathers nothing and ICE never
starts. Loopback mode wraps ``aioice.ice.get_host_addresses`` so it also returns the loopback
addresses; aioice looks the function up at gathering time, so replacing the module attribute
works for every later peer connection.

Consent freshness (RFC 7675): aioice sends each consent check once, counts no answer within
0.5 s as a failure and closes the connection after a few such failures, so a live client whose
round trip is longer than 0.5 s is dropped while it receives audio. :class:`ConsentFreshConnection`
keeps consent as the RFC says instead: a fresh check every few seconds, each retransmitted on
the STUN schedule and waiting long for its answer; any answer, to any check, refreshes consent;
consent is lost only when no answer has come for the whole consent timeout (``--peer-timeout``,
30 s by default as in RFC 7675 §5.1), which is also what bounds a peer that answers nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random

import aioice.ice
import aiortc.rtcicetransport
from aioice import stun
from aiortc import RTCConfiguration, RTCIceServer

log = logging.getLogger(__name__)

_original_get_host_addresses = aioice.ice.get_host_addresses

#: RFC 7675 §5.1: consent expires 30 s after the last answered check.
CONSENT_TIMEOUT_S = 30.0
#: RFC 7675 §5.1: a check every 5 s (randomised ×0.8–1.2); shorter for a shorter timeout, so
#: that about six checks fall within each consent window.
CONSENT_INTERVAL_S = 5.0
#: Retransmissions of one consent check (RFC 8489 §6.2.1 schedule: 0.5, 1, 2, 4 s; the check
#: then waits 8 s more for a late answer).
CONSENT_RETRANSMISSIONS = 4


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


class ConsentFreshConnection(aioice.ice.Connection):
    """An aioice connection whose consent freshness follows RFC 7675 (see the module notes).

    aioice has no public hook for consent: this subclass replaces its ``query_consent`` loop and,
    having no public view of them, reads the nominated pairs (``_nominated``) and clears the
    loop's own task handle (``_query_consent_task``) before closing, as aioice's loop does. Both
    names hold in the aioice versions pyproject.toml allows; tests/rtc/test_ice.py exercises both.

    Attributes:
        consent_timeout: seconds without any answer to a consent check after which consent is
            lost and the connection closes (class-wide default set by :func:`set_peer_timeout`).
    """

    consent_timeout: float = CONSENT_TIMEOUT_S

    async def query_consent(self) -> None:
        """Send consent checks until consent is lost, then close (replaces aioice's loop)."""
        loop = asyncio.get_running_loop()
        timeout = self.consent_timeout
        interval = min(CONSENT_INTERVAL_S, timeout / 6)
        last_answer = loop.time()
        checks: set[asyncio.Task] = set()

        def answered(task: asyncio.Task) -> None:
            nonlocal last_answer
            checks.discard(task)
            if not task.cancelled() and task.result():
                last_answer = max(last_answer, loop.time())

        try:
            next_check = loop.time() + interval * random.uniform(0.8, 1.2)
            while True:
                await asyncio.sleep(max(0.0, min(next_check, last_answer + timeout) - loop.time()))
                if loop.time() - last_answer >= timeout:
                    log.info("ICE consent lost: no answer for %.1f s", loop.time() - last_answer)
                    self._query_consent_task = None  # close() would cancel this very task
                    await self.close()
                    return
                if loop.time() >= next_check:
                    next_check = loop.time() + interval * random.uniform(0.8, 1.2)
                    for pair in list(self._nominated.values()):
                        task = loop.create_task(self._consent_check(pair))
                        checks.add(task)
                        task.add_done_callback(answered)
        finally:
            for task in checks:
                task.cancel()

    async def _consent_check(self, pair) -> bool:
        """One consent check on ``pair``: True when the peer answered it."""
        request = self.build_request(pair, nominate=False)
        try:
            await pair.protocol.request(request, pair.remote_addr, integrity_key=self.remote_password.encode("utf8"),
                                        retransmissions=CONSENT_RETRANSMISSIONS)
            return True
        except (stun.TransactionError, ConnectionError, OSError):
            return False


def set_peer_timeout(seconds: float) -> None:
    """Use RFC 7675 consent (:class:`ConsentFreshConnection`) for every later peer connection
    of this process, losing consent after ``seconds`` without any answer.

    Process-wide: aiortc builds its ICE connections from the class installed here.

    Raises:
        ValueError: when ``seconds`` is below 1.5 (checks would outpace their own answers).
    """
    if seconds < 1.5:
        raise ValueError("peer timeout must be at least 1.5 s")
    ConsentFreshConnection.consent_timeout = float(seconds)
    aiortc.rtcicetransport.Connection = ConsentFreshConnection


def rtc_configuration(ice_servers: list[str] | None = None) -> RTCConfiguration:
    """An RTCConfiguration with exactly the given STUN/TURN URLs (none by default).

    aiortc adds a public STUN server when ``iceServers`` is left ``None``; we always pass a
    list, so nothing leaves the machine unless the operator asks for it.
    """
    return RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in (ice_servers or [])])
