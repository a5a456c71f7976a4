"""What a latency benchmark talks to: systems (an engine behind a server), reached through a
transport, by one client per session.

A :class:`System` is one lane: a server URL, the engine (or pipeline) to ask for, and the
transport that reaches it. :data:`TRANSPORTS` maps a transport name to a function opening a
client session for a system; every client answers ``speak(text, tokens_per_s)`` with a
:class:`myna.rtc.client.TurnResult` measured by the same onset rule (myna.audio.onset). Today:

- ``webrtc``: :class:`myna.rtc.client.MynaClient`, the aiortc client (``POST /api/offer``, a
  data channel, one received audio track). It reaches a Myna worker and, unchanged, the Pipecat
  peer (:mod:`myna.bench.pipecat_peer`), which accepts the same signaling and messages.
- ``chromium``: :class:`myna.bench.chromium.ChromiumSession`, a race-page Lane in real Chromium
  (``--client chromium``); the same signaling and messages, TTFA at the WebAudio render. Needs a
  running :class:`myna.bench.chromium.ChromiumHost` (:func:`myna.bench.chromium.using`).

A new transport (LiveKit, say) adds an entry whose client has the same ``speak`` and ``close``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from myna.rtc.client import TurnResult


class SpeechClient(Protocol):
    """One connected session with a system."""

    async def speak(self, text: str, tokens_per_s: float | None) -> TurnResult:
        """Stream one turn's text (token chunks at ``tokens_per_s``; None: all at once) and
        return what was heard, once the turn is over."""

    async def close(self) -> None:
        """Leave the session."""


@dataclass(frozen=True)
class System:
    """A lane of the benchmark.

    Attributes:
        label: its name in tables (``piper``, ``before:piper``, ``pipecat-sentence``).
        url: the server's base URL.
        engine: what the client asks for (``request_data.engine``).
        server: which server it runs on; lanes of one server race each other.
        transport: a key of :data:`TRANSPORTS`.
        peer: a system that is not Myna (no ``first_audio.pre_roll_ms``, gaps or RTF reported).
        quiet_tail_s: the server reports a turn's end before its transport has sent the audio:
            keep recording after it until this much received audio was inaudible.
    """

    label: str
    url: str
    engine: str | None
    server: str
    transport: str = "webrtc"
    peer: bool = False
    quiet_tail_s: float | None = None


class _WebRTCSession:
    def __init__(self, system: System):
        from myna.rtc.client import MynaClient

        self._system = system
        self._client = MynaClient(system.url, engine=system.engine)

    async def connect(self) -> "_WebRTCSession":
        await self._client.connect(timeout=60.0)
        return self

    async def speak(self, text: str, tokens_per_s: float | None) -> TurnResult:
        return await self._client.speak(text, tokens_per_s=tokens_per_s, timeout=120.0,
                                        quiet_tail_s=self._system.quiet_tail_s)

    async def close(self) -> None:
        await self._client.close()


async def _open_webrtc(system: System) -> SpeechClient:
    return await _WebRTCSession(system).connect()


async def _open_chromium(system: System) -> SpeechClient:
    from myna.bench.chromium import open_session

    return await open_session(system)


#: Transport name → opens a connected :class:`SpeechClient` for a system.
TRANSPORTS: dict[str, Callable[[System], Awaitable[SpeechClient]]] = {"webrtc": _open_webrtc,
                                                                       "chromium": _open_chromium}


async def open_clients(system: System, n: int) -> list[SpeechClient]:
    """``n`` connected sessions with ``system`` (opened together).

    Raises:
        KeyError: unknown transport.
    """
    opener = TRANSPORTS[system.transport]
    return list(await asyncio.gather(*(opener(system) for _ in range(n))))


async def engine_stats(url: str) -> dict:
    """The synthesis counters of a worker started by :mod:`myna.bench.worker`, by engine name
    (empty when the server has none)."""
    import aiohttp

    from myna.bench.worker import STATS_PATH

    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}{STATS_PATH}", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return await resp.json() if resp.status == 200 else {}
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return {}
