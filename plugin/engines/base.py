"""The engine interface: one streaming synthesis stream per turn.

An :class:`Engine` is loaded once per process and shared by all sessions. Each turn opens a
:class:`SynthesisStream` with :meth:`Engine.stream`; the caller pushes text chunks as the LLM
writes them (a chunk may split a word anywhere), calls :meth:`SynthesisStream.end_input` at
the end of the turn, and iterates the stream for :class:`AudioChunk` and :class:`WordEvent`
items until it ends. :meth:`SynthesisStream.cancel` drops the turn at once (barge-in).

Streams never run model code on the event loop: engines synthesise on their own threads and
hand results back through asyncio queues.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np

from myna.text import WordSegmenter


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


StreamItem = AudioChunk | WordEvent


def spoken_word(word: str) -> str:
    """A word as :class:`WordEvent` carries it (captions): surrounding punctuation removed.

    >>> spoken_word('"Hello,"')
    'Hello'
    """
    return word.strip(".,;:!?\"'()[]{}…-—") or word


class EngineError(Exception):
    """A synthesis failure that ends one turn; carries a contract error ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class SynthesisStream(abc.ABC):
    """One turn of streaming synthesis.

    Subclasses implement :meth:`_on_words`, :meth:`_on_end_input` and :meth:`_on_cancel`;
    they publish results with :meth:`_emit` and finish with :meth:`_finish`. The base class
    owns word segmentation (:class:`myna.text.WordSegmenter`), so a word split across chunks
    reaches the engine whole.
    """

    def __init__(self) -> None:
        self._segmenter = WordSegmenter()
        self._queue: asyncio.Queue[StreamItem | BaseException | None] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._input_ended = False
        self._cancelled = False

    # -- caller side -------------------------------------------------------------------
    def push_text(self, chunk: str) -> None:
        """Add a chunk of the turn's text (any split, any size).

        Raises:
            RuntimeError: after :meth:`end_input` or :meth:`cancel`.
        """
        if self._input_ended or self._cancelled:
            raise RuntimeError("push_text after end_input/cancel")
        words = self._segmenter.push(chunk)
        if words:
            self._on_words(words)

    def end_input(self) -> None:
        """No more text for this turn: synthesise what is buffered, then end the stream."""
        if self._input_ended or self._cancelled:
            return
        self._input_ended = True
        words = self._segmenter.flush()
        if words:
            self._on_words(words)
        self._on_end_input()

    def cancel(self) -> None:
        """Drop the turn now: pending synthesis is abandoned and the stream ends."""
        if self._cancelled:
            return
        self._cancelled = True
        self._on_cancel()
        self._finish()

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

    # -- engine side -------------------------------------------------------------------
    @abc.abstractmethod
    def _on_words(self, words: list[str]) -> None:
        """Whole, normalised words are available (called on the event loop)."""

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
    """

    name: str
    sample_rate: int
    chunks_end_at_words: bool = False

    @property
    def voices(self) -> list[str]:
        """Voice names :meth:`stream` accepts (``None`` always selects the default)."""
        return []

    async def start(self) -> None:
        """Load models and warm up; the worker reports ready only after this returns."""

    async def close(self) -> None:
        """Release threads and models."""

    @abc.abstractmethod
    def stream(self, voice: str | None = None, group: object = None) -> SynthesisStream:
        """Open a stream for one turn (must be called on the event loop).

        ``group`` names who the turn belongs to (e.g. its session): engines share their
        compute between groups so that one client's queued turns cannot starve another's. A
        group may offer ``audio_runs_out_at() -> float``: the ``time.monotonic()`` instant its
        queued audio will have played out; engines that schedule by deadline use it to order
        the turn's later jobs (:mod:`myna.engines.scheduler`).

        Raises:
            EngineError: ``unknown_voice`` when ``voice`` is not available.
        """
