"""A worker in the test's own event loop, with a tone engine that speaks instantly.

``ToneEngine`` says each word as a 440 Hz tone of ``word_ms`` (default 120 ms; a word the
normaliser marked, one tone per spoken word) and emits a ``WordEvent`` per written word; ``pcm`` lets a test hand out chunks of any shape (a broken engine).
:func:`app_client` serves the worker's app with such engines to aiohttp's test client.
``ManualTimer`` is a virtual clock and ``call_later`` for streams. :class:`Balancer` is a TCP
load balancer on loopback (round robin per accepted connection, as a rolling restart sees one).
:func:`quick_start_args` is what every ``myna`` process a test starts adds to start quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
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


async def until(condition, timeout: float = 30.0) -> None:
    """Wait on the event loop (real time, polling every 5 ms) until ``condition()`` holds.

    Raises:
        AssertionError: it did not within ``timeout`` s.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s"
        await asyncio.sleep(0.005)


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

#: The session cap or room capacity a test's ``myna`` process gets (see :func:`quick_start_args`).
QUICK_START_CAPS = {"serve": ("--max-sessions", "16"), "worker": ("--capacity", "4")}


def quick_start_args(command: str, args) -> list[str]:
    """What a test's ``myna COMMAND ARGS`` process adds to ``args`` to start in a few seconds on a
    busy machine, where ``args`` do not say otherwise: no phrase cache warm-up (51 phrases, ~20
    CPU-seconds, which no test hears: the warm-up is tested in process,
    tests/engines/test_phrase_cache.py) and, for ``serve`` and ``worker``, a fixed session cap or
    room capacity (:data:`QUICK_START_CAPS`) rather than one measured at start-up (on a machine the
    other tests load, the measure says 2)."""
    added = [] if "--phrase-cache-warm" in args else ["--phrase-cache-warm", "none"]
    cap = QUICK_START_CAPS.get(command)
    if cap is not None and cap[0] not in args:
        added += cap
    return added


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


class Balancer:
    """A TCP load balancer on 127.0.0.1 (a plain byte pipe, no HTTP): each accepted connection
    goes to the next of ``targets`` (``(host, port)``), round robin, and stays there for its
    whole life, as behind a TCP proxy in front of several workers. Use as ``async with
    Balancer(a, b) as url``; set :attr:`targets` (or :attr:`target`, one) at any time.

    Attributes:
        chosen: the target of every connection accepted so far, in order.
    """

    def __init__(self, *targets: tuple[str, int]):
        self.targets = list(targets)
        self.chosen: list[tuple[str, int]] = []
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task] = set()

    @property
    def target(self) -> tuple[str, int]:
        """The next connection's target."""
        return self.targets[len(self.chosen) % len(self.targets)]

    @target.setter
    def target(self, target: tuple[str, int]) -> None:
        self.targets = [target]

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.target
        self.chosen.append(target)
        task = asyncio.get_running_loop().create_task(self._pipe(target, reader, writer))
        self._pipes.add(task)
        task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _pipe(target: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            # (either side closing closes the other: a worker that closes a connection closes it
            # for the client too)
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()


def address(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``http://host:port``."""
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def post(path: str, body: dict) -> bytes:
    """A kept-alive HTTP/1.1 POST of ``body`` as JSON, as raw bytes."""
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: myna\r\nConnection: keep-alive\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


#: Raw requests for a door (:func:`exchange`, :func:`refused_and_closed`): a WebSocket upgrade
#: of ``/v1/tts/stream``, a speech request, a WebRTC offer (its SDP bad: refused or 400), a
#: liveness probe.
WS_UPGRADE = (b"GET /v1/tts/stream HTTP/1.1\r\nHost: myna\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
              b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
SPEECH = post("/v1/audio/speech", {"model": "tts-1", "input": "Hello there.", "voice": "alloy"})
OFFER = post("/api/offer", {"sdp": "v=0\r\n", "type": "offer"})
LIVEZ = b"GET /livez HTTP/1.1\r\nHost: myna\r\n\r\n"


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[int, dict]:
    """Send ``request`` on an open connection, read one response: (status, lower-cased headers)."""
    writer.write(request)
    await writer.drain()
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head[1:] if line)}
    if "content-length" in headers:
        await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 5)
    return int(head[0].split()[1]), headers


async def refused_and_closed(url: str, request: bytes) -> tuple[int, dict]:
    """``request`` on a new TCP connection to ``url``: (status, headers), once the worker has
    closed the connection after its answer (EOF; fails if it does not within 5 s).

    Raises:
        AssertionError: bytes came after the answer instead of the close.
    """
    reader, writer = await asyncio.open_connection(*address(url))
    try:
        status, headers = await exchange(reader, writer, request)
        assert await asyncio.wait_for(reader.read(), 5) == b"", "bytes after the refusal"  # EOF: closed
        return status, headers
    finally:
        writer.close()


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
