"""The turn queue both outputs are made of: turns in order, their audio, words and events.

A session hands its output (:class:`~myna.session.TurnOutput`) each turn's audio and words as
the engine produces them. Two outputs hand them on: :class:`~myna.audio.playout.Playout`, paced
in 20 ms frames (WebRTC, LiveKit rooms), and :class:`~myna.audio.unpaced.UnpacedOutput`, as soon
as the audio exists (the WebSocket, the in-process plug-ins). What they share lives here,
:class:`TurnQueue`:

- turns queue in order (``begin_turn``), each with its own resampler to the output's rate
  (:class:`~myna.audio.resample.TurnResampler`), so engine audio of any size and rate is fine;
- words are placed by their start in the turn's audio (``push_word``) and go out as
  :class:`~myna.events.Word` events once the audio they start in has been handed out, never
  before the turn's :class:`~myna.events.FirstAudio` (words in a quiet lead-in go with it);
- a turn's :class:`~myna.events.TurnDone` follows its last audio, and reports what was handed
  out, the underruns and the gaps (:class:`Gaps`);
- ``interrupt`` drops every turn, and returns their events (the output decides what of the
  playing turn still goes out);
- ``reset`` forgets every turn at once: after a failure, when the queue may be what broke;
- a turn may be queued *held* (``begin_turn(..., held=True)``: a prepared turn): its audio is
  queued (it counts toward :meth:`TurnQueue.audio_runs_out_at`, the synthesis horizon) and
  nothing of it goes out until :meth:`TurnQueue.commit`; the turns behind it wait, in order;
- ``pause`` / ``resume`` (the outputs implement them): the head turn stops and goes on.

The PCM conversions every output shares are here too: an engine's samples in
(:func:`as_mono_float32`, the only shape a turn takes), s16 out (:func:`to_s16`).

Subclasses decide when audio leaves (:meth:`TurnQueue._audio_added`, ``_word_added``,
``_input_ended``) and when a turn is announced (:meth:`TurnQueue._announce`: at once by
default).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from myna.audio.onset import first_audible_sample
from myna.audio.resample import TurnResampler
from myna.events import Event, FirstAudio, TurnDone, TurnStarted, Word

EventSink = Callable[[Event], None]

#: ``turn_done.gaps`` lists at most this many gaps (``gap_ms`` counts them all).
MAX_GAPS_LISTED = 32


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


def to_s16(x: np.ndarray, scratch: bool = False) -> np.ndarray:
    """float32 samples in [-1, 1] ``[n]`` as int16 ``[n]`` (full scale 32767, clipped).

    Args:
        scratch: ``x`` may be overwritten (saves a copy on the 20 ms frame path).
    """
    y = x if scratch else x.astype(np.float32, copy=True)
    np.multiply(y, 32767.0, out=y)
    np.minimum(y, 32767.0, out=y)  # (np.clip costs more than the rest of a frame)
    np.maximum(y, -32767.0, out=y)
    return y.astype(np.int16)


class Gaps:
    """A turn's gaps: where in the turn's audio each began and how long it lasted (ms)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []

    def add(self, start_ms: float, length_ms: float) -> None:
        self.spans.append((start_ms, length_ms))

    def fields(self) -> dict:
        """``gap_ms`` (``count``, ``total``, ``longest``) and ``gaps`` (``[start_ms,
        duration_ms]``, the first :data:`MAX_GAPS_LISTED`), as ``turn_done`` carries them."""
        lengths = [n for _, n in self.spans]
        return {
            "gap_ms": {"count": len(lengths), "total": round(sum(lengths), 1), "longest": round(max(lengths, default=0.0), 1)},
            "gaps": [[round(at, 1), round(n, 1)] for at, n in self.spans[:MAX_GAPS_LISTED]],
        }


class OutputTurn:
    """One turn's queued audio (float32 at the output's rate) and its bookkeeping.

    Args:
        turn_id: the session's name of the turn.
        text_at: when its first text chunk arrived (monotonic s).
        rate: the output's sample rate (Hz).
    """

    def __init__(self, turn_id: str, text_at: float, rate: int):
        self.turn_id = turn_id
        self.text_at = text_at
        self.rate = rate
        self.chunks: deque[np.ndarray] = deque()  # queued audio, oldest first
        self.buffered = 0  # samples queued
        self.resampler = TurnResampler(rate)
        self.words: deque[tuple[int, str]] = deque()  # (sample offset, word)
        self.played = 0  # samples handed out so far
        self.ended = False
        self.first_audio_sent = False
        self.underruns = 0
        self.gaps = Gaps()
        self.held = False  # prepared: queued, not played until committed
        self.committed_at: float | None = None  # when a prepared turn was committed (clock s)
        self.last_word: tuple[int, str] | None = None  # the latest word sent: (sample offset, word)

    def append(self, x: np.ndarray) -> None:
        """Queue float32 audio ``[n]`` at the output's rate (kept as it is: not the caller's array)."""
        if len(x):
            self.chunks.append(x)
            self.buffered += len(x)

    def take(self, n: int) -> np.ndarray:
        """Remove and return up to ``n`` samples (a new array; queued chunks are never copied whole)."""
        n = min(n, self.buffered)
        out = np.empty(n, dtype=np.float32)
        filled = 0
        while filled < n:
            head = self.chunks[0]
            k = min(n - filled, len(head))
            out[filled : filled + k] = head[:k]
            filled += k
            if k == len(head):
                self.chunks.popleft()
            else:
                self.chunks[0] = head[k:]
        self.buffered -= n
        return out

    def check_first_audio(self, seg: np.ndarray, now: float, pre_roll_ms: float, on_event: EventSink) -> None:
        """``seg`` is the turn's next audio, about to be handed out: the turn's ``first_audio``
        if its first audible sample is in it (``server_ttfa_ms``: first text → ``now``)."""
        if not self.first_audio_sent and len(seg) and first_audible_sample(seg, self.rate) is not None:
            self.first_audio_sent = True
            on_event(FirstAudio(turn_id=self.turn_id, server_ttfa_ms=round(1000.0 * (now - self.text_at), 1),
                                pre_roll_ms=pre_roll_ms))

    def advance(self, n: int, on_event: EventSink) -> None:
        """``n`` more samples were handed out: the ``word`` events that start in them (none
        before ``first_audio``: words of a quiet lead-in go out with the first audible sample)."""
        self.played += n
        if self.first_audio_sent:
            self.emit_words(self.played, on_event)

    def emit_words(self, upto: float, on_event: EventSink) -> None:
        """``word`` events of the words that start before sample ``upto``."""
        while self.words and self.words[0][0] < upto:
            offset, word = self.words.popleft()
            self.last_word = (offset, word)
            on_event(Word(turn_id=self.turn_id, word=word, start_ms=round(1000.0 * offset / self.rate, 1)))

    def done_event(self, interrupted: bool = False) -> TurnDone:
        """The ``turn_done`` event as of now."""
        return TurnDone(turn_id=self.turn_id, audio_ms=round(1000.0 * self.played / self.rate, 1), underruns=self.underruns,
                        **self.gaps.fields(), interrupted=interrupted)


class TurnQueue:
    """Turns in order, fed by a session, drained by a subclass (see the module docstring).

    Args:
        on_event: the session's event sink (``turn_started``, ``first_audio``, ``word``, ``turn_done``).
        rate: the output's sample rate (Hz).
        clock: monotonic clock in seconds.
        chunks_end_at_words: the engine's chunks end at word boundaries, so a late chunk is a
            pause between words (a gap), not a cut word (an underrun).
    """

    turn_class: type[OutputTurn] = OutputTurn

    def __init__(self, on_event: EventSink, rate: int, clock: Callable[[], float] = time.monotonic, *,
                 chunks_end_at_words: bool = False):
        self._on_event = on_event
        self.rate = rate
        self._clock = clock
        self.chunks_end_at_words = chunks_end_at_words
        self._turns: deque = deque()
        self._by_id: dict[str, OutputTurn] = {}

    # -- the session's side (TurnOutput) ----------------------------------------------------
    def begin_turn(self, turn_id: str, text_at: float, held: bool = False) -> None:
        """Queue a new turn; ``text_at`` is when its first text chunk arrived (``clock`` s);
        ``held``: a prepared turn, nothing of it goes out until :meth:`commit`."""
        turn = self.turn_class(turn_id, text_at, self.rate)
        turn.held = held
        self._turns.append(turn)
        self._by_id[turn_id] = turn
        self._announce(turn)

    def push_audio(self, turn_id: str, pcm: np.ndarray, sample_rate: int) -> None:
        """Queue PCM for a turn: float32 mono ``[n]`` in [-1, 1] at ``sample_rate`` Hz.

        Audio for a turn that was dropped (interrupted) or has ended is ignored.

        Raises:
            ValueError: if the sample rate changes within a turn.
        """
        turn = self._by_id.get(turn_id)
        if turn is not None and not turn.ended:
            x = turn.resampler.resample(pcm, sample_rate)
            turn.append(x if x is not pcm else x.copy())  # (at the output's rate already: the caller's array)
            self._audio_added(turn, len(pcm) / sample_rate)

    def push_word(self, turn_id: str, word: str, start_ms: float) -> None:
        """Schedule a ``word`` event at ``start_ms`` into the turn's audio."""
        turn = self._by_id.get(turn_id)
        if turn is not None:
            turn.words.append((int(round(start_ms * self.rate / 1000.0)), word))
            self._word_added(turn)

    def end_turn(self, turn_id: str) -> None:
        """No more audio for the turn (its resampler is flushed); ``turn_done`` follows its last audio."""
        turn = self._by_id.get(turn_id)
        if turn is None or turn.ended:
            return
        turn.append(turn.resampler.flush())
        turn.ended = True
        self._input_ended(turn)

    def interrupt(self) -> list[Event]:
        """Drop every queued turn (barge-in); returns the events that end them, in order: each
        turn's ``turn_done`` with ``"interrupted": True`` (audio handed out, underruns, gaps),
        the playing turn first."""
        dropped: list[Event] = [turn.done_event(interrupted=True) for turn in self._turns]
        self._turns.clear()
        self._by_id.clear()
        return dropped

    def cancel(self, turn_id: str) -> list[Event]:
        """Drop one turn, queued or playing (the others stay in order); returns the events that
        end it: its ``turn_done`` with ``"interrupted": True`` (none if it is not queued)."""
        turn = self._by_id.pop(turn_id, None)
        if turn is None:
            return []
        head = turn is self._turns[0]
        self._turns.remove(turn)
        return self._cancelled(turn, head)

    def commit(self, turn_id: str) -> None:
        """Release a held (prepared) turn: it plays in its place in the queue, its first audio
        at the first frame once the turns before it are done. Its ``first_audio.server_ttfa_ms``
        is then counted from the commit. A turn not held or not queued is left alone."""
        turn = self._by_id.get(turn_id)
        if turn is not None and turn.held:
            turn.held = False
            turn.committed_at = turn.text_at = self._clock()
            self._committed(turn)

    def _committed(self, turn: OutputTurn) -> None:
        """``turn`` was held and is committed now."""

    def _cancelled(self, turn: OutputTurn, head: bool) -> list[Event]:
        """``turn`` was taken out of the queue (``head``: it was playing); the events that end it."""
        return [turn.done_event(interrupted=True)]

    def reset(self) -> None:
        """Forget every turn now, without reading them (after a failure of the output itself)."""
        self._turns = deque()
        self._by_id = {}

    @property
    def idle(self) -> bool:
        """True when no turn is queued."""
        return not self._turns

    def audio_runs_out_at(self) -> float:
        """When the audio queued now will have played out (``clock`` s): a synthesis job for
        the session is due then; now when none is queued."""
        return self._clock() + sum(t.buffered for t in self._turns) / self.rate

    # -- what subclasses decide -------------------------------------------------------------
    def _announce(self, turn: OutputTurn) -> None:
        """The turn is queued: its ``turn_started`` goes out now."""
        self._on_event(TurnStarted(turn_id=turn.turn_id))

    def _audio_added(self, turn: OutputTurn, seconds: float) -> None:
        """``seconds`` of engine audio were queued for ``turn``."""

    def _word_added(self, turn: OutputTurn) -> None:
        """A word was placed in ``turn``."""

    def _input_ended(self, turn: OutputTurn) -> None:
        """``turn`` will get no more audio."""

    def _finish(self, turn: OutputTurn) -> None:
        """The head turn's audio is all out: its last words, then ``turn_done``."""
        self._turns.popleft()
        self._by_id.pop(turn.turn_id, None)
        turn.emit_words(float("inf"), self._on_event)  # words placed past the end of the audio
        self._on_event(turn.done_event())
