"""A session: one peer's turns, from data-channel JSON to frames on its audio track.

Follow one text chunk: :meth:`Session.handle_message` validates the JSON (DESIGN.md §3) and
calls :meth:`Session._on_text`, which opens the turn's :class:`~myna.engines.SynthesisStream`
on the first chunk and pushes the chunk into it. The turn's task (:meth:`Session._pump`) moves
the stream's audio and word events into the :class:`~myna.audio.playout.Playout`, which the
:class:`~myna.rtc.track.PacedAudioTrack` drains every 20 ms and encodes to Opus (:mod:`myna.audio.opus`).
Playout events (``first_audio``, ``word``, ``turn_done``) come back through :meth:`Session._on_playout_event`
and go out on the data channel.

The turn logic does not depend on the transport: by default a session owns a paced
``Playout`` + ``PacedAudioTrack`` (WebRTC); a transport that wants the audio as soon as it
exists passes its own :class:`TurnOutput` instead (the WebSocket endpoint,
:mod:`myna.server.tts_stream`, sends unpaced PCM).

Turns play in order: a chunk with a new ``turn_id`` ends the input of the previous turn (as
``end_turn`` would) and queues the new turn behind it. ``interrupt`` cancels every turn.
Bad input gets an ``error`` event; the session stays usable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from myna.audio.playout import MAX_HOLD_S, SAMPLE_RATE, Gaps, Playout
from myna.engines import AudioChunk, Engine, EngineError, ErrorEvent, FallbackEvent, SynthesisStream
from myna.errors import MynaError
from myna.events import MAX_MESSAGE_BYTES, Error, Fallback, Ready, TurnDone, TurnStarted
from myna.metrics import Metrics
from myna.rtc.track import PacedAudioTrack

log = logging.getLogger(__name__)

#: Longest accepted ``turn_id``.
MAX_TURN_ID = 128
#: How many finished or interrupted turn ids a session remembers, to drop late chunks for them.
REMEMBERED_TURNS = 256
#: Characters of client input an error message may quote (echoing more would let a 16 KiB
#: message draw a larger error).
QUOTED_INPUT_CHARS = 64


class TurnOutput(Protocol):
    """Where a session's turns go: the producer side of :class:`~myna.audio.playout.Playout`.

    An output queues turns in order and reports ``first_audio``, ``word`` and ``turn_done``
    events (DESIGN.md §3) to the event sink it was built with, once the audio they describe
    has been handed to the transport.
    """

    def begin_turn(self, turn_id: str, text_at: float) -> None:
        """Queue a turn; ``text_at`` is when its first text chunk arrived (monotonic s)."""

    def push_audio(self, turn_id: str, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue float32 mono PCM ``[n]`` at ``sample_rate`` Hz (ignored for dropped turns)."""

    def push_word(self, turn_id: str, word: str, start_ms: float) -> None:
        """Schedule a ``word`` event ``start_ms`` into the turn's audio."""

    def end_turn(self, turn_id: str) -> None:
        """No more audio for the turn; ``turn_done`` follows its last audio."""

    def interrupt(self) -> list[dict]:
        """Drop every queued turn now; returns each one's ``turn_done`` event with
        ``"interrupted": True`` (audio already handed out, underruns, gaps), the playing one first."""

    def audio_runs_out_at(self) -> float:
        """When the audio queued now will have played out (session clock, s); now when none is."""


class BadMessage(MynaError):
    """A client message that breaks the contract; ``code`` goes into the ``error`` event."""


@dataclass
class _Turn:
    turn_id: str
    stream: SynthesisStream
    text_at: float
    task: asyncio.Task | None = None
    input_ended: bool = False
    chars: int = 0  # text received, for the per-turn cap


@dataclass(eq=False)  # identity semantics: a session is also its engine scheduling group
class Session:
    """One peer's speech session.

    Args:
        engine: the engine this session speaks with.
        send: sends one JSON-serialisable event to the peer (data channel or WebSocket).
        metrics: the worker's metrics.
        voice: voice name passed to the engine (None: its default).
        clock: monotonic clock in seconds.
        max_hold_s: the start rule's budget: the longest a turn's ready first audio may be held (s).
        output: builds the session's :class:`TurnOutput` from the session's event sink.
            None (the default, WebRTC): a paced :class:`~myna.audio.playout.Playout` drained
            by :attr:`track`. With an output given, :attr:`playout` and :attr:`track` are None.
        max_turn_chars: characters one turn may carry (None: no cap); past it
            ``turn_too_long``, the turn speaks what came before and its input ends.
        max_queued_turns: turns open or queued at once (None: no cap); one more gets
            ``too_many_turns``.
    """

    engine: Engine
    send: Callable[[dict], None]
    metrics: Metrics
    voice: str | None = None
    clock: Callable[[], float] = time.monotonic
    max_hold_s: float = MAX_HOLD_S
    output: Callable[[Callable[[dict], None]], TurnOutput] | None = None
    max_turn_chars: int | None = None
    max_queued_turns: int | None = None
    playout: Playout | None = field(init=False, default=None)
    track: PacedAudioTrack | None = field(init=False, default=None)
    _output: TurnOutput = field(init=False)
    _turns: dict[str, _Turn] = field(init=False, default_factory=dict)
    _open_turn: str | None = field(init=False, default=None)
    _past_turns: deque[str] = field(init=False, default_factory=lambda: deque(maxlen=REMEMBERED_TURNS))
    _closed: bool = field(init=False, default=False)
    _draining: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.output is None:
            self.playout = self._new_playout()
            self.track = PacedAudioTrack(self.playout, clock=self.clock, on_error=self._on_frame_error)
            self._output = self.playout
        else:
            self._output = self.output(self._on_playout_event)
        self.metrics.active_sessions.inc()

    def ready_event(self, engines: list[str]) -> dict:
        """The ``ready`` event sent when the channel opens."""
        return Ready(engines=engines, engine=self.engine.name, sample_rate=SAMPLE_RATE).to_dict()

    # -- intake ---------------------------------------------------------------------------
    def handle_message(self, raw: str | bytes) -> None:
        """Handle one client message; contract violations become ``error`` events."""
        try:
            msg = parse_message(raw)
            kind = msg["type"]
            if kind == "text":
                self._on_text(_turn_id(msg), _text(msg))
            elif kind == "end_turn":
                self._on_end_turn(_turn_id(msg))
            elif kind == "interrupt":
                self.interrupt()
            else:
                raise BadMessage("unknown_type", f"unknown message type {quote_input(kind)}")
        except (BadMessage, EngineError) as exc:
            self._error(exc.code, exc.message, turn_id=_maybe_turn_id(raw))
        except Exception:  # a bug must cost one message, never the session or the transport
            log.exception("message handling failed")
            self._error("internal", "the message could not be handled", turn_id=_maybe_turn_id(raw))

    def _on_text(self, turn_id: str, text: str) -> None:
        if turn_id in self._past_turns:  # a late chunk of a finished or interrupted turn: never speak it
            raise BadMessage("turn_ended", f"turn {turn_id!r} has ended; use a new turn_id")
        turn = self._turns.get(turn_id) or self._begin_turn(turn_id)
        if turn.input_ended:
            raise BadMessage("turn_ended", f"turn {turn_id!r} already ended; use a new turn_id")
        turn.chars += len(text)
        if self.max_turn_chars is not None and turn.chars > self.max_turn_chars:
            # Nothing past the cap is spoken: the turn keeps what came before and its input ends.
            self._end_input(turn)
            raise BadMessage("turn_too_long", f"a turn may carry at most {self.max_turn_chars} characters; "
                                              "its input has ended")
        turn.stream.push_text(text)

    def _on_end_turn(self, turn_id: str) -> None:
        if turn_id in self._past_turns:
            return
        turn = self._turns.get(turn_id) or self._begin_turn(turn_id)
        self._end_input(turn)

    def _begin_turn(self, turn_id: str) -> _Turn:
        if self._draining:
            raise BadMessage("draining", "the worker is shutting down; finish this session and connect to another")
        if self.max_queued_turns is not None and len(self._turns) >= self.max_queued_turns:
            raise BadMessage("too_many_turns", f"at most {self.max_queued_turns} turns may be queued; "
                                               "wait for turn_done or interrupt")
        if self._open_turn is not None and self._open_turn in self._turns:
            self._end_input(self._turns[self._open_turn])
        stream = self.engine.stream(self.voice, group=self)
        turn = _Turn(turn_id, stream, text_at=self.clock())
        self._turns[turn_id] = turn
        self._open_turn = turn_id
        self._output.begin_turn(turn_id, turn.text_at)
        turn.task = asyncio.get_running_loop().create_task(self._pump(turn))
        self.metrics.turns.labels(self.engine.name).inc()
        self.send(TurnStarted(turn_id=turn_id).to_dict())
        return turn

    def _end_input(self, turn: _Turn) -> None:
        if not turn.input_ended:
            turn.input_ended = True
            turn.stream.end_input()
        if self._open_turn == turn.turn_id:
            self._open_turn = None

    def interrupt(self) -> None:
        """Barge-in: cancel synthesis of every turn and drop its queued audio."""
        self._drop_turns(self._output.interrupt())

    def _drop_turns(self, dropped: list[dict]) -> None:
        """End the given turns as interrupted: ``dropped`` holds their ``turn_done`` events."""
        for done in dropped:
            turn = self._turns.pop(done["turn_id"], None)
            self._past_turns.append(done["turn_id"])
            if turn is not None:
                turn.stream.cancel()
                self._count(done)
                self.send(done)
        self._open_turn = None

    def audio_runs_out_at(self) -> float:
        """When this session's queued audio will have played out (``clock`` s): the deadline of
        its turns' next synthesis jobs (:meth:`myna.engines.base.Engine.stream`, ``group``)."""
        return self._output.audio_runs_out_at()

    async def _pump(self, turn: _Turn) -> None:
        """Move one turn's engine output into the session's output."""
        try:
            async for item in turn.stream:
                if isinstance(item, AudioChunk):
                    pcm = self._usable_pcm(item, turn.turn_id)
                    if pcm is not None:
                        self._output.push_audio(turn.turn_id, pcm, item.sample_rate)
                elif isinstance(item, ErrorEvent):  # part of the turn left out; the rest is spoken
                    self._error(item.code, item.message, turn_id=turn.turn_id)
                elif isinstance(item, FallbackEvent):  # another engine speaks the rest of the turn
                    self._fallback(item, turn.turn_id)
                else:
                    self._output.push_word(turn.turn_id, item.word, item.start_ms)
        except EngineError as exc:
            self._error(exc.code, exc.message, turn_id=turn.turn_id)
        except Exception as exc:  # never let one turn take the session down
            log.exception("turn %s failed", turn.turn_id)
            self._error("engine_failed", str(exc), turn_id=turn.turn_id)
        finally:
            if not turn.stream.cancelled:
                self._output.end_turn(turn.turn_id)

    def _usable_pcm(self, chunk: AudioChunk, turn_id: str) -> np.ndarray | None:
        """The chunk as float32 mono ``[n]``, or None (with an ``error`` event) when unusable."""
        try:
            return as_mono_float32(chunk.pcm, chunk.sample_rate)
        except ValueError as exc:
            log.warning("turn %s: dropped an audio chunk: %s", turn_id, exc)
            self._error("bad_audio", f"the engine produced unusable audio ({exc}); it was dropped", turn_id=turn_id)
            return None

    def _on_frame_error(self, exc: BaseException) -> None:
        """The track could not build a frame: drop the turns (their audio is what failed) and say so."""
        self._error("audio_failed", f"audio output failed ({type(exc).__name__}); the turns in progress were dropped")
        try:
            self.interrupt()
        except Exception:  # the queue itself is what broke: the track goes on with a fresh one
            log.exception("the playout could not be interrupted; replacing it")
            self.playout = self._output = self._new_playout()
            self.track.playout = self.playout
            self._drop_turns([TurnDone(turn_id=turn_id, audio_ms=0.0, underruns=0, **Gaps().fields(), interrupted=True).to_dict()
                              for turn_id in self._turns])

    def _new_playout(self) -> Playout:
        return Playout(self._on_playout_event, clock=self.clock, max_hold_s=self.max_hold_s,
                       chunks_end_at_words=self.engine.chunks_end_at_words)

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a turn is open, synthesising or playing."""
        return bool(self._turns)

    def refuse(self, code: str, message: str) -> None:
        """Tell the client one of its messages was refused (an ``error`` event); the session carries on."""
        self._error(code, message)

    def drain(self) -> None:
        """Refuse new turns (``error`` ``draining``); turns already started carry on."""
        self._draining = True

    # -- output ---------------------------------------------------------------------------
    def _on_playout_event(self, event: dict) -> None:
        kind = event["type"]
        if kind == "first_audio":
            self.metrics.server_ttfa.labels(self.engine.name).observe(event["server_ttfa_ms"] / 1000.0)
            self.metrics.pre_roll.labels(self.engine.name).observe(event["pre_roll_ms"] / 1000.0)
        elif kind == "turn_done":
            self._turns.pop(event["turn_id"], None)
            self._past_turns.append(event["turn_id"])
            self._count(event)
        self.send(event)

    def _count(self, done: dict) -> None:
        """A turn's underruns and gaps into the worker's metrics."""
        if done["underruns"]:
            self.metrics.underruns.labels(self.engine.name).inc(done["underruns"])
        if done["gap_ms"]["count"]:
            self.metrics.gaps.labels(self.engine.name).inc(done["gap_ms"]["count"])
            self.metrics.gap_seconds.labels(self.engine.name).inc(done["gap_ms"]["total"] / 1000.0)

    def _fallback(self, switch: FallbackEvent, turn_id: str) -> None:
        self.metrics.fallbacks.labels(switch.from_engine, switch.to_engine, switch.reason).inc()
        self.send(Fallback(turn_id=turn_id, from_engine=switch.from_engine, to_engine=switch.to_engine,
                           reason=switch.reason, at_word=switch.at_word).to_dict())

    def _error(self, code: str, message: str, turn_id: str | None = None) -> None:
        self.metrics.errors.labels(code).inc()
        self.send(Error(code=code, message=message, turn_id=turn_id).to_dict())

    async def close(self) -> None:
        """Cancel every turn and stop the track (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._output.interrupt()
        tasks = []
        for turn in self._turns.values():
            turn.stream.cancel()
            if turn.task is not None:
                turn.task.cancel()
                tasks.append(turn.task)
        self._turns.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.track is not None:
            self.track.stop()
        self.metrics.active_sessions.dec()


def parse_message(raw: str | bytes) -> dict:
    """Decode one client message (size limit, UTF-8, JSON object with a string ``type``).

    Raises:
        BadMessage: ``message_too_large``, ``bad_encoding``, ``bad_json`` or ``bad_message``.
    """
    if isinstance(raw, bytes):
        if len(raw) > MAX_MESSAGE_BYTES:
            raise BadMessage("message_too_large", f"messages are limited to {MAX_MESSAGE_BYTES} bytes")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadMessage("bad_encoding", "binary message is not UTF-8 JSON") from None
    if len(raw.encode("utf-8")) > MAX_MESSAGE_BYTES:
        raise BadMessage("message_too_large", f"messages are limited to {MAX_MESSAGE_BYTES} bytes")
    try:
        msg = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise BadMessage("bad_json", f"message is not valid JSON: {exc}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise BadMessage("bad_message", 'a message is a JSON object with a string "type"')
    return msg


def _turn_id(msg: dict) -> str:
    turn_id = msg.get("turn_id")
    if isinstance(turn_id, int) and not isinstance(turn_id, bool):
        turn_id = str(turn_id)
    if not isinstance(turn_id, str) or not turn_id or len(turn_id) > MAX_TURN_ID:
        raise BadMessage("bad_message", f'"{msg["type"]}" needs a "turn_id" (string, 1-{MAX_TURN_ID} chars)')
    return turn_id


def _text(msg: dict) -> str:
    text = msg.get("text")
    if not isinstance(text, str):
        raise BadMessage("bad_message", '"text" needs a string "text"')
    return text


def _maybe_turn_id(raw: str | bytes) -> str | None:
    """The turn_id of a message, if it has a valid one (for error events)."""
    try:
        msg = json.loads(raw)
        turn_id = msg.get("turn_id") if isinstance(msg, dict) else None
        turn_id = str(turn_id) if isinstance(turn_id, (str, int)) and not isinstance(turn_id, bool) else None
        return turn_id if turn_id and len(turn_id) <= MAX_TURN_ID else None
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def quote_input(value: object, limit: int = QUOTED_INPUT_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (client input is
    echoed, never whole).

    >>> quote_input("x" * 100, limit=10)
    "'xxxxxx…'"
    """
    text = repr(value) if not isinstance(value, str) or len(value) <= limit else repr(value[: limit - 4] + "…")
    return text if len(text) <= limit + 2 else text[: limit - 1] + "…"


def as_mono_float32(pcm: object, sample_rate: object) -> np.ndarray:
    """An engine's PCM as float32 mono ``[n]`` in [-1, 1]: the only shape a turn output takes.

    Multi-channel audio (``[n, c]`` or ``[c, n]`` with ``c`` ≤ 8) is averaged to mono; integer
    PCM is scaled from its full scale; NaN and ±inf become 0 and values are clipped to [-1, 1].

    Raises:
        ValueError: not an array of numbers, more than two dimensions, or a sample rate
            outside 1-384000 Hz.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or not 0 < sample_rate <= 384_000:
        raise ValueError(f"bad sample rate {sample_rate!r}")
    x = np.asarray(pcm)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"samples of type {x.dtype} are not audio")
    if x.ndim not in (1, 2):
        raise ValueError(f"audio of shape {x.shape} (expected [n] or [n, channels])")
    if x.dtype.kind == "u":  # offset binary: the midpoint is silence
        x = (x.astype(np.float64) - (np.iinfo(x.dtype).max + 1) / 2) / ((np.iinfo(x.dtype).max + 1) / 2)
    elif x.dtype.kind == "i":
        x = x / float(np.iinfo(x.dtype).max + 1)
    if x.ndim == 2:
        x = x.mean(axis=1 if x.shape[1] <= 8 and x.shape[1] <= x.shape[0] else 0)
    x = np.nan_to_num(x.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0, copy=False)
    return np.clip(x, -1.0, 1.0, out=x)
