"""A session: one client's turns, whatever door they come through (the core every door shares).

A door (the WebRTC data channel, the WebSocket, a LiveKit room, an in-process plug-in) opens a
:class:`Session` (:meth:`myna.sessions.Sessions.open`) with the engine it speaks with, an output
that takes the audio (:class:`TurnOutput`: paced frames for a track, or unpaced PCM) and a sink
for the events. It hands the session typed messages (:mod:`myna.messages`) and gets typed events
back (:mod:`myna.events`); only the door turns them into bytes.

Follow one text chunk: :meth:`Session.handle` takes a :class:`~myna.messages.Text`; the turn's
first chunk opens the turn's :class:`~myna.engines.SynthesisStream` and queues the turn on the
output, and each chunk is pushed into the stream. The turn's task (:meth:`Session._pump`) moves
the stream's audio and word events into the output, which hands them to the transport and
reports ``first_audio``, ``word`` and ``turn_done`` back through :meth:`Session.on_output_event`
(metrics, then the door's sink).

Rules every door gets:

- Text enters a turn with its HTML character references decoded (``&quot;`` ``&#x27;`` ``&amp;``,
  split across chunks or not: :class:`~myna.text.entities.EntityDecoder`), so no voice reads
  ``quot`` or ``amp`` aloud.
- Turns play in order: a chunk with a new ``turn_id`` ends the input of the same sender's
  previous turn (as ``end_turn`` would) and queues the new turn behind every turn already
  queued. A door with one client has one sender; a door with several (a LiveKit room) names
  the sender of each message (``handle(message, sender)``), so one sender's new turn never cuts
  another sender's turn short: it waits behind it, whole. ``interrupt`` drops every turn,
  ``cancel`` one of them (queued or playing), the others playing on.
- Prepared turns: a turn opened by ``prepare`` is synthesised like any other (it counts toward
  the limits and, its audio queued, toward the synthesis horizon) and held, silent, in its
  place in the queue until ``commit``; ``cancel`` drops it. One not committed within
  :attr:`Session.prepare_timeout_s` is dropped (``error`` ``prepare_expired``, then its
  interrupted ``turn_done``).
- ``pause`` stops the head turn (``paused``), ``resume`` continues it (``resumed``); a turn
  paused for :attr:`Session.pause_timeout_s` ends by itself (``error`` ``pause_expired``, then
  its interrupted ``turn_done``) and the turns behind it play.
- Limits (:class:`~myna.limits.Limits`): ``max_turn_chars`` (past it ``turn_too_long``: the turn
  speaks what came before and its input ends), ``max_queued_turns`` (``too_many_turns``) and
  ``turn_idle_s``: a turn whose input gets no text for that long (the sender crashed, a
  stream's close was lost) ends as ``end_turn`` would, with an ``error`` ``turn_idle``; it then
  plays out and gets its ``turn_done``, so a forgotten turn never holds the session busy.
- Drain (:meth:`Session.drain`): new turns are refused (``draining``), turns already started go on.
- Bad input gets an ``error`` event and the session stays usable; a failure of one turn's
  engine ends that turn with an ``error``; engine audio that is unusable is dropped
  (``bad_audio``); an output that cannot make a frame drops the turns (``audio_failed``,
  :meth:`Session.output_failed`) and goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from myna.audio.playout import MAX_HOLD_S
from myna.audio.turns import Gaps, as_mono_float32
from myna.engines.base import language_of, speaks
from myna.engines import AudioChunk, Engine, EngineError, ErrorEvent, FallbackEvent, SynthesisStream
from myna.events import Error, Event, Fallback, FirstAudio, Ready, TurnDone
from myna.limits import Limits, MessageRate
from myna.messages import (BadMessage, Cancel, Commit, EndTurn, Interrupt, Message, Pause, Resume, Text, TurnDefaults,
                           parse_message, quote_input)
from myna.metrics import Metrics
from myna.text.entities import EntityDecoder

log = logging.getLogger(__name__)

#: How long a paused turn waits for ``resume`` before it ends by itself (s).
PAUSE_TIMEOUT_S = 10.0
#: How long a prepared turn waits for ``commit`` before it is dropped (s).
PREPARE_TIMEOUT_S = 30.0

#: How many finished or interrupted turn ids a session remembers, to drop late chunks for them.
REMEMBERED_TURNS = 256

EventSink = Callable[[Event], None]


class TurnOutput(Protocol):
    """Where a session's turns go (:class:`~myna.audio.turns.TurnQueue` and its two outputs).

    An output queues turns in order and reports ``turn_started``, ``first_audio``, ``word`` and
    ``turn_done`` events to the session (:meth:`Session.on_output_event`), each once the audio
    it describes has been handed to the transport.
    """

    def begin_turn(self, turn_id: str, text_at: float, held: bool = False) -> None:
        """Queue a turn; ``text_at`` is when its first text chunk arrived (monotonic s);
        ``held``: prepared, nothing of it goes out until :meth:`commit`."""

    def commit(self, turn_id: str) -> None:
        """Release a held turn (it plays in its place in the queue)."""

    def pause(self) -> str | None:
        """Stop playout of the head turn (its ``paused`` event goes out); its ``turn_id``
        (None: no turn, or paused already)."""

    def resume(self) -> bool:
        """Continue the paused turn (its ``resumed`` event goes out); False: nothing paused."""

    @property
    def paused_turn(self) -> str | None:
        """The paused turn's ``turn_id``, or None."""

    def push_audio(self, turn_id: str, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue float32 mono PCM ``[n]`` at ``sample_rate`` Hz (ignored for dropped turns)."""

    def push_word(self, turn_id: str, word: str, start_ms: float) -> None:
        """Schedule a ``word`` event ``start_ms`` into the turn's audio."""

    def end_turn(self, turn_id: str) -> None:
        """No more audio for the turn; ``turn_done`` follows its last audio."""

    def interrupt(self) -> list[Event]:
        """Drop every queued turn now; returns the events that end them (each one's
        ``turn_done`` with ``"interrupted": True``, the playing one first)."""

    def cancel(self, turn_id: str) -> list[Event]:
        """Drop one turn now, queued or playing; returns the events that end it (its
        ``turn_done`` with ``"interrupted": True``; none for a turn it does not hold)."""

    def reset(self) -> None:
        """Forget every turn at once (the output itself failed)."""

    def audio_runs_out_at(self) -> float:
        """When the audio queued now will have played out (session clock, s); now when none is."""


@dataclass
class _Turn:
    turn_id: str
    stream: SynthesisStream
    text_at: float
    task: asyncio.Task | None = None
    input_ended: bool = False
    chars: int = 0  # text received, for the per-turn cap
    sender: Hashable = None  # who sends the turn's text (None: the door's one client)
    last_text_at: float = 0.0  # loop time of the latest text, for the idle bound
    idle_timer: asyncio.TimerHandle | None = None
    entities: EntityDecoder = field(default_factory=EntityDecoder)  # HTML references, decoded split-safe
    prepared: bool = False  # opened by ``prepare``, not committed yet
    prepare_timer: asyncio.TimerHandle | None = None


class Session:
    """One client's speech session (see the module docstring).

    Args:
        engine: the engine this session speaks with.
        output: builds the session's :class:`TurnOutput` from the session (e.g.
            :meth:`myna.audio.playout.Playout.for_session`); it reads :attr:`on_output_event`,
            :attr:`clock`, :attr:`max_hold_s` and :attr:`engine`.
        send: the door's event sink: every event for the client, in order.
        metrics: the process's metrics.
        defaults: the session's defaults for its turns (:class:`myna.messages.TurnDefaults`:
            voice, speed, lexicon, normalise); a turn may name another voice or speed on its first
            text (:meth:`myna.engines.SynthesisStream.set_speed`).
        limits: the turn limits applied (``max_turn_chars``, ``max_queued_turns``; None: off).
        max_hold_s: the start rule's budget: the longest a turn's ready first audio may be held (s).
        clock: monotonic clock in seconds.

    Attributes:
        pause_timeout_s: how long a paused turn waits for ``resume`` (s; :data:`PAUSE_TIMEOUT_S`).
        prepare_timeout_s: how long a prepared turn waits for ``commit`` (s; :data:`PREPARE_TIMEOUT_S`).
    """

    pause_timeout_s: float = PAUSE_TIMEOUT_S
    prepare_timeout_s: float = PREPARE_TIMEOUT_S

    def __init__(self, engine: Engine, output: Callable[["Session"], TurnOutput], send: EventSink, metrics: Metrics, *,
                 defaults: TurnDefaults = TurnDefaults(), limits: Limits | None = None,
                 max_hold_s: float = MAX_HOLD_S, clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.send = send
        self.metrics = metrics
        self.defaults = defaults
        self.limits = limits or Limits.off()
        self.max_hold_s = max_hold_s
        self.clock = clock
        self._turns: dict[str, _Turn] = {}
        self._open_turns: dict[Hashable, str] = {}  # sender → the turn whose input it is sending
        self._past_turns: deque[str] = deque(maxlen=REMEMBERED_TURNS)
        self._refused: deque[str] = deque(maxlen=REMEMBERED_TURNS)  # turns refused whole (for rate, or their voice or speed)
        self._closed = False
        self._draining = False
        self._on_close: list[Callable[[], None]] = []
        self._pause_timer: asyncio.TimerHandle | None = None
        self._output = output(self)
        self.metrics.active_sessions.inc()

    @property
    def output(self) -> TurnOutput:
        """The session's output (a paced transport drains it)."""
        return self._output

    def ready_event(self, engines: list[str], sample_rate: int) -> Ready:
        """The ``ready`` event a door sends when the client's channel opens (``sample_rate``: Hz)."""
        return Ready(engines=engines, engine=self.engine.name, sample_rate=sample_rate)

    # -- intake ---------------------------------------------------------------------------
    def receive(self, raw: str | bytes, rate: MessageRate | None = None) -> None:
        """One client message as JSON text (:func:`myna.messages.parse_message`), then :meth:`handle`
        (a message that cannot be parsed counts against ``rate`` as one that begins nothing)."""
        try:
            message = parse_message(raw)
        except BadMessage as exc:
            accept, report = rate.allow() if rate is not None else (True, False)
            if accept:
                self._error(exc.code, exc.message, turn_id=exc.turn_id)
            elif report:
                self._error("rate_limited", rate.message)
            return
        self.handle(message, rate=rate)

    def continues_turn(self, message: Message) -> bool:
        """Whether ``message`` carries text or the end of a turn this session has accepted and
        whose input is still open (or is turn control: ``interrupt``, ``cancel``, ``commit``,
        ``pause``, ``resume``): such messages are never dropped for rate, nor held back."""
        if isinstance(message, (Interrupt, Cancel, Commit, Pause, Resume)):
            return True
        turn = self._turns.get(getattr(message, "turn_id", None))
        return turn is not None and not turn.input_ended and isinstance(message, (Text, EndTurn))

    def handle(self, message: Message, sender: Hashable = None, rate: MessageRate | None = None) -> None:
        """Act on one client message; contract violations become ``error`` events.

        ``sender`` names who sent it, for a door that several clients share (a LiveKit room's
        participants): a new turn ends only the same sender's open turn (module docstring).
        ``rate``: the door's message rate cap, for a door that cannot slow its reading
        (:meth:`myna.limits.MessageRate.allow`): a message continuing an accepted turn always
        passes; one that would begin a turn over the rate refuses that whole turn (``error``
        ``rate_limited`` with its ``turn_id``, once per burst), and the turn's later chunks are
        dropped with it, so no turn is spoken with words missing."""
        turn_id = getattr(message, "turn_id", None)
        if turn_id is not None and turn_id in self._refused:
            return  # a chunk of a turn refused whole (the client was told)
        if rate is not None:
            accept, report = rate.allow(self.continues_turn(message))
            if not accept:
                if turn_id is not None and turn_id not in self._turns:
                    self._refused.append(turn_id)
                if report:
                    self._error("rate_limited", rate.turn_message if turn_id is not None else rate.message, turn_id)
                return
        try:
            if isinstance(message, Text):
                self._on_text(message.turn_id, message.text, sender, message.prepare, message.voice, message.speed,
                              message.language)
            elif isinstance(message, EndTurn):
                self._on_end_turn(message.turn_id, sender)
            elif isinstance(message, Interrupt):
                self.interrupt()
            elif isinstance(message, Cancel):
                self.cancel(message.turn_id)
            elif isinstance(message, Commit):
                self.commit(message.turn_id)
            elif isinstance(message, Pause):
                self.pause()
            elif isinstance(message, Resume):
                self.resume()
            else:  # Config belongs to the WebSocket, before its session exists
                raise BadMessage("unknown_type", f"unknown message type {quote_input('config')}")
        except (BadMessage, EngineError) as exc:
            self._error(exc.code, exc.message, turn_id=turn_id)
        except Exception:  # a bug must cost one message, never the session or the transport
            log.exception("message handling failed")
            self._error("internal", "the message could not be handled", turn_id=turn_id)

    def _on_text(self, turn_id: str, text: str, sender: Hashable = None, prepare: bool = False,
                 voice: str | None = None, speed: float | None = None, language: str | None = None) -> None:
        if turn_id in self._refused:
            return  # its first chunk was refused (one error said so): the rest of it is not spoken either
        if turn_id in self._past_turns:  # a late chunk of a finished or interrupted turn: never speak it
            raise BadMessage("turn_ended", "this turn has ended; use a new turn_id")
        turn = self._turns.get(turn_id)
        if turn is None:
            try:
                turn = self._begin_turn(turn_id, sender, prepare, voice, speed, language)
            except EngineError as exc:
                if exc.code in ("unsupported_speed", "bad_speed", "unknown_voice", "wrong_language"):
                    self._refused.append(turn_id)  # the turn's options were refused: drop the whole turn
                raise
        if turn.input_ended:
            raise BadMessage("turn_ended", "this turn's input has ended; use a new turn_id")
        turn.chars += max(1, len(text))  # (an empty chunk counts as one: a turn's messages are bounded too)
        if self.limits.max_turn_chars is not None and turn.chars > self.limits.max_turn_chars:
            # Nothing past the cap is spoken: the turn keeps what came before and its input ends.
            self._end_input(turn)
            raise BadMessage("turn_too_long", f"a turn may carry at most {self.limits.max_turn_chars} characters; "
                                              "its input has ended")
        text = turn.entities.feed(text)
        if text:
            turn.stream.push_text(text)
        turn.last_text_at = asyncio.get_running_loop().time()

    def _check_language(self, voice: str | None, language: str) -> None:
        """Refuse a turn that asks for a language its voice does not speak
        (:func:`myna.engines.base.speaks`; a voice whose language is unknown is not checked).

        Raises:
            EngineError: ``wrong_language``, naming the voice's language.
        """
        spoken = language_of(self.engine, voice)
        if not speaks(spoken, language):
            raise EngineError("wrong_language", f"the voice {voice or 'default'!r} of {self.engine.name} speaks {spoken}, "
                                                f"not {language!r}; choose a voice of that language (GET /v1/voices)")

    def _on_end_turn(self, turn_id: str, sender: Hashable = None) -> None:
        if turn_id in self._past_turns or turn_id in self._refused:
            return
        turn = self._turns.get(turn_id) or self._begin_turn(turn_id, sender)
        self._end_input(turn)

    def _begin_turn(self, turn_id: str, sender: Hashable = None, prepare: bool = False, voice: str | None = None,
                    speed: float | None = None, language: str | None = None) -> _Turn:
        if self._draining:
            raise BadMessage("draining", "the worker is shutting down; finish this session and connect to another")
        cap = self.limits.max_queued_turns
        if cap is not None and len(self._turns) >= cap:
            raise BadMessage("too_many_turns", f"at most {cap} turns may be queued; wait for turn_done or interrupt")
        previous = self._open_turns.get(sender)
        if previous is not None and previous in self._turns:
            self._end_input(self._turns[previous])
        voice = voice if voice is not None else self.defaults.voice
        if language is not None:
            self._check_language(voice, language)
        stream = self.engine.stream(voice, group=self)
        if self.defaults.lexicon is not None:
            stream.set_lexicon(self.defaults.lexicon)
        speed = speed if speed is not None else self.defaults.speed
        if speed != 1.0:
            try:
                stream.set_speed(speed)
            except BaseException:
                stream.cancel()  # (no turn: the group's next one must not wait for it)
                raise
        if not self.defaults.normalise:
            stream.set_normalise(False)
        if not self.defaults.phrase_cache:
            stream.set_phrase_cache(False)
        loop = asyncio.get_running_loop()
        turn = _Turn(turn_id, stream, text_at=self.clock(), sender=sender, last_text_at=loop.time(), prepared=prepare)
        self._turns[turn_id] = turn
        self._open_turns[sender] = turn_id
        if prepare:
            self._output.begin_turn(turn_id, turn.text_at, held=True)
            turn.prepare_timer = loop.call_later(self.prepare_timeout_s, self._expire, turn_id, "prepare_expired",
                                                 f"not committed within {self.prepare_timeout_s:g} s: the prepared "
                                                 "turn was dropped")
        else:
            self._output.begin_turn(turn_id, turn.text_at)
        turn.task = loop.create_task(self._pump(turn))
        if self.limits.turn_idle_s is not None:
            turn.idle_timer = loop.call_later(self.limits.turn_idle_s, self._check_idle, turn)
        self.metrics.turns.labels(self.engine.name).inc()
        return turn

    def _end_input(self, turn: _Turn) -> None:
        if not turn.input_ended:
            rest = turn.entities.flush()
            if rest:
                turn.stream.push_text(rest)
            turn.stream.end_input()
        self._close_input(turn)

    def _close_input(self, turn: _Turn) -> None:
        """Take no more text for ``turn`` (later text: ``turn_ended``): its idle bound stops and
        it is no longer its sender's open turn."""
        turn.input_ended = True
        if turn.idle_timer is not None:
            turn.idle_timer.cancel()
            turn.idle_timer = None
        if self._open_turns.get(turn.sender) == turn.turn_id:
            del self._open_turns[turn.sender]

    def _check_idle(self, turn: _Turn) -> None:
        """The idle bound's timer: end the turn's input if no text came for ``turn_idle_s``."""
        turn.idle_timer = None
        if turn.input_ended or self._closed or self._turns.get(turn.turn_id) is not turn:
            return
        bound = self.limits.turn_idle_s
        loop = asyncio.get_running_loop()
        left = turn.last_text_at + bound - loop.time()
        if left > 0:
            turn.idle_timer = loop.call_later(left, self._check_idle, turn)
            return
        log.info("turn %s: no text for %g s; its input ends", turn.turn_id, bound)
        self._end_input(turn)
        self._error("turn_idle", f"no text for {bound:g} s: the turn's input has ended as end_turn would; "
                                 "what came before is spoken", turn_id=turn.turn_id)

    def interrupt(self) -> None:
        """Barge-in: cancel synthesis of every turn and drop its queued audio."""
        for event in self._output.interrupt():
            self.on_output_event(event)

    def _addressed_turn(self, turn_id: str) -> _Turn | None:
        """The live turn a control message (``cancel``, ``commit``) names; None for one that has
        ended (a message that crossed its ``turn_done``).

        Raises:
            BadMessage: ``unknown_turn``: no turn of this session ever had ``turn_id``.
        """
        if turn_id in self._past_turns:
            return None
        turn = self._turns.get(turn_id)
        if turn is None:
            raise BadMessage("unknown_turn", "no turn of this session has this turn_id")
        return turn

    def cancel(self, turn_id: str) -> None:
        """Drop one turn, queued or playing: its synthesis stops, its audio not yet handed out
        is dropped, it ends with ``turn_done`` ``"interrupted": true``; the other turns go on.
        A turn that has ended already is left alone (a cancel that crossed its ``turn_done``).

        Raises:
            BadMessage: ``unknown_turn``: no turn of this session ever had ``turn_id``.
        """
        turn = self._addressed_turn(turn_id)
        if turn is None:
            return
        self._close_input(turn)  # (text for it now: turn_ended)
        turn.stream.cancel()  # synthesis stops now, whenever the output ends the turn
        for event in self._output.cancel(turn_id):
            self.on_output_event(event)

    def commit(self, turn_id: str) -> None:
        """Play a prepared turn, in its place in the queue: with its synthesis done and no turn
        before it, its first audio goes out at the output's next frame. A turn that was not
        prepared, or is committed already, is left alone; so is one that has ended.

        Raises:
            BadMessage: ``unknown_turn``: no turn of this session ever had ``turn_id``.
        """
        turn = self._addressed_turn(turn_id)
        if turn is not None and turn.prepared:
            turn.prepared = False
            if turn.prepare_timer is not None:
                turn.prepare_timer.cancel()
                turn.prepare_timer = None
            self._output.commit(turn_id)

    def pause(self) -> None:
        """Stop playout of the head turn within one frame (``paused`` event); it waits for
        :meth:`resume` at most :attr:`pause_timeout_s`, then ends by itself. A second pause is
        ignored.

        Raises:
            BadMessage: ``nothing_playing``: no turn is queued.
        """
        if self._output.paused_turn is not None:
            return
        turn_id = self._output.pause()
        if turn_id is None:
            raise BadMessage("nothing_playing", "there is no turn to pause")
        loop = asyncio.get_running_loop()
        self._pause_timer = loop.call_later(self.pause_timeout_s, self._expire, turn_id, "pause_expired",
                                            f"not resumed within {self.pause_timeout_s:g} s: the paused turn ended")

    def resume(self) -> None:
        """Continue the paused turn from the start of the word that was cut (``resumed``
        event); ignored when nothing is paused (a resume that crossed the pause's timeout)."""
        if self._pause_timer is not None:
            self._pause_timer.cancel()
            self._pause_timer = None
        self._output.resume()

    def _expire(self, turn_id: str, code: str, message: str) -> None:
        """A prepared turn not committed, or a paused one not resumed, in time: it ends."""
        turn = self._turns.get(turn_id)
        if code == "pause_expired":
            self._pause_timer = None
            if self._output.paused_turn != turn_id:
                return
        elif turn is None or not turn.prepared:
            return
        if turn is None or self._closed:
            return
        self._error(code, message, turn_id=turn_id)
        self.cancel(turn_id)

    def audio_runs_out_at(self) -> float:
        """When this session's queued audio will have played out (``clock`` s): the deadline of
        its turns' next synthesis jobs (:meth:`myna.engines.base.Engine.stream`, ``group``)."""
        return self._output.audio_runs_out_at()

    @property
    def synthesis_ahead(self) -> Callable[[], bool] | None:
        """Whether this session's synthesis may run ahead of real time: None when someone
        listens in real time (the synthesis horizon holds it), else a callable asked before each
        job that would run beyond the horizon (the output's ``ahead``: an
        :class:`~myna.audio.unpaced.UnpacedOutput` whose consumer keeps every piece, e.g. a
        ``POST /v1/audio/speech`` download). Engines that schedule by deadline read it from
        the stream's ``group`` (:mod:`myna.engines.scheduler`, ahead jobs)."""
        return getattr(self._output, "ahead", None)

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

    def output_failed(self, exc: BaseException) -> None:
        """The output could not make a frame: drop the turns (their audio is what failed) and
        say so; if the queue itself is broken, it starts afresh."""
        self._error("audio_failed", f"audio output failed ({type(exc).__name__}); the turns in progress were dropped")
        try:
            self.interrupt()
        except Exception:
            log.exception("the output could not be interrupted; resetting it")
            self._output.reset()
            for turn_id in list(self._turns):
                self.on_output_event(TurnDone(turn_id=turn_id, audio_ms=0.0, underruns=0, **Gaps().fields(),
                                              interrupted=True))

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a turn is open, synthesising or playing."""
        return bool(self._turns)

    def refuse(self, code: str, message: str, turn_id: str | None = None) -> None:
        """Tell the client one of its messages was refused (an ``error`` event); the session carries on."""
        self._error(code, message, turn_id)

    def drain(self) -> None:
        """Refuse new turns (``error`` ``draining``); turns already started carry on."""
        self._draining = True

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the session has closed."""
        self._on_close.append(callback)

    # -- events -----------------------------------------------------------------------------
    def on_output_event(self, event: Event) -> None:
        """An event from the output: metrics and turn bookkeeping, then the door's sink."""
        if isinstance(event, FirstAudio):
            self.metrics.server_ttfa.labels(self.engine.name).observe(event.server_ttfa_ms / 1000.0)
            self.metrics.pre_roll.labels(self.engine.name).observe(event.pre_roll_ms / 1000.0)
        elif isinstance(event, TurnDone):
            turn = self._turns.pop(event.turn_id, None)
            self._past_turns.append(event.turn_id)
            if turn is not None:
                for timer in (turn.idle_timer, turn.prepare_timer):
                    if timer is not None:
                        timer.cancel()
                if self._open_turns.get(turn.sender) == event.turn_id:
                    del self._open_turns[turn.sender]
            if event.interrupted:
                if turn is None:
                    return  # (the session had ended it already)
                turn.stream.cancel()
            self._count(event)
        self.send(event)

    def _count(self, done: TurnDone) -> None:
        """A turn's underruns and gaps into the metrics."""
        if done.underruns:
            self.metrics.underruns.labels(self.engine.name).inc(done.underruns)
        if done.gap_ms["count"]:
            self.metrics.gaps.labels(self.engine.name).inc(done.gap_ms["count"])
            self.metrics.gap_seconds.labels(self.engine.name).inc(done.gap_ms["total"] / 1000.0)

    def _fallback(self, switch: FallbackEvent, turn_id: str) -> None:
        self.metrics.fallbacks.labels(switch.from_engine, switch.to_engine, switch.reason).inc()
        self.send(Fallback(turn_id=turn_id, from_engine=switch.from_engine, to_engine=switch.to_engine,
                           reason=switch.reason, at_word=switch.at_word))

    def _error(self, code: str, message: str, turn_id: str | None = None) -> None:
        self.metrics.errors.labels(code).inc()
        self.send(Error(code=code, message=message, turn_id=turn_id))

    async def close(self) -> None:
        """Cancel every turn and release the engine streams (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._output.interrupt()
        tasks = []
        if self._pause_timer is not None:
            self._pause_timer.cancel()
        for turn in self._turns.values():
            for timer in (turn.idle_timer, turn.prepare_timer):
                if timer is not None:
                    timer.cancel()
            turn.stream.cancel()
            if turn.task is not None:
                turn.task.cancel()
                tasks.append(turn.task)
        self._turns.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.metrics.active_sessions.dec()
        for callback in self._on_close:
            callback()

