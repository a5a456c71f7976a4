"""The unpaced output: each turn's audio leaves as soon as the engine has produced it.

For consumers that pace audio themselves: the WebSocket (``/v1/tts/stream``,
:mod:`myna.server.tts_stream`) and the in-process plug-ins (:mod:`myna.integrations.backend`).
:class:`UnpacedOutput` is a :class:`~myna.audio.turns.TurnQueue` whose audio goes to an
:class:`AudioSink` as s16 PCM at the output's rate, in whatever pieces the engine makes, with no
20 ms framing.

Turns go out one after another: the head turn's audio goes straight to the sink; a later
turn's audio (and its ``turn_started``) is kept until the turns before it are done, so every
piece of audio belongs to the one turn between its ``turn_started`` and ``turn_done``. Events
follow the audio they describe: ``first_audio`` right before the piece holding the first
audible sample, a ``word`` right after the piece holding its first sample, ``turn_done`` after
the turn's last piece.

A held (prepared) turn hands out nothing until it is committed (the turns behind it wait);
its audio is handed out at the commit. ``pause`` stops handing out audio: what the sink holds
already is the consumer's (it plays at its own pace, so the worker cannot know which word it
was in); ``resume`` hands out the rest from where it stopped. A consumer that wants the cut word
again uses the ``word`` events it has (their ``start_ms``) and its own playback position.

Timing is reported for a consumer that plays each turn from its first piece on, in real time:
``first_audio.pre_roll_ms`` is 0 (nothing is held here); when a turn's next audio comes after
the audio before it would have played out, ``turn_done`` counts the wait as a gap (``gap_ms``,
``gaps``, at the audio position it happened) for an engine whose chunks end at word boundaries,
and as an underrun for a frame-level one. The same estimate of when the audio handed out runs
out is the session's synthesis deadline (:meth:`UnpacedOutput.audio_runs_out_at`).

Ahead: a consumer that keeps every piece and plays none of it through Myna (a file download,
``POST /v1/audio/speech``) loses nothing when the audio comes early. An output made with
``ahead`` (a callable) says so: its session's synthesis jobs may then run ahead of real time,
beyond the synthesis horizon, on what the real-time sessions leave
(:mod:`myna.engines.scheduler`, ahead jobs). ``ahead()`` is asked before each job may start
beyond the horizon; False (the consumer is not reading what it has been given) holds the
session to the horizon until it says True again, so its queue cannot grow without bound. The
WebSocket and the plug-ins leave it out: their consumers play the audio, and a barge-in would
throw away whatever was made ahead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from myna.audio.turns import EventSink, OutputTurn, TurnQueue, to_s16
from myna.events import Event, Paused, Resumed, TurnStarted


class AudioSink(Protocol):
    """Where an :class:`UnpacedOutput`'s audio goes (a WebSocket's outbox, a plug-in's turn)."""

    def put_audio(self, turn_id: str, pcm: bytes) -> None:
        """s16le mono PCM of turn ``turn_id``, at the output's rate, next in order."""

    def drop_audio(self, turn_id: str | None = None) -> None:
        """Forget the audio handed over and not yet delivered: every turn's (barge-in), or
        only turn ``turn_id``'s (``cancel``)."""


class _Turn(OutputTurn):
    def __init__(self, turn_id: str, text_at: float, rate: int):
        super().__init__(turn_id, text_at, rate)
        self.announced = False
        self.cancelled = False  # (``cancel``: ends, interrupted, when it comes to the head)


class UnpacedOutput(TurnQueue):
    """Audio out as it exists (see the module docstring).

    Args:
        on_event: the session's event sink.
        audio: where the PCM goes.
        rate: output rate of the PCM (Hz).
        clock: monotonic clock in seconds (the session's).
        chunks_end_at_words: the engine's chunks end at word boundaries (late audio is a gap).
        ahead: nobody listens to this output in real time: synthesis may run ahead of real
            time whenever ``ahead()`` is True (see the module docstring); None (the default):
            the synthesis horizon holds it, as for a listener.
    """

    turn_class = _Turn

    def __init__(self, on_event: EventSink, audio: AudioSink, rate: int, clock: Callable[[], float] = time.monotonic,
                 *, chunks_end_at_words: bool = False, ahead: Callable[[], bool] | None = None):
        super().__init__(on_event, rate, clock, chunks_end_at_words=chunks_end_at_words)
        self._audio = audio
        #: Asked before a synthesis job runs ahead of real time (None: it never does); see the module docstring.
        self.ahead = ahead
        self._paused: _Turn | None = None
        self._runs_out_at = 0.0  # when the audio handed out has played out, for a real-time consumer (clock s)

    @classmethod
    def for_session(cls, session, audio: AudioSink, rate: int, *,
                    ahead: Callable[[], bool] | None = None) -> "UnpacedOutput":
        """The unpaced output of a :class:`~myna.session.Session`: its events, clock and its
        engine's kind of chunks, at ``rate`` Hz; ``ahead``: see the class."""
        return cls(session.on_output_event, audio, rate, session.clock,
                   chunks_end_at_words=session.engine.chunks_end_at_words, ahead=ahead)

    # -- TurnQueue ------------------------------------------------------------------------
    def _announce(self, turn: _Turn) -> None:
        self._drain()  # a turn at the head is announced at once; a later one when it gets there

    def _audio_added(self, turn: _Turn, seconds: float) -> None:
        self._drain()

    def _word_added(self, turn: _Turn) -> None:
        self._drain()

    def _input_ended(self, turn: _Turn) -> None:
        self._drain()

    def interrupt(self) -> list[Event]:
        """Drop every turn and the audio the sink still holds; returns the events that end
        them: a queued turn's held ``turn_started``, then each one's interrupted ``turn_done``."""
        events: list[Event] = []
        for turn in self._turns:
            if not turn.announced:
                events.append(TurnStarted(turn_id=turn.turn_id))
            events.append(turn.done_event(interrupted=True))
        self._turns.clear()
        self._by_id.clear()
        self._paused = None
        self._audio.drop_audio()
        self._runs_out_at = self._clock()  # what was dropped will not be played
        return events

    def cancel(self, turn_id: str) -> list[Event]:
        """Drop one turn. The playing turn ends now (the audio the sink still holds of it is
        dropped; its ``turn_done`` goes out, then the next turn starts). A queued turn keeps its
        place, emptied: its ``turn_started`` and interrupted ``turn_done`` go out back to back
        when the turns before it are done, so every piece of audio still belongs to the one
        turn between its ``turn_started`` and ``turn_done``. Returns no events: they are sent."""
        turn = self._by_id.get(turn_id)
        if turn is None:
            return []
        turn.cancelled = True
        turn.ended = True
        turn.take(turn.buffered)
        turn.words.clear()
        if turn is self._turns[0] and turn.announced:
            self._audio.drop_audio(turn.turn_id)
            self._runs_out_at = self._clock()  # what was dropped will not be played
        self._drain()
        return []

    def _committed(self, turn: _Turn) -> None:
        self._drain()

    def pause(self) -> str | None:
        """Stop handing out audio (see the module docstring); the head turn's ``paused`` event
        goes out (``at_ms`` = ``resume_ms``: the audio handed out so far); returns its
        ``turn_id``, or None when no turn is queued or it is paused already."""
        if self._paused is not None or not self._turns:
            return None
        head = self._paused = self._turns[0]
        at = round(1000.0 * head.played / self.rate, 1)
        self._on_event(Paused(turn_id=head.turn_id, at_ms=at, resume_ms=at))
        return head.turn_id

    def resume(self) -> bool:
        """Hand out the paused turn's audio again, after its ``resumed`` event; False when not paused."""
        turn, self._paused = self._paused, None
        if turn is None or self._by_id.get(turn.turn_id) is not turn:
            return False
        self._on_event(Resumed(turn_id=turn.turn_id, from_ms=round(1000.0 * turn.played / self.rate, 1)))
        self._runs_out_at = max(self._runs_out_at, self._clock())
        self._drain()
        return True

    @property
    def paused_turn(self) -> str | None:
        """The ``turn_id`` of the paused turn; None when not paused."""
        return self._paused.turn_id if self._paused is not None else None

    def audio_runs_out_at(self) -> float:
        """When a real-time consumer will have played the audio handed out and queued (clock s)."""
        return max(self._clock(), self._runs_out_at) + sum(t.buffered for t in self._turns) / self.rate

    # -- out ------------------------------------------------------------------------------
    def _drain(self) -> None:
        """Hand out what the head turn holds; move on to the next turn when it is done."""
        while self._turns:
            turn = self._turns[0]
            if not turn.announced:
                turn.announced = True
                self._on_event(TurnStarted(turn_id=turn.turn_id))
            if turn.cancelled:
                self._turns.popleft()
                self._by_id.pop(turn.turn_id, None)
                if turn is self._paused:
                    self._paused = None  # the pause ends with its turn
                self._on_event(turn.done_event(interrupted=True))
                continue
            if turn.held or turn is self._paused:
                return  # prepared and not committed, or paused
            if turn.buffered:
                seg = turn.take(turn.buffered)
                turn.check_first_audio(seg, self._clock(), 0.0, self._on_event)
                self._audio.put_audio(turn.turn_id, to_s16(seg, scratch=True).tobytes())
                self._count_lateness(turn)
                self._runs_out_at = max(self._clock(), self._runs_out_at) + len(seg) / self.rate
                turn.advance(len(seg), self._on_event)
            if not turn.ended:
                return
            self._finish(turn)

    def _count_lateness(self, turn: _Turn) -> None:
        """Audio of a playing turn handed out after the audio before it ran out: a gap or an underrun."""
        late_s = self._clock() - self._runs_out_at
        if turn.played == 0 or late_s <= 0:
            return
        if self.chunks_end_at_words:
            turn.gaps.add(1000.0 * turn.played / self.rate, 1000.0 * late_s)
        else:
            turn.underruns += 1
