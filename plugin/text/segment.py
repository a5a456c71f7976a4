"""Incremental segmentation: token chunks → whole normalised words → clauses to synthesise.

``WordSegmenter`` turns LLM token chunks (which split words anywhere) into whole words;
``ClauseChunker`` groups words into the text units an utterance-level engine synthesises.
"""

from __future__ import annotations

from myna.text.normalise import append_word, ends_clause, has_speech

#: Longest word passed on (characters); a longer run without whitespace is cut into pieces this
#: long, so one giant "word" cannot hold up an engine (and, through it, other sessions).
MAX_WORD_CHARS = 40
#: Longest raw run without whitespace kept while waiting for its end (characters); enough for
#: a markdown link with a long URL, which normalises down to its text.
MAX_RAW_CHARS = 512

# Abbreviations whose "." almost never ends a sentence; a clause does not end on them.
_ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "jr.", "sr.", "vs.", "e.g.", "i.e."})


class WordSegmenter:
    """Cut a stream of text chunks into whole, normalised words.

    A word is complete when whitespace follows it; the partial word at the end of a chunk
    waits for the next chunk, so ``"ref"`` + ``"erence "`` gives ``["reference"]`` and an
    emoji sequence split across chunks is never seen in halves. Words are normalised with
    :func:`myna.text.normalise.normalise_word`: never empty, never containing whitespace,
    always speakable (:func:`has_speech`). A word that is only punctuation (``"..."``,
    ``"—"``) joins the word before it (``"wait ..."`` → ``"wait..."``) so clause boundaries
    survive, or is dropped when there is none.

    For that, a completed word that does not end a clause is held back until the next word
    shows a letter or digit (or :meth:`flush`). With token chunks that carry their leading
    space (``"Hello"``, ``" world"``) this costs nothing: the chunk that completes a word also
    starts the next one. A word ending a clause (``"Hi,"``) is never held.

    The words of a turn do not depend on how its text was chunked:
    ``" ".join(push(a) + push(b) + flush()) == normalise(a + b)`` for any split.

    >>> seg = WordSegmenter()
    >>> seg.push("**Hel"), seg.push("lo**, wor"), seg.push("ld 👋 and"), seg.flush()
    ([], ['Hello,'], ['world'], ['and'])
    """

    def __init__(self) -> None:
        self._partial = ""  # raw text of the word still being received
        self._words: list[str] = []  # completed words not yet returned (at most one, held)
        self._open = False  # whether self._words[-1] may still take trailing punctuation

    def push(self, chunk: str) -> list[str]:
        """Add a chunk of text; return the words it completed (possibly none)."""
        text = self._partial + chunk
        raws = text.split()
        self._partial = raws.pop() if raws and not text[-1].isspace() else ""
        while len(self._partial) > MAX_RAW_CHARS:  # no whitespace for too long: cut it
            raws.append(self._partial[:MAX_RAW_CHARS])
            self._partial = self._partial[MAX_RAW_CHARS:]
        for raw in raws:
            self._open = append_word(self._words, raw, self._open)
        if has_speech(self._partial):
            self._open = False  # the next word has speech: nothing can attach any more
        return self._take()

    def flush(self) -> list[str]:
        """End of turn: return the remaining words (the partial one included) and reset."""
        if self._partial:
            append_word(self._words, self._partial, self._open)
        self._partial, self._open = "", False
        return self._take()

    def _take(self) -> list[str]:
        ready = len(self._words) - (1 if self._open else 0)
        out, self._words = self._words[:ready], self._words[ready:]
        return [w[i : i + MAX_WORD_CHARS] for w in out for i in range(0, len(w), MAX_WORD_CHARS)]


class ClauseChunker:
    """Group words into text units ready to synthesise, one clause at a time.

    A unit ends at a word ending with clause or sentence punctuation (``, ; : . ! ? … —``,
    possibly followed by closing quotes or brackets; a few abbreviations such as ``Dr.``
    excepted), or when ``max_words`` words have come without one (a split at a word
    boundary; every word is kept). Units are the words joined by single spaces; a unit with
    nothing speakable in it is never returned.

    Latency: the first unit is what the listener waits for, so by default a short first
    clause goes out alone as soon as its punctuation arrives (``"Hi,"`` is a unit by itself);
    it is never held to be merged with the next clause. ``first_min_words`` lets an engine
    trade that latency for prosody: the first unit then ends at the first clause boundary
    reached with at least that many words (or at ``max_words``).

    Args:
        max_words: the most words in one unit.
        max_chars: a unit also ends once it holds this many characters (at a word boundary).
        first_min_words: the fewest words the first unit of a turn ends on at a clause
            boundary (1: any clause).

    >>> chunker = ClauseChunker()
    >>> [unit for w in "Hi, I can help. Sure".split() for unit in chunker.push(w)]
    ['Hi,', 'I can help.']
    >>> chunker.flush()
    ['Sure']
    """

    def __init__(self, max_words: int = 24, first_min_words: int = 1, max_chars: int = 240) -> None:
        if max_words < 1 or first_min_words < 1 or max_chars < 1:
            raise ValueError("max_words, first_min_words and max_chars must be at least 1")
        self.max_words = max_words
        self.max_chars = max_chars
        self._chars = 0
        self.first_min_words = first_min_words
        self._words: list[str] = []
        self._first = True  # no unit of this turn has been returned yet

    def push(self, word: str) -> list[str]:
        """Add one word (whitespace inside splits it); return the units it completed."""
        units: list[str] = []
        for w in word.split():
            self._words.append(w)
            self._chars += len(w) + 1
            min_words = self.first_min_words if self._first else 1
            at_clause = ends_clause(w) and w.lower() not in _ABBREVIATIONS
            full = len(self._words) >= self.max_words or self._chars >= self.max_chars
            if (at_clause and len(self._words) >= min_words) or full:
                units += self._cut()
        return units

    def flush(self) -> list[str]:
        """End of turn: return what remains as a unit (even without final punctuation), reset."""
        units = self._cut()
        self._first = True
        return units

    def _cut(self) -> list[str]:
        unit, self._words, self._chars = " ".join(self._words), [], 0
        if not has_speech(unit):
            return []
        self._first = False
        return [unit]
