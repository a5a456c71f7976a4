"""A worker in the test's own event loop, with a tone engine that speaks instantly.

``ToneEngine`` says each word as a 440 Hz tone of ``word_ms`` (default 120 ms; a word the
normaliser marked, one tone per spoken word) and emits a ``WordEvent`` per written word; ``pcm`` lets a test hand out chunks of any shape (a broken engine).
:func:`app_client` serves the worker's app with such engines to aiohttp's test client.
``ManualTimer`` is a virtual clock and ``call_later`` for streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import ifaddr
import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from myna.audio.playout import Playout
from myna.engines import AudioChunk, Engine, SynthesisStream, WordEvent
from myna.metrics import Metrics
from myna.server.app import Worker, create_app
from myna.session import Session
from myna.text import said


def tone(ms: float, rate: int = 24_000) -> np.ndarray:
    t = np.arange(int(rate * ms / 1000)) / rate
    return (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


class ToneStream(SynthesisStream):
    # Like the real engines: a word the front end marked (myna.text.normaliser, <sub>) is said as
    # its spoken words (one tone each) and its word event is the written word.
    reads_marked_words = True

    def __init__(self, engine: "ToneEngine"):
        super().__init__()
        self.engine = engine
        self.at_ms = 0.0

    def _on_words(self, words: list[str]) -> None:
        for word in words:
            self._emit(WordEvent(said.text_of(word), self.at_ms))
            ms = self.engine.word_ms * len(self._spoken_words(word))
            self._emit(AudioChunk(self.engine.pcm(ms), self.engine.sample_rate))
            self.at_ms += ms

    def _on_end_input(self) -> None:
        self._finish()




def paced_session(engine: Engine, sent: list, metrics: Metrics | None = None, **options) -> Session:
    """A :class:`~myna.session.Session` on ``engine`` with the paced
    :class:`~myna.audio.playout.Playout` (drain it with ``session.output.next_frame()``), whose
    events go to ``sent`` as the JSON objects the contract sends; ``options`` go to the session."""
    return Session(engine, Playout.for_session, lambda event: sent.append(event.to_dict()), metrics or Metrics(), **options)


async def collect(stream, timeout: float = 60.0) -> list:
    """Every item of a :class:`~myna.engines.SynthesisStream` until it ends.

    Raises:
        TimeoutError: it did not end within ``timeout`` s.
    """
    items = []

    async def run():
        async for item in stream:
            items.append(item)

    await asyncio.wait_for(run(), timeout)
    return items

def loopback_only() -> bool:
    """Only loopback addresses here, apart from the veth pair the LiveKit tests add inside this
    same namespace (myna.bench.livekit_server.media_address: both ends stay in it)."""
    from myna.bench.livekit_server import VETH

    return all(
        (ip.ip if isinstance(ip.ip, str) else ip.ip[0]) in ("127.0.0.1", "::1")
        for adapter in ifaddr.get_adapters() if adapter.name not in VETH
        for ip in adapter.ips
    )

class ToneEngine(Engine):
    """Args: name; sample_rate of its chunks (Hz); word_ms per word; pcm(ms) → the chunk."""

    def __init__(self, name: str = "tone", sample_rate: int = 24_000, word_ms: float = 120.0, pcm=None):
        self.name, self.sample_rate, self.word_ms = name, sample_rate, word_ms
        self.pcm = pcm or (lambda ms: tone(ms, sample_rate))

    def stream(self, voice=None, group=None) -> ToneStream:
        return ToneStream(self)


@asynccontextmanager
async def app_client(*engines: Engine) -> AsyncIterator[TestClient]:
    """aiohttp's test client for ``create_app`` of a worker with ``engines`` (default: one
    :class:`ToneEngine`), served on 127.0.0.1 in this event loop once its engines are loaded."""
    worker = Worker(engines={e.name: e for e in engines or (ToneEngine(),)})
    async with TestClient(TestServer(create_app(worker))) as client:
        await worker.loading
        yield client


class ManualTimer:
    """A virtual clock and ``call_later`` for a stream: time moves only when the test says."""

    def __init__(self):
        self.now = 0.0
        self.due: list[tuple[float, object]] = []

    def clock(self) -> float:
        return self.now

    def call_later(self, delay, callback):
        entry = [self.now + delay, callback]
        self.due.append(entry)
        return _Handle(self.due, entry)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            ready = sorted((e for e in self.due if e[0] <= end), key=lambda e: e[0])
            if not ready:
                break
            entry = ready[0]
            self.due.remove(entry)
            self.now = max(self.now, entry[0])
            entry[1]()
        self.now = end


class _Handle:
    def __init__(self, due, entry):
        self._due, self._entry = due, entry

    def cancel(self):
        if self._entry in self._due:
            self._due.remove(self._entry)
