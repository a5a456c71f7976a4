"""Where a framework plug-in gets its speech: an in-process engine or a remote Myna worker.

Both plug-ins (:mod:`myna.integrations.pipecat`, :mod:`myna.integrations.livekit`) speak to a
:class:`Backend`, which opens one :class:`Turn` per utterance. A turn takes text as the LLM
writes it (:meth:`Turn.push_text`, :meth:`Turn.end_input`), and yields :class:`Audio`
(s16le mono PCM at :attr:`Backend.sample_rate`), :class:`Word` and :class:`Notice` items as
they exist; :meth:`Turn.cancel` drops it at once (barge-in). A turn with nothing speakable in
it (``"👍"``, ``"..."``) ends with no items and no error.

- :class:`LocalBackend` runs an :class:`~myna.engines.Engine` in this process (by default the
  embedded Piper voice) and resamples its output (:class:`~myna.audio.resample.TurnResampler`).
- :class:`RemoteBackend` talks to ``GET /v1/tts/stream`` on a running worker (DESIGN.md §3).
  A connection carries one turn at a time; idle connections are pooled, so a new turn
  usually starts on a warm socket (no handshake inside time to first byte).

Nothing here imports a framework.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import numpy as np

from myna.access import AccessRefused, Credentials
from myna.audio.resample import TurnResampler
from myna.engines import AudioChunk, Engine, ErrorEvent
from myna.engines.base import NON_FATAL_CODES
from myna.errors import MynaError
from myna.text.scripts import LATIN

log = logging.getLogger(__name__)

#: Seconds allowed to open a WebSocket and get its ``ready`` answers.
CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Audio:
    """A piece of a turn's speech: s16le mono PCM bytes at the backend's rate."""

    pcm: bytes


@dataclass(frozen=True)
class Word:
    """A word and its start in the turn's audio, in seconds from the turn's first sample."""

    word: str
    start_s: float


@dataclass(frozen=True)
class Notice:
    """A problem the turn survives (e.g. ``unsupported_language``: words in a script the voice
    cannot read were left out); the rest of the turn follows."""

    code: str
    message: str


TurnItem = Audio | Word | Notice


class Turn(abc.ABC):
    """One utterance: text in as it arrives, audio and words out as they exist."""

    turn_id: str

    @abc.abstractmethod
    async def push_text(self, text: str) -> None:
        """Add a chunk of text (any split, e.g. one LLM token)."""

    @abc.abstractmethod
    async def end_input(self) -> None:
        """No more text: speak what is buffered, then end the iteration."""

    @abc.abstractmethod
    async def cancel(self) -> None:
        """Drop the turn now; iteration ends without further items (idempotent)."""

    @abc.abstractmethod
    def __aiter__(self) -> AsyncIterator[TurnItem]:
        """Audio and words in order; raises :class:`MynaError` if synthesis fails."""


class Backend(abc.ABC):
    """Opens turns. Call :meth:`start` once before :meth:`open_turn`, :meth:`aclose` at the end.

    Attributes:
        sample_rate: rate of every :class:`Audio` item (Hz).
        scripts: the scripts the voice reads (known after :meth:`start` for a remote worker).
    """

    sample_rate: int
    scripts: frozenset[str] = LATIN

    async def start(self) -> None:
        """Load the engine or open (and check) a first connection."""

    @abc.abstractmethod
    async def open_turn(self) -> Turn:
        """A new turn, ready for text."""

    async def aclose(self) -> None:
        """Release engines and connections."""


def create_backend(
    *, engine: Engine | None = None, url: str | None = None, engine_name: str | None = None,
    voice: str | None = None, sample_rate: int | None = None, credentials: Credentials | None = None,
) -> Backend:
    """The backend for a plug-in's arguments: ``url`` → remote, else in-process.

    Args:
        engine: an in-process engine (already started by the caller); None with no ``url``
            loads the embedded Piper voice, owned by the backend.
        url: a worker, ``http://host:port`` or ``ws://host:port`` (the path is added).
        engine_name: the worker's engine to use (remote only; None: the worker's default).
        voice: voice name (None: the engine's default).
        sample_rate: output rate in Hz (None: the engine's native rate in-process, 24000 remote).
        credentials: the access token for a worker with keys (remote only; None: from the
            environment, see :class:`myna.access.Credentials`).
    """
    if url is not None:
        if engine is not None:
            raise ValueError("pass either engine (in-process) or url (remote), not both")
        return RemoteBackend(url, engine_name=engine_name, voice=voice, sample_rate=sample_rate or 24_000,
                             credentials=credentials)
    return LocalBackend(engine, voice=voice, sample_rate=sample_rate)


def _to_s16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


# -- in-process ----------------------------------------------------------------------------
class LocalBackend(Backend):
    """An engine in this process.

    Args:
        engine: a started engine; None loads the embedded Piper voice at :meth:`start`.
        voice: voice name (None: the engine's default).
        sample_rate: output rate in Hz (None: the engine's native rate).
    """

    def __init__(self, engine: Engine | None = None, *, voice: str | None = None, sample_rate: int | None = None):
        self._owned = engine is None
        if engine is None:
            from myna.engines.piper import PiperEngine

            engine = PiperEngine()
        self.engine = engine
        self.voice = voice
        self.sample_rate = sample_rate or engine.sample_rate
        self.scripts = engine.scripts

    async def start(self) -> None:
        if self._owned:
            await self.engine.start()

    async def open_turn(self) -> Turn:
        stream = self.engine.stream(self.voice, group=self)  # this plug-in's turns share one fair-share group
        return _LocalTurn(stream, self.sample_rate)

    async def aclose(self) -> None:
        if self._owned:
            await self.engine.close()


class _LocalTurn(Turn):
    def __init__(self, stream, out_rate: int):
        self.turn_id = uuid.uuid4().hex
        self._stream = stream
        self._resampler = TurnResampler(out_rate)

    async def push_text(self, text: str) -> None:
        self._stream.push_text(text)

    async def end_input(self) -> None:
        self._stream.end_input()

    async def cancel(self) -> None:
        self._stream.cancel()

    async def __aiter__(self) -> AsyncIterator[TurnItem]:
        """Audio, words and notices; an engine's failure raises its
        :class:`~myna.engines.EngineError` (a :class:`MynaError`)."""
        async for item in self._stream:
            if isinstance(item, AudioChunk):
                x = self._resampler.resample(item.pcm, item.sample_rate)
                if len(x):
                    yield Audio(_to_s16(x))
            elif isinstance(item, ErrorEvent):
                yield Notice(item.code, item.message)
            else:
                yield Word(item.word, item.start_ms / 1000.0)
        if not self._stream.cancelled:
            tail = self._resampler.flush()
            if len(tail):
                yield Audio(_to_s16(tail))


# -- remote --------------------------------------------------------------------------------
class RemoteBackend(Backend):
    """A running worker, through ``GET /v1/tts/stream``.

    Args:
        url: the worker, ``http://host:port`` (or ``ws://``; the path is added if missing).
        engine_name: engine on the worker (None: its default).
        voice: voice name (None: the engine's default).
        sample_rate: rate the worker resamples to (Hz).
        session: an ``aiohttp.ClientSession`` to use (None: the backend owns one).
        credentials: the access token sent on each connection (None: from the environment,
            see :class:`myna.access.Credentials`). A refused token fails :meth:`start` and
            :meth:`open_turn` with :class:`MynaError` ``token_required``, ``bad_token`` or
            ``forbidden``, its message naming the fix.
    """

    def __init__(self, url: str, *, engine_name: str | None = None, voice: str | None = None,
                 sample_rate: int = 24_000, session: aiohttp.ClientSession | None = None,
                 credentials: Credentials | None = None):
        url = url.rstrip("/")
        if url.startswith("http"):
            url = "ws" + url[len("http"):]
        if not url.endswith("/v1/tts/stream"):
            url += "/v1/tts/stream"
        self.url = url
        self.engine_name = engine_name
        self.voice = voice
        self.sample_rate = sample_rate
        self._credentials = credentials or Credentials()
        self._session = session
        self._owns_session = session is None
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()

    async def start(self) -> None:
        """Open one connection now, so the first turn starts warm and bad settings show early."""
        self._idle.append(await self._connect())

    async def _connect(self) -> "_Connection":
        if self._session is None:
            self._session = aiohttp.ClientSession()
        config = {"type": "config", "sample_rate": self.sample_rate}
        if self.engine_name is not None:
            config["engine"] = self.engine_name
        if self.voice is not None:
            config["voice"] = self.voice
        headers = self._credentials.headers()
        try:
            ws = await asyncio.wait_for(self._session.ws_connect(self.url, headers=headers, max_msg_size=0),
                                        CONNECT_TIMEOUT)
            conn = _Connection(self, ws)
            await asyncio.wait_for(conn.handshake(config), CONNECT_TIMEOUT)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
                refused = AccessRefused.from_status(exc.status, token_sent=bool(headers))
                raise MynaError(refused.code, refused.message) from None
            raise MynaError("connection_failed", f"cannot reach {self.url}: {exc or type(exc).__name__}") from None
        self._all.add(conn)
        self.scripts = frozenset(conn.ready.get("scripts") or LATIN)
        return conn

    async def open_turn(self) -> Turn:
        while self._idle:
            conn = self._idle.pop()
            if conn.usable:
                return conn.begin()
        return (await self._connect()).begin()

    def _release(self, conn: "_Connection") -> None:
        if conn.usable and conn not in self._idle:
            self._idle.append(conn)

    async def aclose(self) -> None:
        for conn in list(self._all):
            await conn.close()
        self._all.clear()
        self._idle.clear()
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None


class _Connection:
    """One WebSocket; carries at most one turn at a time."""

    def __init__(self, backend: RemoteBackend, ws: aiohttp.ClientWebSocketResponse):
        self._backend = backend
        self._ws = ws
        self._turn: _RemoteTurn | None = None
        self._reader: asyncio.Task | None = None
        self.ready: dict | None = None

    @property
    def usable(self) -> bool:
        return not self._ws.closed and self._turn is None and self._reader is not None and not self._reader.done()

    async def handshake(self, config: dict) -> None:
        """Read the greeting ``ready``, send ``config``, read its answer."""
        first = await self._receive_json()
        if first.get("type") != "ready":
            raise MynaError("protocol", f"expected ready, got {first}")
        await self._ws.send_str(json.dumps(config))
        answer = await self._receive_json()
        if answer.get("type") == "error":
            await self._ws.close()
            raise MynaError(answer.get("code", "error"), answer.get("message", ""))
        if answer.get("type") != "ready" or answer.get("sample_rate") != config["sample_rate"]:
            raise MynaError("protocol", f"unexpected answer to config: {answer}")
        self.ready = answer
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _receive_json(self) -> dict:
        msg = await self._ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise MynaError("protocol", f"expected a JSON message, got {msg.type!r}")
        return json.loads(msg.data)

    def begin(self) -> "_RemoteTurn":
        self._turn = _RemoteTurn(self)
        return self._turn

    async def send(self, message: dict) -> None:
        try:
            await self._ws.send_str(json.dumps(message))
        except (ConnectionError, RuntimeError) as exc:
            raise MynaError("connection_lost", f"worker connection lost: {exc}") from None

    def finish(self, turn: "_RemoteTurn") -> None:
        """``turn`` got its ``turn_done`` (or never started): the connection is free again."""
        if self._turn is turn:
            self._turn = None
            self._backend._release(self)

    async def _read(self) -> None:
        try:
            async for msg in self._ws:
                turn = self._turn
                if msg.type == aiohttp.WSMsgType.BINARY:
                    if turn is not None:
                        turn._deliver(Audio(msg.data))
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    event = json.loads(msg.data)
                    if turn is not None:
                        turn._on_event(event)
                else:
                    break
        finally:
            if self._turn is not None:
                self._turn._fail(MynaError("connection_lost", "the worker closed the connection"))

    async def close(self) -> None:
        await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


class _RemoteTurn(Turn):
    def __init__(self, conn: _Connection):
        self.turn_id = uuid.uuid4().hex
        self._conn = conn
        self._items: asyncio.Queue[TurnItem | MynaError | None] = asyncio.Queue()
        self._sent_any = False
        self._ended = False
        self._cancelled = False
        self._done = False
        self.server_ttfa_ms: float | None = None

    async def push_text(self, text: str) -> None:
        if self._ended or self._cancelled:
            raise RuntimeError("push_text after end_input/cancel")
        if text:
            self._sent_any = True
            await self._conn.send({"type": "text", "turn_id": self.turn_id, "text": text})

    async def end_input(self) -> None:
        if self._ended or self._cancelled:
            return
        self._ended = True
        self._sent_any = True
        await self._conn.send({"type": "end_turn", "turn_id": self.turn_id})

    async def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        self._items.put_nowait(None)
        if self._done or not self._sent_any:
            self._done = True
            self._conn.finish(self)  # nothing on the worker to stop
            return
        try:
            await self._conn.send({"type": "interrupt"})  # the worker answers with turn_done
        except MynaError:
            pass

    def _deliver(self, item: TurnItem) -> None:
        if not self._cancelled and not self._done:
            self._items.put_nowait(item)

    def _fail(self, error: MynaError) -> None:
        self._done = True
        if not self._cancelled:
            self._items.put_nowait(error)

    def _on_event(self, event: dict) -> None:
        kind = event.get("type")
        if event.get("turn_id") not in (None, self.turn_id):
            return  # a late event of an earlier turn on this connection
        if kind == "word":
            self._deliver(Word(event["word"], event["start_ms"] / 1000.0))
        elif kind == "first_audio":
            self.server_ttfa_ms = event.get("server_ttfa_ms")
        elif kind == "turn_done":
            self._done = True
            self._items.put_nowait(None)
            self._conn.finish(self)
        elif kind == "error" and event.get("code") in NON_FATAL_CODES:
            self._deliver(Notice(event["code"], event.get("message", "")))
        elif kind == "error":
            self._deliver_error(MynaError(event.get("code", "error"), event.get("message", "")))

    def _deliver_error(self, error: MynaError) -> None:
        if not self._cancelled:
            self._items.put_nowait(error)

    async def __aiter__(self) -> AsyncIterator[TurnItem]:
        while True:
            item = await self._items.get()
            if item is None or self._cancelled:
                return
            if isinstance(item, MynaError):
                raise item
            yield item
