"""The phrase cache: synthesised units kept in memory, so a common opening is spoken with no synthesis.

An utterance-level engine (Piper) synthesises a turn unit by unit (:mod:`myna.engines.piper`).
Agents open most replies with the same few phrases ("Sure.", "Okay, let me check that for
you."), so the engine keeps what one job of text produced, its PCM and word starts, in a
:class:`PhraseCache` keyed by ``(engine, voice, phrase_key(text))``. A job whose text is there
is answered from memory: a turn whose first unit is cached has its first audio at the next
20 ms frame. The cache holds what synthesis returned, before the stream trims lead-in and
joins, so a cached unit goes through exactly the same steps as a synthesised one.

**Which texts are the same** (:func:`phrase_key`). Two texts share an entry only where the voice
reads them alike; checked against Piper's phonemiser (espeak-ng), which is what the voice reads:

- whitespace runs are one space, and the ends are stripped;
- case is kept: espeak's dictionary reads some words by their capital (``"Polish"`` is the
  language, ``"polish"`` the verb; ``"US"`` is "U S"; ``"I am."`` is stressed otherwise than
  ``"i am."``), and the DSM engine's tokenizer tells every case apart;
- after the text's last letter or digit, closing quotes and brackets are not read and a run of
  marks is read as its first one (``"Sure!!"`` = ``"Sure!"``, ``"Sure?!"`` = ``"Sure?"``,
  ``"Sure.)"`` = ``"Sure."``), with ``"..."`` read as ``"…"``; symbols the voice reads are kept
  (``"50%"`` is "fifty percent", ``"50"`` is not; ``"C++"``, ``"20°"``, ``"#"`` likewise).

Everything else is kept: ``"Sure."``, ``"Sure?"``, ``"Sure!"`` and ``"Sure"`` are said
differently (the final mark sets the intonation) and are four entries.

**Memory.** The cache is an LRU bounded in bytes (the PCM, the word starts and the key text of
every entry); storing past the bound evicts the least recently used entries; an entry larger
than the whole bound is not stored.

**Warm-up** (:func:`warm_up`): a list of common openings (:data:`DEFAULT_PHRASES_FILE`, one per
line) is spoken through each engine's own streams at start-up, before the worker reports ready,
so the units stored are exactly the units a turn with that text produces (same chunker, same
verbaliser, same job split). Each phrase is spoken twice: streamed word by word as an LLM
writes it, and sent whole, since the two can be cut differently (streamed, the first phrase
goes out after three words: "I can help" + "you with that today."; sent whole, a clause is one
unit). A turn whose text arrives slowly enough to be cut elsewhere (the first phrase's wait,
:data:`myna.engines.piper.FIRST_PHRASE_WAIT_S`) gets other units, and misses.

Engines that take part say so from ``use_phrase_cache(cache)``: Piper caches each job (a unit or a
piece of one); the DSM engine, which has no unit boundary, caches whole short turns whose text
was complete before they started, and a seeded DSM engine bypasses the cache unless asked
(:mod:`myna.engines.dsm`).

All methods run on the event loop.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: The warm-up list shipped with the package: common agent openings, one per line.
DEFAULT_PHRASES_FILE = files("myna.engines") / "phrases_en.txt"
#: ``--phrase-cache-mb`` default.
DEFAULT_MB = 64.0

_TAIL = re.compile(r"[^\w\s]+$")  # the marks after the text's last letter or digit
_MARKS = ".!?…,;:—"  # marks the voice reads as a pause or intonation, the first of a run
_CLOSERS = "\"'”’»)]}"  # closing quotes and brackets: not read


def phrase_key(text: str) -> str:
    """The text as the cache compares it: what the voice reads, without what it does not (see
    the module docstring).

    >>> phrase_key("  Thanks for  calling!! ")
    'Thanks for calling!'
    >>> phrase_key("Sure!?)") == phrase_key("Sure!") != phrase_key("Sure?")
    True
    """
    words = text.split()
    if not words:
        return ""
    last = words[-1]
    tail = _TAIL.search(last)
    if tail is not None:
        marks = tail.group().replace("...", "…")
        first = next((c for c in marks if c in _MARKS), "")
        # Symbols the voice reads ("50%", "C++", "20°", "#") stay; only closers and repeats go.
        said = "".join(c for c in marks if c not in _MARKS and c not in _CLOSERS)
        words[-1] = last[: tail.start()] + said + first
    return " ".join(words)



@dataclass(frozen=True)
class _Entry:
    pcm: np.ndarray  # float32 [n], read-only
    starts_ms: tuple[float, ...]
    nbytes: int


class PhraseCache:
    """Synthesised units by ``(engine, voice, text)``, least recently used evicted first.

    Args:
        max_bytes: the bound on what entries hold (PCM, word starts, key text), bytes; > 0.

    Attributes:
        hits, misses: lookups answered from memory, and not (since start-up or
            :meth:`reset_counts`).
        evictions: entries dropped to stay within the bound.
    """

    def __init__(self, max_bytes: int):
        if max_bytes <= 0:
            raise ValueError("a phrase cache needs a positive size in bytes")
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[tuple[str, str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self.hits = self.misses = self.evictions = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now (≤ :attr:`max_bytes`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, engine: str, voice: str, text: str) -> tuple[np.ndarray, list[float]] | None:
        """The unit's ``(pcm, word_starts_ms)`` as the engine made it (a fresh copy of the
        float32 PCM ``[n]``), or None; counts a hit or a miss and marks the entry recently used."""
        key = (engine, voice, phrase_key(text))
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return entry.pcm.copy(), list(entry.starts_ms)

    def put(self, engine: str, voice: str, text: str, pcm: np.ndarray, starts_ms: list[float]) -> None:
        """Store a unit: float32 mono PCM ``[n]`` and its word starts (ms), evicting the least
        recently used entries past the bound. An entry larger than the bound is not stored."""
        key = (engine, voice, phrase_key(text))
        if not key[2]:
            return
        stored = np.array(pcm, dtype=np.float32)  # our own copy: the caller's array may change
        stored.flags.writeable = False
        entry = _Entry(stored, tuple(float(s) for s in starts_ms),
                       stored.nbytes + 8 * len(starts_ms) + len(key[2].encode()))
        if entry.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[key] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.nbytes
            self.evictions += 1

    def reset_counts(self) -> None:
        """Zero :attr:`hits` and :attr:`misses` (after warm-up, whose lookups are no traffic)."""
        self.hits = self.misses = 0

    def stats(self) -> dict:
        """``hits``, ``misses``, ``evictions``, ``entries`` and ``bytes`` now."""
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "entries": len(self._entries), "bytes": self._bytes}


def read_phrases(path: str | Path | None = None) -> list[str]:
    """The warm-up phrases of a file, one per line (blank lines and ``#`` comments skipped);
    None: :data:`DEFAULT_PHRASES_FILE`.

    Raises:
        OSError: the file cannot be read. UnicodeDecodeError: it is not UTF-8.
    """
    text = DEFAULT_PHRASES_FILE.read_text("utf-8") if path is None else Path(path).read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


async def warm_up(engines, cache: PhraseCache, phrases: list[str]) -> int:
    """Attach ``cache`` to every engine that takes part and speak each phrase through it (through
    what it wraps, where it says so: :attr:`~myna.engines.base.Engine.warms_through`).

    Each phrase is two turns of the engine's own stream: its words pushed one by one (with their
    leading space, as LLM tokens come), then the text whole; so what is stored is what such
    turns look up. Engines sharing a voice (the Piper strategies) share entries; a unit already
    stored is not synthesised again. Progress goes to the log.

    Args:
        engines: the worker's engines (an iterable of :class:`~myna.engines.base.Engine`).

    Returns:
        the number of engines that use the cache.

    Raises:
        EngineError: an engine failed to synthesise a phrase.
    """
    engines = list(engines)
    users = [e for e in engines if e.use_phrase_cache(cache)]
    for engine in engines:
        if engine not in users:
            log.info("phrase cache: %s does not use it", engine.name)
    t0 = time.monotonic()
    for engine in users:
        for i, phrase in enumerate(phrases, start=1):
            for chunks in (re.findall(r"\s*\S+", phrase), [phrase]):
                stream = engine.warms_through.stream()
                for chunk in chunks:
                    stream.push_text(chunk)
                stream.end_input()
                async for _ in stream:  # the stream stores its units as it synthesises them
                    pass
            if i % 10 == 0 or i == len(phrases):
                log.info("phrase cache: warming %s: %d/%d phrases, %d units, %.1f MB", engine.name, i,
                         len(phrases), len(cache), cache.nbytes / 1e6)
    if users and phrases:
        log.info("phrase cache: warmed %d phrases in %.1f s: %d units, %.1f MB of %.0f MB", len(phrases),
                 time.monotonic() - t0, len(cache), cache.nbytes / 1e6, cache.max_bytes / 1e6)
    cache.reset_counts()
    return len(users)
