"""The WebSocket outbox: a consumer that stops reading cannot grow the worker's memory."""

import asyncio
import json

from aiohttp import WSCloseCode

from myna.server.tts_stream import Outbox


class StuckSocket:
    """A peer that takes one message and then stops reading."""

    def __init__(self) -> None:
        self.sent: list = []
        self.closed_with = None
        self._stuck = asyncio.Event()

    async def send_str(self, data: str) -> None:
        self.sent.append(data)

    async def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)
        await self._stuck.wait()  # never returns until released

    async def close(self, code: int, message: bytes) -> None:
        self.closed_with = code


async def test_a_slow_consumer_is_closed_once_its_unsent_audio_passes_the_cap():
    ws = StuckSocket()
    outbox = Outbox(ws, max_audio_bytes=10_000)
    for _ in range(50):  # 50 × 1 kB: five times the cap
        outbox.put_audio("t", b"\x00" * 1000)
        await asyncio.sleep(0)
    assert outbox.overflowed
    assert sum(len(i[1]) for i in outbox._items if isinstance(i, tuple)) == 0  # the backlog was dropped
    ws._stuck.set()  # the peer reads again: the error goes out, then the close
    for _ in range(20):
        await asyncio.sleep(0)
    events = [json.loads(m) for m in ws.sent if isinstance(m, str)]
    assert events[-1]["type"] == "error" and events[-1]["code"] == "slow_consumer"
    assert ws.closed_with == WSCloseCode.POLICY_VIOLATION
    await outbox.close()
