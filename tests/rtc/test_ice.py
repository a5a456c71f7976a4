"""ICE consent freshness (RFC 7675) between two real aioice connections on loopback.

The answering side is slowed or silenced by wrapping its ``request_received``: a delay there is
a longer round trip for the checking side's consent checks. Consent timeout 3 s here (so about
six checks per window, every 0.5 s); the worker's default is 30 s.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aioice import ConnectionClosed

from myna.rtc.ice import ConsentFreshConnection, enable_loopback_candidates

pytestmark = pytest.mark.network

TIMEOUT_S = 3.0


async def connected_pair() -> tuple[ConsentFreshConnection, ConsentFreshConnection]:
    enable_loopback_candidates()
    a = ConsentFreshConnection(ice_controlling=True, use_ipv6=False)
    b = ConsentFreshConnection(ice_controlling=False, use_ipv6=False)
    a.consent_timeout = b.consent_timeout = TIMEOUT_S
    await asyncio.gather(a.gather_candidates(), b.gather_candidates())
    for x, y in ((a, b), (b, a)):
        for candidate in y.local_candidates:
            await x.add_remote_candidate(candidate)
        await x.add_remote_candidate(None)
        x.remote_username, x.remote_password = y.local_username, y.local_password
    await asyncio.gather(a.connect(), b.connect())
    return a, b


def answer_after(conn: ConsentFreshConnection, delay_s: float, drop=lambda message: False) -> None:
    """Make ``conn`` answer STUN checks ``delay_s`` late, and never those ``drop`` picks."""
    inner = conn.request_received
    loop = asyncio.get_running_loop()

    def request_received(message, addr, protocol, *rest):
        if not drop(message):
            loop.call_later(delay_s, inner, message, addr, protocol, *rest)

    conn.request_received = request_received


async def closed_within(conn: ConsentFreshConnection, seconds: float) -> float | None:
    """Seconds until ``conn`` reports it closed, or None if it is still open after ``seconds``."""
    t0 = time.monotonic()
    try:
        while True:
            event = await asyncio.wait_for(conn.get_event(), max(0.01, seconds - (time.monotonic() - t0)))
            if isinstance(event, ConnectionClosed):
                return time.monotonic() - t0
    except asyncio.TimeoutError:
        return None


@pytest.mark.slow
async def test_a_peer_with_a_600_ms_round_trip_keeps_consent():
    a, b = await connected_pair()
    try:
        answer_after(b, 0.6)
        assert await closed_within(a, 3 * TIMEOUT_S) is None  # aioice's own checks drop it after ~3 misses
    finally:
        await asyncio.gather(a.close(), b.close())


@pytest.mark.slow
async def test_lost_first_transmissions_are_retransmitted_and_answered():
    a, b = await connected_pair()
    seen: set[bytes] = set()

    def first_transmission(message) -> bool:  # drop each check the first time it arrives
        fresh = message.transaction_id not in seen
        seen.add(message.transaction_id)
        return fresh

    try:
        answer_after(b, 0.0, drop=first_transmission)
        assert await closed_within(a, 3 * TIMEOUT_S) is None
        assert len(seen) >= 6  # checks kept going, every one answered on a retransmission
    finally:
        await asyncio.gather(a.close(), b.close())


async def test_a_silent_peer_loses_consent_after_the_timeout_not_before():
    a, b = await connected_pair()
    try:
        answer_after(b, 0.0, drop=lambda message: True)
        seconds = await closed_within(a, 3 * TIMEOUT_S)
        # Consent lasts TIMEOUT_S after the last answer (given at most one check interval
        # before the silence began), and is lost then, not a whole interval later.
        assert seconds is not None and TIMEOUT_S - 0.6 <= seconds <= TIMEOUT_S + 1.0, seconds
    finally:
        await asyncio.gather(a.close(), b.close())
