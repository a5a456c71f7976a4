"""Fallback: a turn its engine cannot speak, or not in time, is finished by another engine.

``myna serve --engine dsm --fallback piper`` wraps the DSM engine in a :class:`FallbackEngine`.
Sessions see one engine (its name, voices and sample rate are the primary's); each turn's
:class:`FallbackStream` drives the primary's stream and moves the turn to the fallback engine
when the primary

- fails (:class:`~myna.engines.base.EngineError` or any exception from its stream, or an
  ``unit_failed`` error event: a unit it could not speak): reason ``error``;
- has no first audio ``after_ms`` after the turn first had something the primary could start
  on (counted from when the session's previous turn finished synthesis): reason ``late``. What
  it can start on follows its lane: a frame-level engine (DSM) starts on the first word; Piper's
  lanes on their first unit (``piper``: the first phrase, ``piper-sentence``: the first
  sentence end, ``piper-whole``: ``end_turn``), tracked here with a chunker like the primary's
  (:func:`unit_chunker`), so text that trickles in from a slow LLM is not the engine's fault;
- stalls: words are waiting (or the input has ended and the turn has not) and no audio has
  come for ``stall_ms`` past the moment the audio already sent has played out (and past the
  last text, so a slow LLM is no stall): reason ``stall``.

What was heard stays heard: a word whose :class:`~myna.engines.base.WordEvent` went out was
spoken by the primary; the fallback starts at the first word that did not
(:meth:`~myna.engines.base.SynthesisStream.resume`, with a copy of the turn's text intake, so
the text still arriving goes on where it stands and every word is spoken once). Its audio is
resampled to the primary's rate and its word times continue the turn's. The stream emits a
:class:`~myna.engines.base.FallbackEvent` (the session's ``fallback`` event) at the switch.

A primary that keeps failing is taken out of rotation by a :class:`CircuitBreaker` (closed →
open after ``failures`` failures within ``window_s``; after ``cooldown_s`` half-open: the next
turn probes the primary, the others go to the fallback; a probe that speaks its turn closes the
breaker, one that fails opens it again). While it is open, turns go straight to the fallback
(reason ``open``); sessions keep asking for the primary, so they get its voice back with the
first turn after it recovers.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from myna.audio.resample import TurnResampler
from myna.engines.base import (AudioChunk, Engine, EngineError, EngineWrapper, ErrorEvent, FallbackEvent, StreamItem,
                               SynthesisStream, TurnOrder, WordEvent)
from myna.text import Pause

log = logging.getLogger(__name__)

#: Default deadline of a turn's first audio from the primary (ms; ``--fallback-after-ms``).
AFTER_MS = 500.0
#: Default longest silence mid-turn, past the audio already sent, before the switch (ms).
STALL_MS = 1000.0


class CircuitBreaker:
    """Whether new turns may use an engine that has been failing (closed / open / half-open).

    Args:
        failures: failures within ``window_s`` that open the breaker.
        window_s: how far back failures count (s).
        cooldown_s: how long the breaker stays open before a turn probes the engine (s).
        clock: monotonic clock (s).
    """

    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(self, failures: int = 3, window_s: float = 60.0, cooldown_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        if failures < 1:
            raise ValueError("failures must be at least 1")
        self.failures, self.window_s, self.cooldown_s = failures, window_s, cooldown_s
        self._clock = clock
        self._recent: deque[float] = deque()  # failure times within the window (closed)
        self._opened_at: float | None = None  # None: closed
        self._probing = False  # a half-open probe turn is in flight

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open`` (the cool-down has passed: the next turn probes)."""
        if self._opened_at is None:
            return self.CLOSED
        return self.HALF_OPEN if self._clock() >= self._opened_at + self.cooldown_s else self.OPEN

    def admit(self) -> str | None:
        """A new turn asks for the engine: ``closed`` (use it), ``half_open`` (use it as the
        probe; report with :meth:`success`, :meth:`failure` or :meth:`release`), or None (use
        the fallback: open, or another turn is probing)."""
        state = self.state
        if state == self.CLOSED:
            return state
        if state == self.HALF_OPEN and not self._probing:
            self._probing = True
            return state
        return None

    def success(self) -> None:
        """The probe turn was spoken by the engine: the breaker closes (failures of a closed one
        keep counting within their window). Turns admitted ``closed`` report no success: one
        begun before the breaker opened says nothing of the engine now."""
        if self._opened_at is not None:
            self._opened_at, self._probing = None, False

    def failure(self) -> None:
        """A turn failed on the engine: counted; a failed probe (or a failure while open)
        opens the breaker again for a full cool-down."""
        now = self._clock()
        if self._opened_at is not None:
            self._opened_at, self._probing = now, False
            return
        self._recent.append(now)
        while self._recent and self._recent[0] < now - self.window_s:
            self._recent.popleft()
        if len(self._recent) >= self.failures:
            self._opened_at = now
            self._recent.clear()
            log.warning("circuit breaker open: %d failures within %.0f s; new turns go to the fallback for %.0f s",
                        self.failures, self.window_s, self.cooldown_s)

    def release(self) -> None:
        """A probe turn ended with no verdict (interrupted): the next turn probes instead."""
        self._probing = False


class FallbackEngine(EngineWrapper):
    """``primary`` with ``fallback`` behind it (see the module docstring).

    Everything but the streams is the primary's (name, voices, rate, chunk kind, phrase cache);
    the breaker state is this engine's own.

    Args:
        primary: the engine sessions ask for.
        fallback: a loaded engine that finishes the turns the primary cannot.
        after_ms: deadline of a turn's first audio from the primary (ms).
        stall_ms: longest silence mid-turn, past the audio already sent, before the switch (ms).
        breaker: the primary's circuit breaker (default :class:`CircuitBreaker` ()).
        clock, call_later: the streams' clock and timer (tests pass a manual timer; see
            :class:`~myna.engines.base.SynthesisStream`).
    """

    def __init__(self, primary: Engine, fallback: Engine, *, after_ms: float = AFTER_MS, stall_ms: float = STALL_MS,
                 breaker: CircuitBreaker | None = None, clock: Callable[[], float] | None = None,
                 call_later: Callable[[float, Callable[[], None]], Any] | None = None):
        if primary is fallback:
            raise ValueError(f"{primary.name} cannot fall back to itself")
        super().__init__(primary)
        self.primary, self.fallback = primary, fallback
        self.after_s, self.stall_s = after_ms / 1000.0, stall_ms / 1000.0
        self.breaker = breaker or CircuitBreaker()
        self.clock, self.call_later = clock, call_later
        self.order = TurnOrder()

    async def start(self) -> None:
        await self.primary.start()
        await self.fallback.start()

    # close(): the primary's; the fallback is a loaded engine of its own, closed as such.

    @property
    def warms_through(self) -> Engine:
        return self.primary  # warm-up turns are no test of the primary: they must not count for its breaker

    def breaker_state(self) -> str:
        return self.breaker.state

    def stream(self, voice: str | None = None, group: object = None) -> "FallbackStream":
        if voice not in (None, *self.voices):
            raise EngineError("unknown_voice", f"{self.name} has no voice {voice!r}; available: {', '.join(self.voices)}")
        return FallbackStream(self, voice, group)


class FallbackStream(SynthesisStream):
    """One turn on a :class:`FallbackEngine`: the primary's stream, switched to the fallback's
    when it fails, starts late or stalls (see the module docstring).

    The stream's own intake tracks the turn's words and pauses (the items to resume from);
    the text itself goes to the active engine's stream as it comes.
    """

    def __init__(self, engine: FallbackEngine, voice: str | None, group: object):
        super().__init__(scripts=engine.scripts, clock=engine.clock, call_later=engine.call_later)
        self._engine = engine
        self._group = group
        self._items: list[str | Pause] = []  # the turn's words and pauses so far, in order
        self._words = 0  # words among them
        self._heard = 0  # word events sent (words spoken by the engine that sent them)
        self._words_out: deque[WordEvent] = deque()  # word events waiting for their audio
        self._out_ms = 0.0  # audio sent (ms at the primary's rate)
        self._offset_ms = 0.0  # where the fallback's audio starts in the turn (ms)
        self._first_audio_at: float | None = None
        self._progress_at: float | None = None  # the last item from the active engine
        self._last_text_at: float | None = None
        self._words_at: float | None = None  # the turn's first word
        self._units = unit_chunker(engine.primary)  # cuts words as the primary does (None: it starts on words)
        self._startable_at: float | None = None  # when the primary first had a unit it could start on
        self._resampler = None  # fallback rate → primary rate
        self._watchdog = None
        self._switched = False
        self._active: SynthesisStream | None = None  # None: switched, the fallback not open yet
        self._opened = asyncio.Event()  # the fallback's stream was opened
        # This turn's end (the next one's late clock starts then), after the group's previous turn.
        previous, self._done = engine.order.join(group)
        self._ready_at: float | None = None  # the group's previous turn finished
        if previous is None or previous.done():
            self._ready_at = self._now()
        else:
            previous.add_done_callback(self._previous_done)
        self._admitted = engine.breaker.admit()
        reason = "open" if self._admitted is None else None
        if reason is None:
            try:
                self._active = engine.primary.stream(voice, group)
            except Exception as exc:  # e.g. the primary's loop is gone: a failure like any other
                log.warning("%s could not open a turn, using %s: %s", engine.primary.name, engine.fallback.name, exc)
                engine.breaker.failure()
                reason = "error"
        if reason is not None:
            try:
                self._switch(reason, count=False)
            except BaseException:
                self._release()  # no turn: the group's next one must not wait for it
                raise
        self._task = self._loop.create_task(self._run())

    # -- text in: to the active engine, and tracked -------------------------------------------
    def set_lexicon(self, lexicon) -> None:
        self._here_and_active("set_lexicon", lexicon)

    def set_normalise(self, on: bool) -> None:
        self._here_and_active("set_normalise", on)

    def set_phrase_cache(self, on: bool) -> None:
        self._here_and_active("set_phrase_cache", on)

    def _here_and_active(self, setting: str, value) -> None:
        """A turn setting here (a fallback's stream resumes from a copy of this intake) and on
        the active stream."""
        getattr(super(), setting)(value)
        if self._active is not None:
            getattr(self._active, setting)(value)

    def push_text(self, chunk: str) -> None:
        self._last_text_at = self._now()
        super().push_text(chunk)
        if self._active is not None:  # (else the fallback gets it from the intake when it opens)
            self._active.push_text(chunk)

    def _take(self, items) -> None:
        """Track words and pauses, and report left-out scripts here, once per turn whichever
        engine speaks (the engines' own reports are dropped: each would report its part)."""
        super()._take(items)
        for item in items:
            if isinstance(item, (str, Pause)):
                self._items.append(item)
                if isinstance(item, str):
                    self._words += 1
                    self._words_at = self._words_at if self._words_at is not None else self._now()
        self._rearm()

    # The primary's lane, followed until its first unit (then ``_units`` has done its job).
    def _on_words(self, words: list[str]) -> None:  # (words are tracked in _take)
        if self._units is None:
            self._startable(words)
        elif self._startable_at is None:
            now = self._now()
            for word in words:
                if self._startable(self._units.push(word, now)):
                    return
            self._startable(self._units.poll(now))

    def _on_pause(self, ms: float) -> None:
        if self._units is not None and self._startable_at is None:
            self._startable(self._units.pause(ms))

    def _on_quiet(self) -> None:
        if self._units is not None and self._startable_at is None:
            self._startable(self._units.settle())

    def _next_deadline(self) -> float | None:
        return self._units.deadline if self._units is not None and self._startable_at is None else None

    def _on_deadline(self, now: float) -> None:
        if self._units is not None and self._startable_at is None:
            self._startable(self._units.poll(now))

    def _startable(self, units) -> bool:
        """``units`` came out of the primary's lane: from the first of them, it can start."""
        if self._startable_at is None and any(isinstance(u, str) for u in units):
            self._startable_at = self._now()
            self._rearm()
        return self._startable_at is not None

    def _on_end_input(self) -> None:
        if self._units is not None and self._startable_at is None:
            self._startable(self._units.flush())
        if self._active is not None:
            self._active.end_input()

    def _on_cancel(self) -> None:
        self._disarm_watchdog()
        if self._active is not None:
            self._active.cancel()
        self._task.cancel()
        if self._admitted == CircuitBreaker.HALF_OPEN and not self._switched:
            self._engine.breaker.release()
        self._release()

    def _release(self) -> None:
        if not self._done.done():
            self._done.set_result(None)

    def _previous_done(self, _future) -> None:
        self._ready_at = self._now()
        if self._switched and self._active is None and not self.cancelled:
            try:
                self._open_fallback()
            except Exception as exc:  # the fallback cannot take the turn: it ends, as without one
                log.exception("%s could not take a turn", self._engine.fallback.name)
                self._task.cancel()
                self._fail(exc if isinstance(exc, EngineError) else EngineError("engine_failed", f"fallback failed: {exc}"))
        self._rearm()

    # -- items out ---------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while True:
                stream = self._active
                if stream is None:  # switched, the fallback opens when the previous turn is done
                    self._opened.clear()
                    await self._opened.wait()
                    continue
                try:
                    async for item in stream:
                        if stream is not self._active:
                            break  # switched (the watchdog): the primary's items are no longer wanted
                        self._forward(item)
                except Exception as exc:
                    if self._switched:
                        raise  # the fallback failed: the turn ends, as it would without one
                    log.warning("%s failed mid-turn, switching to %s: %s", self._engine.primary.name,
                                self._engine.fallback.name, exc)
                    self._switch("error")
                    continue
                if stream is self._active:
                    break  # the active engine finished the turn
            self._release_words(every=True)  # the engine is done: its last words are in its audio
            self._flush_resampler()
            if self._admitted == CircuitBreaker.HALF_OPEN and not self._switched:
                # Only the probe has a verdict (a turn begun before the breaker opened has none),
                # and only one that spoke: a turn with no words proves nothing.
                if self._heard:
                    self._engine.breaker.success()
                else:
                    self._engine.breaker.release()
        except asyncio.CancelledError:
            pass
        except EngineError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug costs this turn only
            log.exception("fallback stream failed")
            self._fail(EngineError("engine_failed", f"synthesis failed: {exc}"))
        finally:
            self._disarm_watchdog()
            self._release()
            self._finish()

    def _forward(self, item: StreamItem) -> None:
        self._progress_at = self._now()
        if isinstance(item, AudioChunk):
            pcm = self._resample(item) if self._switched and item.sample_rate != self.sample_rate else item.pcm
            if len(pcm):
                self._first_audio_at = self._first_audio_at if self._first_audio_at is not None else self._progress_at
                self._out_ms += 1000.0 * len(pcm) / self.sample_rate
                self._emit(AudioChunk(pcm, self.sample_rate))
            self._release_words(every=self._switched)
        elif isinstance(item, WordEvent):
            self._words_out.append(WordEvent(item.word, item.start_ms + self._offset_ms))
            self._release_words(every=self._switched)
        elif isinstance(item, ErrorEvent) and item.code == "unsupported_language":
            pass  # reported by this stream (_take)
        elif isinstance(item, ErrorEvent) and item.code == "unit_failed" and not self._switched:
            log.warning("%s: %s; switching to %s", self._engine.primary.name, item.message, self._engine.fallback.name)
            self._switch("error")  # the fallback speaks the unit: nothing is left out
            return
        else:
            self._emit(item)
        self._rearm()

    def _release_words(self, every: bool = False) -> None:
        """Send the word events whose audio has begun (all of them with ``every``). A frame-level
        engine (DSM) announces a word before its audio: until the audio comes it is not heard,
        and a switch gives it to the fallback."""
        while self._words_out and (every or self._words_out[0].start_ms < self._out_ms):
            self._heard += 1
            self._emit(self._words_out.popleft())

    @property
    def sample_rate(self) -> int:
        return self._engine.sample_rate

    def _resample(self, chunk: AudioChunk) -> np.ndarray:
        if self._resampler is None:
            self._resampler = TurnResampler(self.sample_rate)
        return self._resampler.resample(np.asarray(chunk.pcm, np.float32), chunk.sample_rate)

    def _flush_resampler(self) -> None:
        if self._resampler is not None:
            tail = self._resampler.flush()
            if len(tail):
                self._out_ms += 1000.0 * len(tail) / self.sample_rate
                self._emit(AudioChunk(tail, self.sample_rate))

    # -- the switch ------------------------------------------------------------------------
    def _switch(self, reason: str, count: bool = True) -> None:
        """Cancel the primary's stream (``count``: a failure for its breaker) and give the
        fallback's the words not yet heard: now, or once the session's previous turn has
        finished synthesis (the fallback's own order of a session's turns is the order its
        streams open in: a later turn opened first would go first)."""
        engine = self._engine
        self._switched = True
        self._disarm_watchdog()
        if count:
            engine.breaker.failure()
        if self._active is not None:
            self._active.cancel()
        self._active = None
        self._words_out.clear()  # announced, never heard: the fallback speaks them
        self._offset_ms = self._out_ms
        if self._ready_at is not None:
            self._open_fallback()
        self._emit(FallbackEvent(engine.primary.name, engine.fallback.name, reason, self._heard))

    def _open_fallback(self) -> None:
        """The fallback's stream for the rest of the turn, made active."""
        stream = self._engine.fallback.stream(None, self._group)
        quiet_for = None if self._text_at is None else self._now() - self._text_at
        stream.set_phrase_cache(self.phrase_cache_on)
        stream.resume(self._unheard(), copy.deepcopy(self._intake), quiet_for)
        if self._input_ended:
            stream.end_input()
        self._active = stream
        self._opened.set()

    def _unheard(self) -> list[str | Pause]:
        """The tracked items after the words already heard."""
        words = 0
        for i, item in enumerate(self._items):
            if isinstance(item, str):
                if words == self._heard:
                    return self._items[i:]
                words += 1
        return []

    # -- the watchdog (late, stall) ------------------------------------------------------------
    def _due(self) -> float | None:
        """When the primary is late or stalled, if it does not send audio by then (turn clock, s)."""
        if self._switched or self.cancelled:
            return None
        if self._first_audio_at is None:
            if self._startable_at is None or self._ready_at is None:
                return None  # nothing it can start on yet, or the session's previous turn is still synthesising
            return max(self._startable_at, self._ready_at) + self._engine.after_s
        if self._words <= self._heard and not self._input_ended:
            return None  # every word so far is out: waiting for text is no stall (after end_turn it is)
        played_out = self._first_audio_at + self._out_ms / 1000.0  # the earliest the listener runs dry
        return max(played_out, self._progress_at or 0.0, self._last_text_at or 0.0) + self._engine.stall_s

    def _rearm(self) -> None:
        self._disarm_watchdog()
        due = self._due()
        if due is not None:
            self._watchdog = self._call_later(max(0.0, due - self._now()), self._on_watchdog)

    def _disarm_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _on_watchdog(self) -> None:
        self._watchdog = None
        due = self._due()
        if due is None:
            return
        if self._now() >= due:
            try:
                self._switch("late" if self._first_audio_at is None else "stall")
            except Exception as exc:  # the fallback cannot take the turn: it ends, as without one
                log.exception("the switch to %s failed", self._engine.fallback.name)
                self._task.cancel()
                self._fail(exc if isinstance(exc, EngineError) else EngineError("engine_failed", f"fallback failed: {exc}"))
        else:
            self._rearm()


def unit_chunker(engine: Engine):
    """A fresh chunker that cuts a turn's words into units as ``engine``'s streams do
    (:mod:`myna.text.segment`), to tell when a turn first has a unit it can start on; None for
    an engine that starts on words (a frame-level engine, or one that names no lane).

    The lane is the engine's ``strategy`` (Piper's engines and variants name theirs: a key of
    :data:`myna.engines.piper.STRATEGIES`), looked for through wrappers.
    """
    while not hasattr(engine, "strategy") and isinstance(engine, EngineWrapper):
        engine = engine.inner
    strategy = getattr(engine, "strategy", None)
    if not isinstance(strategy, str):
        return None
    from myna.engines.piper import STRATEGIES

    factory = STRATEGIES.get(strategy)
    return factory[0]() if factory is not None else None


__all__ = ["AFTER_MS", "STALL_MS", "CircuitBreaker", "FallbackEngine", "FallbackStream", "unit_chunker"]
