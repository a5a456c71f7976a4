"""The engine interface: one streaming synthesis stream per turn.

An :class:`Engine` is loaded once per process and shared by all sessions. Each turn opens a
:class:`SynthesisStream` with :meth:`Engine.stream`; the caller pushes text chunks as the LLM
writes them (a chunk may split a word anywhere), calls :meth:`SynthesisStream.end_input` at
the end of the turn, and iterates the stream for :class:`AudioChunk`, :class:`WordEvent` and
:class:`ErrorEvent` items until it ends. :meth:`SynthesisStream.cancel` drops the turn at once
(barge-in).

The input side is shared: the base stream runs the turn's text through
:class:`myna.text.TextIntake` (markup, line breaks, whole words, scripts) and hands the engine
words (:meth:`SynthesisStream._on_words`) and pauses (:meth:`SynthesisStream._on_pause`). It
also keeps the turn's clock: a word with nothing after it is complete once the text has been
quiet for :data:`QUIET_S` (LLM tokens carry their space in front, so a sentence's last word
would otherwise wait for the next token), and an engine may ask to be woken at a deadline of
its own (:meth:`SynthesisStream._next_deadline`, e.g. Piper's first-phrase wait).

Streams never run model code on the event loop: engines synthesise on their own threads and
hand results back through asyncio queues.
"""

from __future__ import annotations

import abc
import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, AsyncIterator

import numpy as np

from myna.errors import MynaError
from myna.text import Pause, Skipped, TextIntake
from myna.text import said
from myna.text.scripts import LATIN

#: A word with nothing after it is complete after this much quiet in the text (s).
QUIET_S = 0.15


@dataclass(frozen=True)
class AudioChunk:
    """A piece of synthesised speech.

    Attributes:
        pcm: float32 mono samples in [-1, 1], shape ``[n]``.
        sample_rate: samples per second of ``pcm`` (Hz), the engine's native rate.
    """

    pcm: np.ndarray
    sample_rate: int

    @property
    def duration_ms(self) -> float:
        """Length of the chunk in milliseconds."""
        return 1000.0 * len(self.pcm) / self.sample_rate


@dataclass(frozen=True)
class WordEvent:
    """A word and where it starts in the turn's audio.

    Attributes:
        word: the word as spoken (normalised text, punctuation stripped).
        start_ms: offset of the word's first sample from the start of the turn's audio (ms).
    """

    word: str
    start_ms: float


#: Error codes a turn survives (:class:`ErrorEvent`): the ``error`` event is followed by the
#: rest of the turn's audio and its ``turn_done``.
NON_FATAL_CODES = frozenset({"unsupported_language", "unit_failed", "phonemes_ignored"})


@dataclass(frozen=True)
class ErrorEvent:
    """A problem with part of a turn that the turn survives: the client gets an ``error`` event
    (``code``, ``message``) and the rest of the turn is spoken.

    Codes (:data:`NON_FATAL_CODES`): ``unsupported_language`` (words in a script the voice
    cannot read were left out; the message names the script), ``unit_failed`` (one unit's
    synthesis failed twice: its words were left out, the units after it are spoken),
    ``phonemes_ignored`` (IPA given in ``<phoneme>`` or the lexicon was not read: the engine
    takes no phonemes and read the written word, or the voice has no phoneme for some of its
    symbols, which were left out; the message names them).
    """

    code: str
    message: str


@dataclass(frozen=True)
class FallbackEvent:
    """The turn moved to another engine (:mod:`myna.engines.fallback`); the client gets a
    ``fallback`` event.

    Attributes:
        from_engine: the engine that was to speak the turn.
        to_engine: the engine speaking the rest of it.
        reason: ``error`` (the engine failed), ``late`` (no first audio by the deadline),
            ``stall`` (no audio for the stall deadline mid-turn) or ``open`` (the engine is out
            of rotation after repeated failures: the whole turn goes to ``to_engine``).
        at_word: index in the turn of the first word ``to_engine`` speaks (the words before it
            were heard from ``from_engine``).
    """

    from_engine: str
    to_engine: str
    reason: str
    at_word: int


StreamItem = AudioChunk | WordEvent | ErrorEvent | FallbackEvent


def spoken_word(word: str) -> str:
    """A word as :class:`WordEvent` carries it (captions): surrounding punctuation removed.

    >>> spoken_word('"Hello,"')
    'Hello'
    """
    word = said.written_of(word)  # (a word whose spoken form was given: its written form)
    return word.strip(".,;:!?\"'()[]{}…-—") or word


class EngineError(MynaError):
    """A synthesis failure that ends one turn; carries a contract error ``code``."""


#: The pace a turn may ask for, against the voice's own (1.0): ``speed`` on a turn's first text.
MIN_SPEED, MAX_SPEED = 0.5, 2.0


def check_speed(speed: object) -> float:
    """``speed`` as a float if it is a number from :data:`MIN_SPEED` to :data:`MAX_SPEED`.

    Raises:
        EngineError: ``bad_speed`` for anything else (booleans, strings, NaN, out of range).
    """
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not MIN_SPEED <= speed <= MAX_SPEED:
        raise EngineError("bad_speed", f'"speed" must be a number from {MIN_SPEED:g} to {MAX_SPEED:g} '
                                       f"(1.0: the voice's own pace)")
    return float(speed)


#: A turn's ``language``: a BCP 47 tag's shape (``en``, ``en-GB``, ``pt_BR``, ``zh-Hant-TW``).
_LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8})*")


def check_language(language: object) -> str:
    """``language`` if it is a language tag (``en``, ``en-GB``, ``en_US``: letters, then
    subtags after ``-`` or ``_``).

    Raises:
        EngineError: ``bad_language`` for anything else.
    """
    if not isinstance(language, str) or not _LANGUAGE_TAG.fullmatch(language):
        raise EngineError("bad_language", '"language" must be a language tag such as "en" or "en-US"')
    return language


def language_of(engine: "Engine", voice: str | None) -> str | None:
    """The language ``voice`` of ``engine`` speaks, from its catalogue entry
    (:meth:`Engine.voice_catalogue`; None or ``default``: the engine's first voice), or None
    when the engine does not say."""
    return _catalogue_entry(engine, voice).get("language")


def scripts_of(engine: "Engine", voice: str | None) -> frozenset[str]:
    """The scripts ``voice`` of ``engine`` reads (:mod:`myna.text.scripts`), from its catalogue
    entry where it says, else the engine's (:attr:`Engine.scripts`)."""
    scripts = _catalogue_entry(engine, voice).get("scripts")
    return frozenset(scripts) if scripts else engine.scripts


def _catalogue_entry(engine: "Engine", voice: str | None) -> dict:
    catalogue = engine.voice_catalogue()
    if voice in (None, "default"):
        return catalogue[0] if catalogue else {}
    return next((v for v in catalogue if v.get("name") == voice), {})


def speaks(voice_language: str | None, asked: str) -> bool:
    """Whether a voice of ``voice_language`` speaks the language tag ``asked``: the same primary
    language (``en`` speaks ``en``, ``en-GB``, ``en_US``; the region is not compared, a voice
    reads its own accent). An unknown voice language speaks anything (nothing to check)."""
    if not voice_language:
        return True
    primary = lambda tag: re.split(r"[-_]", tag)[0].lower()  # noqa: E731
    return primary(voice_language) == primary(asked)


class SynthesisStream(abc.ABC):
    """One turn of streaming synthesis.

    Subclasses implement :meth:`_on_words`, :meth:`_on_end_input` and :meth:`_on_cancel`
    (and, if they can, :meth:`_on_pause`, :meth:`_on_quiet`, :meth:`_next_deadline`,
    :meth:`_on_text`); they
    publish results with :meth:`_emit` and finish with :meth:`_finish`. The base class owns the
    text intake (:class:`myna.text.TextIntake`), so a word split across chunks reaches the
    engine whole, markup never does, and words in a script the voice cannot read become an
    :class:`ErrorEvent` (``unsupported_language``, once per script and turn) instead.

    Args:
        scripts: the scripts the voice reads (:mod:`myna.text.scripts`).
        clock: the turn's clock in seconds (default: the event loop's).
        call_later: schedules ``callback()`` after ``delay`` seconds and returns a handle with
            ``cancel()`` (default: the event loop's); tests pass a manual timer.
        quiet_s: quiet time after which a word with nothing after it is complete (s).
    """

    def __init__(self, *, scripts: frozenset[str] = LATIN, clock: Callable[[], float] | None = None,
                 call_later: Callable[[float, Callable[[], None]], Any] | None = None,
                 quiet_s: float = QUIET_S) -> None:
        self._intake = TextIntake(scripts)
        self._queue: asyncio.Queue[StreamItem | BaseException | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._clock = clock or self._loop.time
        self._call_later = call_later or self._loop.call_later
        self._quiet_s = quiet_s
        self._text_at: float | None = None  # when the last chunk came, until the quiet after it
        self._timer = None
        self._reported_scripts: set[str] = set()
        self._input_ended = False
        self._cancelled = False
        self.phrase_cache_on = True  # set_phrase_cache

    # -- caller side -------------------------------------------------------------------
    def set_lexicon(self, lexicon) -> None:
        """Apply ``lexicon`` (:class:`myna.text.lexicon.Lexicon`) to this turn's words before the
        process's; call before the first text."""
        self._intake.lexicon = lexicon.then(self._intake.lexicon)

    def set_speed(self, speed: float) -> None:
        """Speak this turn at ``speed`` × the voice's pace; call before the first text. An
        engine without an honest way to change its pace refuses any speed but 1.0.

        Raises:
            EngineError: ``bad_speed`` (not a number from :data:`MIN_SPEED` to
                :data:`MAX_SPEED`) or ``unsupported_speed`` (this engine speaks at its own pace).
        """
        if check_speed(speed) != 1.0:
            raise EngineError("unsupported_speed", "this engine speaks at its own pace: only speed 1.0 is "
                                                   "supported (piper takes 0.5 to 2.0)")

    def set_normalise(self, on: bool) -> None:
        """Whether the turn's words are normalised (phone numbers, dates, units, codes, numbers
        said in words: :mod:`myna.text.normaliser`; the default) or given to the voice as
        written (the session's ``normalise: false``); call before the first text."""
        self._intake.normalise = on

    def set_phrase_cache(self, on: bool) -> None:
        """Whether this turn may be answered from the engine's phrase cache, and fill it (the
        default; :mod:`myna.engines.phrase_cache`), or is synthesised afresh (the session's
        ``phrase_cache: false``: a benchmark or a race that repeats its text); call before the
        first text."""
        self.phrase_cache_on = on

    def push_text(self, chunk: str) -> None:
        """Add a chunk of the turn's text (any split, any size).

        Raises:
            RuntimeError: after :meth:`end_input` or :meth:`cancel`.
        """
        if self._input_ended or self._cancelled:
            raise RuntimeError("push_text after end_input/cancel")
        self._text_at = self._clock()
        self._take(self._intake.push(chunk))
        self._on_text()
        self._arm()

    def end_input(self) -> None:
        """No more text for this turn: synthesise what is buffered, then end the stream."""
        if self._input_ended or self._cancelled:
            return
        self._input_ended = True
        self._disarm()
        self._take(self._intake.flush())
        self._on_end_input()

    def cancel(self) -> None:
        """Drop the turn now: pending synthesis is abandoned and the stream ends."""
        if self._cancelled:
            return
        self._cancelled = True
        self._disarm()
        self._on_cancel()
        self._finish()

    def resume(self, items: list, intake: TextIntake, quiet_for: float | None) -> None:
        """Take over a turn part-way (another engine's turn, :mod:`myna.engines.fallback`).

        Call once, before :meth:`push_text`. Later chunks continue the turn's text as usual.

        Args:
            items: the turn's intake items not yet spoken, in order: words (str) and
                :class:`myna.text.Pause`.
            intake: the turn's intake as it stands (a copy): it holds the text still
                incomplete (a partial word, a line start, an unfinished tag).
            quiet_for: how long ago the last chunk came (s), or None when the text has been
                quiet for the quiet time already (what waited for more text is complete).
        """
        self._intake = intake
        self._take(items)
        self._text_at = None if quiet_for is None else self._clock() - quiet_for
        self._arm()

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled

    def __aiter__(self) -> AsyncIterator[StreamItem]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[StreamItem]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            if not self._cancelled:
                yield item

    # -- the turn's clock ----------------------------------------------------------------
    def _now(self) -> float:
        """The turn's clock (s)."""
        return self._clock()

    #: The engine reads marked words itself (:mod:`myna.text.said`: spoken words or IPA); for
    #: one that does not, :meth:`_take` hands it the spoken words, or the written word where
    #: only phonemes were given (an ``ErrorEvent`` ``phonemes_ignored`` says so once a turn).
    reads_marked_words = False

    def _take(self, items) -> None:
        """Hand intake items to the engine: runs of words, pauses, skipped-script reports."""
        words: list[str] = []
        for item in items:
            if isinstance(item, str):
                if self.reads_marked_words or said.MARK not in item:
                    words.append(item)
                else:
                    words += self._spoken_words(item)
                continue
            if words:
                self._on_words(words)
                words = []
            if isinstance(item, Pause):
                self._on_pause(item.ms)
            elif isinstance(item, Skipped) and item.script not in self._reported_scripts:
                self._reported_scripts.add(item.script)
                self._emit(ErrorEvent("unsupported_language",
                                      f"the voice does not read {item.script} script; "
                                      f"left out: {item.word!r} (and any more {item.script} text in this turn)"))
        if words:
            self._on_words(words)

    def _spoken_words(self, word: str) -> list[str]:
        """The words an engine that takes no phonemes says for a (possibly marked) word: its
        spoken form's words, or the written word where only phonemes were given (an
        ``ErrorEvent`` ``phonemes_ignored`` says so once a turn)."""
        written, spoken = said.split(word)
        if spoken is None:
            return [word]
        if said.ipa_of(spoken) is not None:
            if "phonemes" not in self._reported_scripts:
                self._reported_scripts.add("phonemes")
                self._emit(ErrorEvent("phonemes_ignored", "this engine cannot take phonemes: the words of "
                                                          "<phoneme> tags in this turn are read as written"))
            spoken = written
        return spoken.split()

    def _arm(self) -> None:
        """Schedule the next wake-up: the quiet time after the last chunk, or the engine's deadline."""
        self._disarm()
        due = [self._text_at + self._quiet_s] if self._text_at is not None else []
        engine_due = self._next_deadline()
        if engine_due is not None:
            due.append(engine_due)
        if due:
            self._timer = self._call_later(max(0.0, min(due) - self._clock()), self._on_timer)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self._input_ended or self._cancelled:
            return
        now = self._clock()
        if self._text_at is not None and now >= self._text_at + self._quiet_s:
            self._text_at = None  # quiet: what waited for more text is complete
            self._take(self._intake.settle())
            self._on_quiet()
        engine_due = self._next_deadline()
        if engine_due is not None and now >= engine_due:
            self._on_deadline(now)
        self._arm()

    # -- engine side -------------------------------------------------------------------
    @abc.abstractmethod
    def _on_words(self, words: list[str]) -> None:
        """Whole, normalised words are available (called on the event loop)."""

    def _on_pause(self, ms: float) -> None:
        """The text asks for a pause here: ``ms`` of silence (``<break>``), or 0 for a phrase
        boundary (a line break). Engines that cannot place silence ignore it (optional)."""

    def _on_quiet(self) -> None:
        """The text has been quiet for the quiet time: decide what waited for more (optional)."""

    def _on_text(self) -> None:
        """A chunk has been taken in (its complete words handed on); what the intake still
        holds may be guessed at (:meth:`myna.text.TextIntake.guess`; optional)."""

    def _next_deadline(self) -> float | None:
        """When to call :meth:`_on_deadline` next (the turn's clock, s), or None (optional)."""
        return None

    def _on_deadline(self, now: float) -> None:
        """The deadline from :meth:`_next_deadline` has passed (optional)."""

    @abc.abstractmethod
    def _on_end_input(self) -> None:
        """The caller ended the input; finish synthesis, then call :meth:`_finish`."""

    def _on_cancel(self) -> None:
        """The caller cancelled; stop work in progress (optional)."""

    def _emit(self, item: StreamItem) -> None:
        """Publish an item (event-loop thread only; use :meth:`_emit_threadsafe` elsewhere)."""
        if not self._cancelled:
            self._queue.put_nowait(item)

    def _emit_threadsafe(self, item: StreamItem) -> None:
        """Publish an item from an engine thread."""
        self._loop.call_soon_threadsafe(self._emit, item)

    def _fail(self, error: BaseException) -> None:
        """End the stream with an error raised to the iterating caller."""
        self._queue.put_nowait(error)

    def _finish(self) -> None:
        """End the stream (idempotent for consumers: extra ends are ignored)."""
        self._queue.put_nowait(None)


class Engine(abc.ABC):
    """A speech engine shared by all sessions of a worker.

    Attributes:
        name: the engine name clients select (``request_data.engine``).
        sample_rate: native output rate of :class:`AudioChunk` (Hz).
        chunks_end_at_words: every :class:`AudioChunk` ends at a word boundary (an
            utterance-level engine such as Piper). Playout then starts a turn as soon as its
            first audio is there and treats a late chunk as a pause between words (a gap);
            a frame-level engine (DSM), whose chunks may end inside a word, is re-buffered
            instead (:mod:`myna.audio.playout`).
        scripts: the scripts the voice reads.
    """

    name: str
    sample_rate: int
    chunks_end_at_words: bool = False
    #: Scripts the voice reads (Unicode script names); other words get ``unsupported_language``.
    scripts: frozenset[str] = LATIN

    @property
    def voices(self) -> list[str]:
        """Voice names :meth:`stream` accepts (``None`` always selects the default)."""
        return []

    def voice_catalogue(self) -> list[dict]:
        """Each voice :meth:`stream` accepts (``default`` aside): ``name``, ``language`` (None
        when unknown), ``sample_rate`` (Hz) and ``speakers`` (``GET /v1/voices``)."""
        return [{"name": v, "language": None, "sample_rate": self.sample_rate, "speakers": 1}
                for v in self.voices if v != "default"]

    async def start(self) -> None:
        """Load models and warm up; the worker reports ready only after this returns."""

    async def close(self) -> None:
        """Release threads and models."""

    def use_phrase_cache(self, cache) -> bool:
        """Answer synthesis from ``cache`` (a :class:`~myna.engines.phrase_cache.PhraseCache`)
        when it holds the text, and store what is synthesised (None stops); True when this
        engine takes part (by default it does not)."""
        return False

    @property
    def warms_through(self) -> "Engine":
        """The engine whose streams the phrase cache's warm-up speaks through: this one; a
        wrapper that must not count warm-up turns as its own (a fallback's breaker) names the
        engine it wraps."""
        return self

    def breaker_state(self) -> str | None:
        """``closed``, ``open`` or ``half_open`` for an engine behind a circuit breaker
        (:class:`myna.engines.fallback.CircuitBreaker`); None for one without."""
        return None

    def compute_stats(self) -> dict | None:
        """Cumulative synthesis counters for benchmarks (``busy_s``, ``compute_s``, ``audio_s``,
        ``units``: see :meth:`myna.engines.piper.PiperEngine.compute_stats`); None when the
        engine keeps none."""
        return None

    @abc.abstractmethod
    def stream(self, voice: str | None = None, group: object = None) -> SynthesisStream:
        """Open a stream for one turn (must be called on the event loop).

        ``group`` names who the turn belongs to (e.g. its session): engines share their
        compute between groups so that one client's queued turns cannot starve another's. A
        group may offer ``audio_runs_out_at() -> float``: the ``time.monotonic()`` instant its
        queued audio will have played out; engines that schedule by deadline use it to order
        the turn's later jobs (:mod:`myna.engines.scheduler`). It may also offer
        ``synthesis_ahead``: None when someone listens in real time, else a ``() -> bool``
        saying whether the turn's jobs may run ahead of real time now, beyond the synthesis
        horizon (:attr:`myna.session.Session.synthesis_ahead`; a file download).

        Raises:
            EngineError: ``unknown_voice`` when ``voice`` is not available.
        """


class EngineWrapper(Engine):
    """An engine in front of another (a fallback, a strategy, a bridge to another event loop,
    an injected fault): everything the :class:`Engine` interface names is the inner engine's,
    unless the wrapper says otherwise, so no wrapper can drop a property of what it wraps.

    Args:
        inner: the wrapped engine.
    """

    def __init__(self, inner: Engine):
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def sample_rate(self) -> int:
        return self.inner.sample_rate

    @property
    def chunks_end_at_words(self) -> bool:
        return self.inner.chunks_end_at_words

    @property
    def scripts(self) -> frozenset[str]:
        return self.inner.scripts

    @property
    def voices(self) -> list[str]:
        return self.inner.voices

    def voice_catalogue(self) -> list[dict]:
        return self.inner.voice_catalogue()

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def use_phrase_cache(self, cache) -> bool:
        return self.inner.use_phrase_cache(cache)

    def breaker_state(self) -> str | None:
        return self.inner.breaker_state()

    def compute_stats(self) -> dict | None:
        return self.inner.compute_stats()

    def stream(self, voice: str | None = None, group: object = None) -> SynthesisStream:
        return self.inner.stream(voice, group)


class TurnOrder:
    """Each group's turns one after another (a session's turns synthesise in the order they play).

    :meth:`join` gives a new turn the future of its group's previous turn (to wait for) and its
    own (to resolve when it is done, or dropped): the next turn of the group waits for that one.
    """

    def __init__(self) -> None:
        self._tails: dict[object, asyncio.Future] = {}  # each group's last turn

    def join(self, group: object) -> tuple[asyncio.Future | None, asyncio.Future]:
        """``(previous, done)`` for a new turn of ``group``; ``previous`` is None when the
        group has no turn in progress (or ``group`` is None: a turn of its own)."""
        done = asyncio.get_running_loop().create_future()
        if group is None:
            return None, done
        previous = self._tails.get(group)
        self._tails[group] = done
        done.add_done_callback(lambda _: self._tails.get(group) is done and self._tails.pop(group))
        return previous, done

    def __contains__(self, group: object) -> bool:
        """True while ``group`` has a turn in progress."""
        return group in self._tails
