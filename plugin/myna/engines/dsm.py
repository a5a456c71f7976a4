"""The DSM engine: Kyutai's delayed-streams TTS (:mod:`myna.dsm`) served word by word through
the batched frame loop (:class:`myna.dsm.loop.FrameLoop`).

Every turn is a slot of the one loop thread that owns the model: words go to the slot as they
arrive, 80 ms PCM frames (24 kHz, 1920 samples) and word events come back through the event loop
(``call_soon_threadsafe``). The model never runs on the event loop.

Phrase cache (:mod:`myna.engines.phrase_cache`): a DSM turn has no unit boundary (each word's
audio depends on the text around it), so only whole short turns are cached: a turn of at most
:data:`CACHED_TURN_WORDS` words whose text had ended before it took its slot (sent whole, or
queued behind another turn) is looked up by its whole text and, on a miss, stored once it has
finished. A turn still streaming when it takes its slot starts at once and is neither looked up
nor stored. A seeded engine (``seed``: tests and reproducible runs that measure the model)
bypasses the cache unless ``cache_seeded``; then the seed is part of the key, so a hit is the
audio that seed gives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from pathlib import Path

import numpy as np

from myna.engines.base import AudioChunk, Engine, EngineError, SynthesisStream, TurnOrder, WordEvent, spoken_word
from myna.text import said

log = logging.getLogger(__name__)

#: The longest turn (words) the phrase cache keeps: an opening, not a reply.
CACHED_TURN_WORDS = 12


class DSMEngine(Engine):
    """A DSM TTS checkpoint served by one frame loop.

    Args:
        checkpoint: a checkpoint folder or Hugging Face repo id (:func:`myna.dsm.load`).
        voice: the default voice file (``.safetensors`` with ``speaker_wavs``); needed by the
            1.6b layout, ignored by checkpoints without voice conditioning.
        n_q: codebooks generated and decoded (clamped to the model's; Kyutai's servers use 24).
        guidance: the CFG-distilled condition value (e.g. "2.0"); None keeps the model default.
        device: "cuda" when available, else "cpu" by default.
        max_batch: concurrent turns stepping together; more wait for a slot.
        max_ahead_s: backpressure: a turn more than this ahead of real time pauses.
        seed: fixed per-turn seed (tests, reproducible runs); None draws one per turn.
        threads: torch intra-op threads of the frame loop's thread on the CPU (default: all cores
            but one, for the pacer).
        cache_seeded: with ``seed``, use the phrase cache all the same (see the module docstring).
    """

    name = "dsm"
    sample_rate = 24000

    def __init__(self, checkpoint: str | Path, *, voice: str | Path | None = None, n_q: int = 32,
                 guidance: str | float | None = None, device: str | None = None, max_batch: int = 16,
                 max_ahead_s: float = 3.0, seed: int | None = None, threads: int | None = None,
                 name: str = "dsm", cache_seeded: bool = False):
        self.name = name
        self.checkpoint = checkpoint
        self.voice_path = Path(voice) if voice else None
        self.n_q = n_q
        self.guidance = None if guidance is None else _guidance_value(guidance)
        self.device = device
        self.max_batch = max_batch
        self.max_ahead_s = max_ahead_s
        self.seed = seed
        self.threads = threads
        self.cache_seeded = cache_seeded
        self.phrase_cache = None  # a PhraseCache once the worker attaches one (use_phrase_cache)
        self.tts = None
        self.loop = None
        self.order = TurnOrder()  # a group's turns take their slot one after another
        self._starting: asyncio.Future | None = None

    @property
    def voices(self) -> list[str]:
        names = ["default"]
        if self.voice_path is not None:
            names.insert(0, self.voice_path.stem)
        return names

    async def start(self) -> None:
        """Load the checkpoint and warm the loop up (graph capture on CUDA) on a thread of its own,
        which ends once the loop is running: a thread that has run a parallel op on the CPU keeps
        an OpenMP team until it ends, and another team beside the loop's slows every small op of
        the loop's step (see :meth:`myna.dsm.loop.FrameLoop.start`), so not the event loop's
        default executor, whose threads stay."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(_on_own_thread(self._load))
        await asyncio.shield(self._starting)

    def _load(self) -> None:
        import torch

        from myna.dsm import load
        from myna.dsm.loop import FrameLoop

        device = self.device or ("cuda" if torch.cuda.is_available() else "cpu")
        threads = (self.threads or max(1, (os.cpu_count() or 2) - 1)) if device == "cpu" else None
        tts = load(self.checkpoint, device, progress=False)
        tts.n_q = max(1, min(self.n_q, tts.cfg.n_q))
        if self.guidance is not None:
            tts.cfg_value = self.guidance
        if tts.needs_voice and self.voice_path is None:
            raise EngineError("no_voice", "this DSM checkpoint needs a voice: pass --voice PATH")
        self.sample_rate = tts.sample_rate
        loop = FrameLoop(tts, max_batch=self.max_batch, max_ahead_s=self.max_ahead_s, threads=threads)
        loop.start()
        # one short turn end to end, so the first real turn pays for nothing
        errors: list[BaseException | None] = []
        session = loop.open(voice=self.voice_path, seed=0, on_end=errors.append)
        session.push_words(["Ready."])
        session.end_input()
        session.done.wait(timeout=600)
        if errors and errors[0] is not None:
            loop.close()
            raise EngineError("engine_failed", f"dsm warm-up failed: {errors[0]}") from errors[0]
        self.tts, self.loop = tts, loop
        log.info("dsm engine ready: %s on %s, n_q=%d, %d slots", self.checkpoint, device, tts.n_q, self.max_batch)

    def use_phrase_cache(self, cache) -> bool:
        """Answer whole short turns from ``cache`` (a
        :class:`~myna.engines.phrase_cache.PhraseCache`) and store them; a seeded engine only
        with ``cache_seeded``. None stops."""
        self.phrase_cache = cache
        return True

    def _cache(self):
        """The phrase cache and this engine's key in it, or ``(None, "")`` when bypassed."""
        if self.phrase_cache is None or (self.seed is not None and not self.cache_seeded):
            return None, ""
        return self.phrase_cache, self.name if self.seed is None else f"{self.name}#seed={self.seed}"

    async def close(self) -> None:
        if self.loop is not None:
            loop, self.loop = self.loop, None
            await asyncio.to_thread(loop.close)

    def stream(self, voice: str | None = None, group: object = None) -> "DSMStream":
        if voice not in (None, *self.voices):
            raise EngineError("unknown_voice", f"dsm has no voice {voice!r}; available: {', '.join(self.voices)}")
        if self.loop is None:
            raise EngineError("engine_not_ready", "dsm is still loading")
        return DSMStream(self, group)


async def _on_own_thread(fn):
    """``fn()`` on a new thread that ends with it (see :meth:`DSMEngine.start`); the event loop
    never waits for that thread, even when the caller is cancelled."""
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dsm-load")
    try:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)
    finally:
        pool.shutdown(wait=False)


def _guidance_value(value: str | float) -> str:
    """The LUT key of a guidance value: 2 → "2.0"."""
    return f"{float(value):.1f}"


class DSMStream(SynthesisStream):
    """One turn: a slot of the engine's frame loop.

    A group (a session) holds at most one slot: a turn queued behind another turn of the same
    group takes its slot only once that turn has finished, so one client's queued turns cannot
    fill the loop. A turn with no words never takes a slot (no audio, like the other engines),
    nor does a whole short turn the phrase cache holds (see the module docstring).

    A word the text front end marked with its spoken form (``555-0199``, ``<sub>``: see
    :mod:`myna.text.normaliser`) reaches the model as its spoken words; its ``word`` event
    carries the written word, at the start of the first of them.
    """

    reads_marked_words = True  # (it splits them itself, to keep the written word for captions)

    def __init__(self, engine: DSMEngine, group: object = None):
        super().__init__()
        self.engine = engine
        self._session = None
        self._words: list[str] = []  # words pushed before the slot opened
        self._captions: list[str | None] = []  # per model word, in order: its word event (None: none)
        self._heard = 0  # model words whose event has come back
        self._ended = False
        self._recorded: tuple[list, list] | None = None  # (pcm pieces, word starts ms) to cache
        previous, self._done = engine.order.join(group)  # done: this turn has released its slot
        self._opener = self._loop.create_task(self._open_after(previous))

    async def _open_after(self, previous: asyncio.Future | None) -> None:
        if previous is not None:
            await asyncio.shield(previous)
        if self.cancelled:
            return
        if self._ended and not self._words:
            self._release()
            self._finish()
            return
        if self._ended and len(self._words) <= CACHED_TURN_WORDS and self._from_cache():
            return
        self._session = self.engine.loop.open(voice=self.engine.voice_path, seed=self.engine.seed,
                                              on_audio=self._audio, on_word=self._word, on_end=self._end)
        if self._words:
            self._session.push_words(self._words)
        if self._ended:
            self._session.end_input()

    def _from_cache(self) -> bool:
        """Speak the whole turn from the phrase cache if it holds it (True), else record the
        turn's audio to store it once it has finished."""
        cache, key = self.engine._cache() if self.phrase_cache_on else (None, "")
        if cache is None:
            return False
        hit = cache.get(key, self._voice_key(), " ".join(self._words))
        if hit is None:
            self._recorded = ([], [])
            return False
        pcm, starts = hit
        for caption, start in zip(self._captions, starts):
            if caption is not None:
                self._emit(WordEvent(caption, start))
        self._emit(AudioChunk(pcm, self.engine.sample_rate))
        self._release()
        self._finish()
        return True

    def _store(self) -> None:
        cache, key = self.engine._cache()
        pieces, starts = self._recorded
        if cache is not None and not self.cancelled and pieces and len(starts) == len(self._captions):
            cache.put(key, self._voice_key(), " ".join(self._words), np.concatenate(pieces), starts)

    def _voice_key(self) -> str:
        return str(self.engine.voice_path or "default")

    def _release(self) -> None:
        if not self._done.done():
            self._done.set_result(None)

    def _on_words(self, words: list[str]) -> None:
        spoken: list[str] = []
        for word in words:
            pieces = self._spoken_words(word)
            caption: str | None = spoken_word(word)
            for piece in pieces:
                # the model's words for this piece (its script splitter cuts at ":" and spaces)
                for _ in range(max(1, len(piece.replace(":", " ").replace("(", "").replace(")", "").split()))):
                    self._captions.append(caption)
                    caption = None
            spoken += pieces
        words = spoken
        if self._session is not None:
            self._session.push_words(words)
        else:
            self._words.extend(words)

    def _on_end_input(self) -> None:
        self._ended = True
        if self._session is not None:
            self._session.end_input()

    def _on_cancel(self) -> None:
        self._opener.cancel()
        if self._session is not None:
            self._session.cancel()
        self._release()

    # loop thread → event loop
    def _audio(self, pcm: np.ndarray) -> None:
        if self._recorded is not None:
            self._recorded[0].append(np.array(pcm, np.float32))
        self._emit_threadsafe(AudioChunk(pcm, self.engine.sample_rate))

    def _word(self, word: str, start_s: float) -> None:
        if self._recorded is not None:
            self._recorded[1].append(1000.0 * start_s)
        index, self._heard = self._heard, self._heard + 1
        caption = self._captions[index] if index < len(self._captions) else spoken_word(word)
        if caption is not None:
            self._emit_threadsafe(WordEvent(caption, 1000.0 * start_s))

    def _end(self, error: BaseException | None) -> None:
        self._loop.call_soon_threadsafe(self._release)
        if error is None and self._recorded is not None:
            self._loop.call_soon_threadsafe(self._store)
        if error is None:
            self._loop.call_soon_threadsafe(self._finish)
        else:
            err = error if isinstance(error, EngineError) else EngineError("engine_failed", f"dsm synthesis failed: {error}")
            self._loop.call_soon_threadsafe(self._fail, err)


__all__ = ["DSMEngine", "DSMStream"]
