"""The WebSocket door: streaming TTS over ``GET /v1/tts/stream``.

For framework plug-ins and other servers that pace audio themselves. One connection carries
one :class:`~myna.session.Session` whose output is an
:class:`~myna.audio.unpaced.UnpacedOutput`: audio leaves as soon as the engine has produced it
(no pacing, no 20 ms framing), as binary messages of s16le mono PCM at the connection's rate,
in between the turn's ``turn_started`` and ``turn_done``.

Follow one connection:

1. The worker sends ``{"type": "ready", "engines", "engine", "voice", "sample_rate"}`` at once.
2. The client may send ``{"type": "config", "engine"?, "voice"?, "sample_rate"?, "format"?, "speed"?}``
   before its first turn; it is answered with a new ``ready`` (or an ``error``, keeping the
   previous settings). ``sample_rate`` defaults to the engine's native rate (Piper: 22050 Hz).
   ``format`` ``pcm_mulaw`` / ``pcm_alaw`` sends G.711 at 8 kHz instead of s16le PCM
   (:class:`~myna.audio.encode.EncodingSink`: FFmpeg's encoders, one byte a sample).
   ``speed`` (0.5 to 2.0) is the session's default pace; a turn's first ``text`` may carry its own.
3. ``text`` / ``end_turn`` / ``interrupt`` as on the data channel, each parsed once
   (:func:`myna.messages.parse_message`) and handed to the session. Turns are sequential: a
   turn queued behind another gets its ``turn_started`` once the one before it is done, so
   every binary message belongs to the one turn that is open.
4. ``interrupt`` drops every turn at once, including audio queued for sending; each dropped
   turn gets ``turn_done`` with ``"interrupted": true``.

Bad input (bad JSON, a text message over 16 KiB, binary input, an unknown engine or voice, a
late ``config``) gets an ``error`` event and the connection stays open. Messages over the rate
cap are not dropped: a message that begins a turn (or configures, or is bad) waits until the
rate allows it, so the connection reads more slowly and TCP pushes back on the client
(:meth:`myna.limits.MessageRate.pace`); the text and ``end_turn`` of the turn in progress go
straight in (its size is bounded by ``max_turn_chars``). No outgoing message is over 16 KiB (PCM goes out in pieces of at most 16 KiB). Opening the connection passes the worker's token check
and session limits (``?access_token=`` is accepted as well as the header). Messages over
:data:`MAX_FRAME_BYTES` close the connection (WebSocket close code 1009). A client that
disconnects mid-turn has its turns cancelled and the engine streams released. A client that
stops answering pings (a frozen or vanished peer: :attr:`myna.server.app.Worker.ws_heartbeat`,
10 s, and no pong within half of it) is dropped and its session and slot are freed. When the
worker drains (SIGTERM), an idle connection is closed at once with 1001 "going away", a busy one once
its turns are done: a client reconnects (behind a load balancer, to another worker).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, replace

from aiohttp import WSCloseCode, WSMsgType, web

from myna.audio.encode import FORMATS, G711_RATE, EncodingSink
from myna.audio.unpaced import UnpacedOutput
from myna.engines import Engine
from myna.engines.base import scripts_of
from myna.errors import MynaError
from myna.events import MAX_MESSAGE_BYTES, Error, Event, Ready, TurnDone, encode_event
from myna.messages import BadMessage, Config, TurnDefaults, parse_message
from myna.server.auth import Grant
from myna.session import Session

log = logging.getLogger(__name__)

PATH = "/v1/tts/stream"
#: Largest WebSocket frame read at all (bytes); messages the contract accepts are far smaller
#: (16 KiB, :data:`myna.events.MAX_MESSAGE_BYTES`) and get an ``error`` event when over it.
MAX_FRAME_BYTES = 1024 * 1024
#: PCM a connection may have queued but unsent before it is closed as a slow consumer
#: (16 MiB: ~87 s of audio at 96 kHz, ~6 min at 22.05 kHz).
MAX_QUEUED_AUDIO_BYTES = 16 * 2**20
#: Close code and reason of a connection the worker closes because it is draining.
GOING_AWAY = (WSCloseCode.GOING_AWAY, b"worker draining: reconnect")


@dataclass(frozen=True)
class _Close:
    """Outbox marker: close the socket here, with this code and reason."""

    code: int
    reason: bytes


class Outbox:
    """The connection's ordered outgoing messages (JSON events and PCM), sent by one task; the
    :class:`~myna.audio.unpaced.AudioSink` of its session's output.

    Sending never waits on the caller's side: the session calls :meth:`put_event` and
    :meth:`put_audio` from synchronous code; the writer task drains the queue as fast as the
    socket takes it.
    """

    def __init__(self, ws: web.WebSocketResponse, max_audio_bytes: int = MAX_QUEUED_AUDIO_BYTES):
        self._ws = ws
        self._items: deque = deque()  # JSON text, (turn_id, PCM bytes) or _CLOSE
        self._max_audio_bytes = max_audio_bytes
        self._audio_bytes = 0  # PCM queued, not yet handed to the socket
        self.overflowed = False
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._write())

    def put_event(self, event: Event) -> None:
        text = encode_event(event)
        if text is None:  # a word or turn_id that large is refused on input; say so rather than drop silently
            log.error("tts stream: a %s event does not fit in a message; dropped", event.type)
            return
        self._items.append(text)
        self._wake.set()

    def put_audio(self, turn_id: str, pcm: bytes) -> None:
        """Queue PCM; a consumer too slow to keep the queue under the cap is disconnected
        (``error`` ``slow_consumer``, close code 1008) instead of growing memory without bound."""
        if self.overflowed:
            return
        self._audio_bytes += len(pcm)
        if self._audio_bytes > self._max_audio_bytes:
            self.overflowed = True
            self.drop_audio()
            self.put_event(Error(code="slow_consumer",
                                 message=f"over {self._max_audio_bytes // 2**20} MiB of audio unread; closing"))
            self._items.append(_Close(WSCloseCode.POLICY_VIOLATION, b"slow consumer"))
        else:  # in messages of at most 16 KiB (an even size: whole samples), like every other
            self._items.extend((turn_id, pcm[i : i + MAX_MESSAGE_BYTES]) for i in range(0, len(pcm), MAX_MESSAGE_BYTES))
        self._wake.set()

    def close_after_sent(self, code: int, reason: bytes) -> None:
        """Close the socket with ``code`` once everything queued before now has been sent."""
        self._items.append(_Close(code, reason))
        self._wake.set()

    def drop_audio(self, turn_id: str | None = None) -> None:
        """Forget every PCM message not yet sent (barge-in), or only turn ``turn_id``'s
        (``cancel``); events stay in order."""
        kept = deque(item for item in self._items
                     if not isinstance(item, tuple) or (turn_id is not None and item[0] != turn_id))
        self._items = kept
        self._audio_bytes = sum(len(item[1]) for item in kept if isinstance(item, tuple))

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._items:
                    item = self._items.popleft()
                    if isinstance(item, _Close):
                        await self._ws.close(code=item.code, message=item.reason)
                        return
                    if isinstance(item, str):
                        await self._ws.send_str(item)
                    else:
                        self._audio_bytes -= len(item[1])
                        await self._ws.send_bytes(item[1])
        except (ConnectionError, RuntimeError) as exc:  # the peer went away mid-send
            log.debug("tts stream writer stopped: %s", exc)

    async def close(self) -> None:
        """Stop the writer; what is still queued is dropped."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class StreamConnection:
    """One ``/v1/tts/stream`` client: its settings, its session and its outbox.

    Args:
        worker: the worker (a :class:`myna.server.app.Worker`: engines, sessions, the choice of
            engine and voice).
        ws: the prepared WebSocket.
        grant: the client's token grant (engines it may use); None: any engine.
    """

    def __init__(self, worker, ws: web.WebSocketResponse, grant: Grant | None = None):
        self._worker = worker
        self._ws = ws
        self._grant = grant
        self._rate = worker.sessions.message_rate()
        self.engine: Engine = worker.engines[worker.default_engine]
        #: The session's turn defaults, set by ``config`` (voice, speed, lexicon, normalise).
        self.defaults = TurnDefaults(voice=worker.engines.voice_for(self.engine.name))
        self.sample_rate = self.engine.sample_rate
        self.format = "pcm_s16le"  # or G.711 (config.format)
        self.outbox = Outbox(ws)
        self.session: Session | None = None  # opened by the first turn message
        self._draining = False

    def ready_event(self) -> Ready:
        return Ready(engines=list(self._worker.engines), engine=self.engine.name, voice=self.defaults.voice,
                     sample_rate=self.sample_rate, scripts=sorted(scripts_of(self.engine, self.defaults.voice)),
                     format=self.format)

    async def run(self) -> None:
        """Serve the connection until the client closes it."""
        self.outbox.put_event(self.ready_event())
        async for msg in self._ws:
            if msg.type == WSMsgType.TEXT:
                await self.handle_text(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await self._pace()
                self._error("binary_input", "binary messages are not accepted; send JSON text messages")
            elif msg.type == WSMsgType.ERROR:
                log.info("tts stream closed with error: %s", self._ws.exception())
                break

    async def _pace(self) -> None:
        """Back-pressure, not loss: over the message rate, stop reading for a while (the
        socket's buffers fill and the client's sends wait); the message is handled after."""
        wait = self._rate.pace()
        if wait:
            await asyncio.sleep(wait)

    async def handle_text(self, raw: str) -> None:
        """One client message. Text and ``end_turn`` of the turn in progress go straight in (a
        word is never cut by a pause of the reader; :meth:`myna.session.Session.continues_turn`);
        everything else (a new turn, ``config``, bad input) waits for the message rate."""
        try:
            message = parse_message(raw, config=True)
        except BadMessage as exc:
            await self._pace()
            self._error(exc.code, exc.message, exc.turn_id)
            return
        if self.session is not None and self.session.continues_turn(message):
            self._rate.allow(continues_turn=True)  # (counted when it fits; never held back)
        else:
            await self._pace()
        if isinstance(message, Config):
            self._configure(message)
            return
        if self.session is None:
            try:
                if self._grant is not None:
                    self._grant.check_engine(self.engine.name)
            except MynaError as exc:
                self._error(exc.code, f"{exc.message}; choose another with config")
                return
            sink = self.outbox if self.format == "pcm_s16le" else EncodingSink(self.outbox, FORMATS[self.format])
            self.session = self._worker.sessions.open(
                self.engine, lambda s: UnpacedOutput.for_session(s, sink, self.sample_rate),
                self._send, defaults=self.defaults)
        self.session.handle(message)

    def drain(self) -> None:
        """The worker drains: close now (1001) if no turn is open or speaking, else once the
        last one is done (its ``turn_done`` goes out first)."""
        if not self._draining:
            self._draining = True
            if self.session is None or not self.session.busy:
                self.outbox.close_after_sent(*GOING_AWAY)

    def _send(self, event: Event) -> None:
        self.outbox.put_event(event)
        if self._draining and isinstance(event, TurnDone) and not self.session.busy:
            self.outbox.close_after_sent(*GOING_AWAY)

    def _configure(self, config: Config) -> None:
        if self.session is not None:
            self._error("config_too_late", '"config" must come before the first turn of a connection')
            return
        try:
            # (the token is checked for an engine named here; for the default, at the first turn)
            engine, voice = self._worker.choose(config.engine or self.engine.name, config.voice,
                                                self._grant if config.engine is not None else None)
        except MynaError as exc:  # unknown_engine, unknown_voice, forbidden: the settings stay
            self._error(exc.code, exc.message)
            return
        fmt = config.format or self.format
        if fmt != "pcm_s16le" and config.sample_rate not in (None, G711_RATE):  # (a rate kept from before)
            self._error("bad_config", f'"{fmt}" is G.711: its "sample_rate" is {G711_RATE} Hz')
            return
        self.engine, self.format = engine, fmt
        # (the voice is the chosen engine's: its default when config names none)
        self.defaults = replace(self.defaults, voice=voice).updated(speed=config.speed, lexicon=config.lexicon,
                                                                    normalise=config.normalise,
                                                                    phrase_cache=config.phrase_cache)
        self.sample_rate = config.sample_rate or (engine.sample_rate if fmt == "pcm_s16le" else G711_RATE)
        self.outbox.put_event(self.ready_event())

    def _error(self, code: str, message: str, turn_id: str | None = None) -> None:
        self._worker.metrics.errors.labels(code).inc()
        self.outbox.put_event(Error(code=code, message=message, turn_id=turn_id))

    async def close(self) -> None:
        """Cancel every turn and release the engine streams (idempotent)."""
        if self.session is not None:
            await self.session.close()
        await self.outbox.close()


# -- HTTP layer --------------------------------------------------------------------------
_CONNECTIONS = web.AppKey("tts_stream_connections", set)


def add_tts_stream(app: web.Application, worker) -> None:
    """Register ``GET /v1/tts/stream`` on ``app`` for ``worker`` (a :class:`myna.server.app.Worker`)."""
    connections: set[web.WebSocketResponse] = set()
    app[_CONNECTIONS] = connections

    async def handle(request: web.Request) -> web.StreamResponse:
        grant = worker.authorize(request, query_token=True)
        release = worker.admit(worker.client_of(request, grant), grant)
        try:
            ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES, heartbeat=worker.ws_heartbeat or None)
            await ws.prepare(request)
            connections.add(ws)
            connection = StreamConnection(worker, ws, grant)
            worker.streams.add(connection)
            try:
                await connection.run()
            finally:
                connections.discard(ws)
                worker.streams.discard(connection)
                await connection.close()
                await ws.close()
        finally:
            release()
        return ws

    async def close_all(app: web.Application) -> None:
        for ws in list(connections):
            await ws.close(code=1001, message=b"worker shutting down")

    app.router.add_get(PATH, handle)
    app.on_shutdown.append(close_all)
