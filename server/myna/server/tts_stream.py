"""Streaming TTS over a WebSocket: ``GET /v1/tts/stream`` (DESIGN.md §3).

For framework plug-ins and other servers that pace audio themselves. One connection carries
one :class:`~myna.rtc.session.Session` whose output is a :class:`StreamOutput`: audio leaves as
soon as the engine has produced it (no pacing, no 20 ms framing), as binary messages of s16le
mono PCM at the connection's rate, in between the turn's ``turn_started`` and ``turn_done``.

Follow one connection:

1. The worker sends ``{"type": "ready", "engines", "engine", "voice", "sample_rate"}`` at once.
2. The client may send ``{"type": "config", "engine"?, "voice"?, "sample_rate"?}`` before its
   first turn; it is answered with a new ``ready`` (or an ``error``, keeping the previous
   settings). ``sample_rate`` defaults to the engine's native rate (Piper: 22050 Hz).
3. ``text`` / ``end_turn`` / ``interrupt`` as on the data channel. Turns are sequential: a
   turn queued behind another gets its ``turn_started`` once the one before it is done, so
   every binary message belongs to the one turn that is open.
4. ``interrupt`` drops every turn at once, including audio queued for sending; each dropped
   turn gets ``turn_done`` with ``"interrupted": true``.

Bad input (bad JSON, a text message over 16 KiB, binary input, an unknown engine or voice, a
late ``config``, messages over the rate cap) gets an ``error`` event and the connection stays
open. No outgoing message is over 16 KiB (PCM goes out in pieces of at most 16 KiB). Opening the connection passes the worker's token check
and session limits (``?access_token=`` is accepted as well as the header). Messages over
:data:`MAX_FRAME_BYTES` close the connection (WebSocket close code 1009). A client that
disconnects mid-turn has its turns cancelled and the engine streams released.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

import numpy as np
from aiohttp import WSCloseCode, WSMsgType, web

from myna.audio.onset import first_audible_sample
from myna.audio.playout import Gaps
from myna.audio.resample import TurnResampler
from myna.engines import Engine
from myna.events import MAX_MESSAGE_BYTES, Error, FirstAudio, Ready, TurnDone, Word, encode_event
from myna.rtc.session import BadMessage, Session, parse_message, quote_input
from myna.server.auth import AuthError, Grant
from myna.server.limits import Limits, MessageRate

log = logging.getLogger(__name__)

PATH = "/v1/tts/stream"
#: Largest WebSocket frame read at all (bytes); messages the contract accepts are far smaller
#: (16 KiB, :data:`myna.events.MAX_MESSAGE_BYTES`) and get an ``error`` event when over it.
MAX_FRAME_BYTES = 1024 * 1024
#: Output rates a client may ask for (Hz).
MIN_RATE, MAX_RATE = 8_000, 96_000

EventSink = Callable[[dict], None]


#: PCM a connection may have queued but unsent before it is closed as a slow consumer
#: (16 MiB: ~87 s of audio at 96 kHz, ~6 min at 22.05 kHz).
MAX_QUEUED_AUDIO_BYTES = 16 * 2**20
_CLOSE = object()  # outbox marker: close the socket here


class Outbox:
    """The connection's ordered outgoing messages (JSON events and PCM), sent by one task.

    Sending never waits on the caller's side: sessions call :meth:`put_event` and
    :meth:`put_audio` from synchronous code; the writer task drains the queue as fast as the
    socket takes it.
    """

    def __init__(self, ws: web.WebSocketResponse, max_audio_bytes: int = MAX_QUEUED_AUDIO_BYTES):
        self._ws = ws
        self._items: deque[str | bytes] = deque()
        self._max_audio_bytes = max_audio_bytes
        self._audio_bytes = 0  # PCM queued, not yet handed to the socket
        self.overflowed = False
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._write())

    def put_event(self, event: dict) -> None:
        text = encode_event(event)
        if text is None:  # a word or turn_id that large is refused on input; say so rather than drop silently
            log.error("tts stream: a %s event does not fit in a message; dropped", event.get("type"))
            return
        self._items.append(text)
        self._wake.set()

    def put_audio(self, pcm: bytes) -> None:
        """Queue PCM; a consumer too slow to keep the queue under the cap is disconnected
        (``error`` ``slow_consumer``, close code 1008) instead of growing memory without bound."""
        if self.overflowed:
            return
        self._audio_bytes += len(pcm)
        if self._audio_bytes > self._max_audio_bytes:
            self.overflowed = True
            self.drop_audio()
            self.put_event(Error(code="slow_consumer",
                                 message=f"over {self._max_audio_bytes // 2**20} MiB of audio unread; closing").to_dict())
            self._items.append(_CLOSE)
        else:  # in messages of at most 16 KiB (an even size: whole samples), like every other
            self._items.extend(pcm[i : i + MAX_MESSAGE_BYTES] for i in range(0, len(pcm), MAX_MESSAGE_BYTES))
        self._wake.set()

    def drop_audio(self) -> None:
        """Forget every PCM message not yet sent (barge-in); events stay in order."""
        self._items = deque(item for item in self._items if not isinstance(item, bytes))
        self._audio_bytes = 0

    async def _write(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._items:
                    item = self._items.popleft()
                    if item is _CLOSE:
                        await self._ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"slow consumer")
                        return
                    if isinstance(item, str):
                        await self._ws.send_str(item)
                    else:
                        self._audio_bytes -= len(item)
                        await self._ws.send_bytes(item)
        except (ConnectionError, RuntimeError) as exc:  # the peer went away mid-send
            log.debug("tts stream writer stopped: %s", exc)

    async def close(self) -> None:
        """Stop the writer; what is still queued is dropped."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class _StreamTurn:
    """One turn's not-yet-sent audio (int16 at the output rate) and words."""

    def __init__(self, turn_id: str, text_at: float, sample_rate: int):
        self.turn_id = turn_id
        self.text_at = text_at
        self.chunks: deque[np.ndarray] = deque()
        self.words: deque[tuple[int, str]] = deque()  # (sample offset at the output rate, word)
        self.resampler = TurnResampler(sample_rate)
        self.sent = 0  # samples sent
        self.gaps = Gaps()
        self.underruns = 0
        self.ended = False
        self.first_audio_sent = False
        self.held_start: dict | None = None  # turn_started, held while an earlier turn is open


class StreamOutput:
    """An unpaced :class:`~myna.rtc.session.TurnOutput`: PCM is sent as soon as it exists.

    Turns are sent one after another. The head turn's audio goes straight to the
    :class:`Outbox`; a later turn's audio is kept until the turns before it are done. Events
    follow the audio they describe: ``first_audio`` right before the message holding the
    first audible sample, a ``word`` right after the message holding its first sample,
    ``turn_done`` after the turn's last message.

    The session's own events (``turn_started``, ``error``, interrupted ``turn_done``) pass
    through :meth:`announce`, which holds a queued turn's ``turn_started`` until it is the head.

    Timing is reported for a consumer that plays each turn from its first message on, in real
    time: ``first_audio.pre_roll_ms`` is 0 (nothing is held here); when a turn's next audio is
    sent after the audio before it would have played out, ``turn_done`` counts the wait as a
    gap (``gap_ms``, ``gaps``, at the audio position it happened) for an engine whose chunks
    end at word boundaries, and as an underrun for a frame-level one. The same estimate of
    when the sent audio runs out is the session's synthesis deadline
    (:meth:`audio_runs_out_at`).

    Args:
        outbox: the connection's outgoing queue.
        sample_rate: output rate of the PCM messages (Hz).
        clock: monotonic clock in seconds (the session's).
        chunks_end_at_words: the engine's chunks end at word boundaries (late audio is a gap).
    """

    def __init__(self, outbox: Outbox, sample_rate: int, clock: Callable[[], float] = time.monotonic,
                 chunks_end_at_words: bool = False):
        self._outbox = outbox
        self.sample_rate = sample_rate
        self._clock = clock
        self._chunks_end_at_words = chunks_end_at_words
        self._runs_out_at = 0.0  # when the audio sent so far has played out, for a real-time consumer (clock s)
        self._on_event: EventSink = outbox.put_event
        self._turns: deque[_StreamTurn] = deque()
        self._by_id: dict[str, _StreamTurn] = {}
        self._unannounced: dict[str, dict] = {}  # dropped turns whose turn_started was held

    def bind(self, on_event: EventSink) -> "StreamOutput":
        """Set the sink for this output's events (the session's); returns self (a
        ``Session(output=...)`` factory)."""
        self._on_event = on_event
        return self

    # -- session events -----------------------------------------------------------------
    def announce(self, event: dict) -> None:
        """The session's ``send``: events out, with ``turn_started`` kept in turn order."""
        kind, turn_id = event.get("type"), event.get("turn_id")
        if kind == "turn_started":
            turn = self._by_id.get(turn_id)
            if turn is not None and self._turns[0] is not turn:
                turn.held_start = event
                return
        elif kind == "turn_done" and turn_id in self._unannounced:
            self._outbox.put_event(self._unannounced.pop(turn_id))
        self._outbox.put_event(event)

    # -- producer side (TurnOutput) -------------------------------------------------------
    def begin_turn(self, turn_id: str, text_at: float) -> None:
        turn = _StreamTurn(turn_id, text_at, self.sample_rate)
        self._turns.append(turn)
        self._by_id[turn_id] = turn

    def push_audio(self, turn_id: str, pcm: np.ndarray, sample_rate: int) -> None:
        turn = self._by_id.get(turn_id)
        if turn is None or turn.ended:
            return
        self._append(turn, turn.resampler.resample(pcm, sample_rate))
        self._drain()

    def push_word(self, turn_id: str, word: str, start_ms: float) -> None:
        turn = self._by_id.get(turn_id)
        if turn is not None:
            turn.words.append((int(round(start_ms * self.sample_rate / 1000.0)), word))
            self._drain()

    def end_turn(self, turn_id: str) -> None:
        turn = self._by_id.get(turn_id)
        if turn is None or turn.ended:
            return
        self._append(turn, turn.resampler.flush())
        turn.ended = True
        self._drain()

    def interrupt(self) -> list[dict]:
        dropped = [self._done_event(t, interrupted=True) for t in self._turns]
        for turn in self._turns:
            if turn.held_start is not None:
                self._unannounced[turn.turn_id] = turn.held_start
        self._turns.clear()
        self._by_id.clear()
        self._outbox.drop_audio()
        self._runs_out_at = self._clock()  # what was dropped will not be played
        return dropped

    def audio_runs_out_at(self) -> float:
        """When a real-time consumer will have played the audio sent and queued (clock s)."""
        queued = sum(len(c) for t in self._turns for c in t.chunks)
        return max(self._clock(), self._runs_out_at) + queued / self.sample_rate

    # -- internals ------------------------------------------------------------------------
    @staticmethod
    def _append(turn: _StreamTurn, x: np.ndarray) -> None:
        """Queue the turn's float32 audio at the output rate as s16le."""
        if len(x):
            turn.chunks.append((np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2"))

    def _drain(self) -> None:
        """Send what the head turn holds; move on to the next turn when it is done."""
        while self._turns:
            turn = self._turns[0]
            if turn.held_start is not None:
                self._outbox.put_event(turn.held_start)
                turn.held_start = None
            while turn.chunks:
                pcm = turn.chunks.popleft()
                if not turn.first_audio_sent and first_audible_sample(pcm, self.sample_rate) is not None:
                    turn.first_audio_sent = True
                    self._on_event(FirstAudio(turn_id=turn.turn_id, server_ttfa_ms=round(1000.0 * (self._clock() - turn.text_at), 1),
                                              pre_roll_ms=0.0).to_dict())
                self._outbox.put_audio(pcm.tobytes())
                self._count_lateness(turn)
                self._runs_out_at = max(self._clock(), self._runs_out_at) + len(pcm) / self.sample_rate
                turn.sent += len(pcm)
                self._emit_words(turn, upto=turn.sent)
            if not turn.ended:
                return
            self._turns.popleft()
            self._by_id.pop(turn.turn_id, None)
            self._emit_words(turn, upto=float("inf"))
            self._on_event(self._done_event(turn))

    def _count_lateness(self, turn: _StreamTurn) -> None:
        """Audio of a playing turn sent after the audio before it ran out: a gap or an underrun."""
        late_s = self._clock() - self._runs_out_at
        if turn.sent == 0 or late_s <= 0:
            return
        if self._chunks_end_at_words:
            turn.gaps.add(1000.0 * turn.sent / self.sample_rate, 1000.0 * late_s)
        else:
            turn.underruns += 1

    def _done_event(self, turn: _StreamTurn, interrupted: bool = False) -> dict:
        return TurnDone(turn_id=turn.turn_id, audio_ms=round(1000.0 * turn.sent / self.sample_rate, 1),
                        underruns=turn.underruns, **turn.gaps.fields(), interrupted=interrupted).to_dict()

    def _emit_words(self, turn: _StreamTurn, upto: float) -> None:
        while turn.words and turn.words[0][0] < upto:
            offset, word = turn.words.popleft()
            self._on_event(Word(turn_id=turn.turn_id, word=word, start_ms=round(1000.0 * offset / self.sample_rate, 1)).to_dict())


class StreamConnection:
    """One ``/v1/tts/stream`` client: its settings, its session and its outbox.

    Args:
        engines: the worker's loaded engines by name (the first is the default).
        metrics: the worker's metrics.
        ws: the prepared WebSocket.
        limits: the worker's limits (message rate, turn caps); None: none.
        grant: the client's token grant (engines it may use); None: any engine.
        draining: tells whether the worker is draining (the session then refuses new turns).
    """

    def __init__(self, engines: dict[str, Engine], metrics, ws: web.WebSocketResponse, limits: Limits | None = None,
                 grant: Grant | None = None, draining: Callable[[], bool] = lambda: False):
        self._engines = engines
        self._metrics = metrics
        self._ws = ws
        self._limits = limits or Limits.off()
        self._grant = grant
        self._draining = draining
        self._rate = MessageRate(self._limits.message_rate, self._limits.message_burst)
        self.engine = next(iter(engines.values()))
        self.voice: str | None = None
        self.sample_rate = self.engine.sample_rate
        self.outbox = Outbox(ws)
        self.session: Session | None = None  # opened by the first turn message

    def ready_event(self) -> dict:
        return Ready(engines=list(self._engines), engine=self.engine.name, voice=self.voice,
                     sample_rate=self.sample_rate, scripts=sorted(self.engine.scripts)).to_dict()

    async def run(self) -> None:
        """Serve the connection until the client closes it."""
        self.outbox.put_event(self.ready_event())
        async for msg in self._ws:
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                allowed, report = self._rate.allow()
                if not allowed:
                    if report:
                        self._error("rate_limited", self._rate.message)
                    continue
            if msg.type == WSMsgType.TEXT:
                self.handle_text(msg.data)
            elif msg.type == WSMsgType.BINARY:
                self._error("binary_input", "binary messages are not accepted; send JSON text messages")
            elif msg.type == WSMsgType.ERROR:
                log.info("tts stream closed with error: %s", self._ws.exception())
                break

    def handle_text(self, raw: str) -> None:
        try:
            msg = parse_message(raw)
        except BadMessage as exc:
            self._error(exc.code, exc.message)
            return
        if msg["type"] == "config":
            self._configure(msg)
            return
        if self.session is None:
            try:
                if self._grant is not None:
                    self._grant.check_engine(self.engine.name)
            except AuthError as exc:
                self._error(exc.code, f"{exc.message}; choose another with config")
                return
            output = StreamOutput(self.outbox, self.sample_rate, chunks_end_at_words=self.engine.chunks_end_at_words)
            self.session = Session(
                engine=self.engine, send=output.announce, metrics=self._metrics, voice=self.voice, output=output.bind,
                max_turn_chars=self._limits.max_turn_chars, max_queued_turns=self._limits.max_queued_turns,
            )
            if self._draining():
                self.session.drain()
        self.session.handle_message(raw)

    def _configure(self, msg: dict) -> None:
        if self.session is not None:
            self._error("config_too_late", '"config" must come before the first turn of a connection')
            return
        name = msg.get("engine")
        engine = self.engine
        if not isinstance(name, (str, type(None))) or not isinstance(msg.get("voice"), (str, type(None))):
            self._error("bad_config", '"engine" and "voice" must be strings')
            return
        if name is not None:
            if name not in self._engines:
                self._error("unknown_engine", f"unknown engine {quote_input(name)}; loaded: {', '.join(self._engines)}")
                return
            if self._grant is not None:
                try:
                    self._grant.check_engine(name)
                except AuthError as exc:
                    self._error(exc.code, exc.message)
                    return
            engine = self._engines[name]
        voice = msg.get("voice")
        if voice is not None and voice not in engine.voices:
            self._error("unknown_voice", f"{engine.name} has no voice {quote_input(voice)}; available: {engine.voices}")
            return
        rate = msg.get("sample_rate")
        if rate is None:
            rate = engine.sample_rate
        elif isinstance(rate, bool) or not isinstance(rate, int) or not MIN_RATE <= rate <= MAX_RATE:
            self._error("bad_config", f'"sample_rate" must be an integer from {MIN_RATE} to {MAX_RATE} (Hz)')
            return
        self.engine, self.voice, self.sample_rate = engine, voice, rate
        self.outbox.put_event(self.ready_event())

    def _error(self, code: str, message: str) -> None:
        self._metrics.errors.labels(code).inc()
        self.outbox.put_event(Error(code=code, message=message).to_dict())

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
            ws = web.WebSocketResponse(max_msg_size=MAX_FRAME_BYTES)
            await ws.prepare(request)
            connections.add(ws)
            connection = StreamConnection(worker.engines, worker.metrics, ws, worker.limits, grant,
                                          draining=lambda: worker.draining)
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
