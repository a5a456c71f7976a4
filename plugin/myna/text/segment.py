"""Incremental segmentation: token chunks → whole normalised words → units to synthesise.

``WordSegmenter`` turns LLM token chunks (which split words anywhere) into whole words. The
chunkers group words into the text units an utterance-level engine (Piper) synthesises:
``ClauseChunker`` by clause, ``SentenceChunker`` by sentence, ``WholeChunker`` the whole reply.
Sentence ends come from :mod:`myna.text.sentences` (pysbd), so ``"10 a.m. tomorrow"``,
``"Mr. Smith"`` or ``"No. 5"`` stay in one unit.

Chunkers take time as an argument (``now``, seconds on any monotonic clock) and never read a
clock: the stream that owns one calls :meth:`ClauseChunker.poll` at :attr:`ClauseChunker.deadline`
and :meth:`ClauseChunker.settle` once its text has gone quiet.
"""

from __future__ import annotations

import copy

from myna.text import said
from myna.text.markup import Pause
from myna.text.symbols import append_word, ends_clause, has_speech
from myna.text.sentences import CLOSERS, End, end_of, is_boundary

#: Longest word passed on (characters); a longer run without whitespace is cut into pieces this
#: long, so one giant "word" cannot hold up an engine (and, through it, other sessions).
MAX_WORD_CHARS = 40
#: Longest raw run without whitespace kept while waiting for its end (characters); enough for
#: a markdown link with a long URL, which normalises down to its text.
MAX_RAW_CHARS = 512


class WordSegmenter:
    """Cut a stream of text chunks into whole, normalised words.

    A word is complete when whitespace follows it; the partial word at the end of a chunk
    waits for the next chunk, so ``"ref"`` + ``"erence "`` gives ``["reference"]`` and an
    emoji sequence split across chunks is never seen in halves. Words are normalised with
    :func:`myna.text.symbols.normalise_word`: never empty, never containing whitespace,
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

    @property
    def partial(self) -> str:
        """The raw text of the word still being received (``""`` after whitespace)."""
        return self._partial

    @property
    def holding(self) -> bool:
        """True while :meth:`flush` would return something (a partial or a held word)."""
        return bool(self._partial or self._words)

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


#: Words that lean on the word after them (articles, determiners, possessives, prepositions,
#: conjunctions): an early first phrase ends before one, not after it.
LEANING_WORDS = frozenset(
    "a an the this that these those my your his her its our their to of in on at for with from by about "
    "into onto over under after before and or but so if as than".split()
)


class _Chunker:
    """Words in, units out: what the chunkers share.

    A unit ends where :meth:`_ends_unit` says, or once it holds ``max_words`` words or
    ``max_chars`` characters (at a word boundary; every word is kept). A word that may end a
    sentence (``"a.m."``, :data:`End.MAYBE`) is decided by the next word (pysbd), or ends its
    unit at :meth:`settle`. Units are the words joined by single spaces; a unit with nothing
    speakable in it is never returned.
    """

    def __init__(self, max_words: int, max_chars: int) -> None:
        if max_words < 1 or max_chars < 1:
            raise ValueError("max_words and max_chars must be at least 1")
        self.max_words = max_words
        self.max_chars = max_chars
        self._words: list[str] = []
        self._texts: list[str] = []  # the words as written (:func:`myna.text.said.text_of`): boundaries
        self._chars = 0
        self._maybe = False  # the last word may end a sentence: the next word decides

    def push(self, word: str, now: float = 0.0) -> list[str]:
        """Add one word (whitespace inside splits it) that arrived at ``now`` (s); return the
        units it completed."""
        units: list[str] = []
        for w in word.split():
            text = said.text_of(w)
            if self._maybe:
                self._maybe = False
                if is_boundary(self._texts[-1], text, self._texts[:-1]) and self._may_cut():
                    units += self._cut()
            self._words.append(w)
            self._texts.append(text)
            self._chars += len(w) + 1
            units += self._after(text, now)
        return units

    def poll(self, now: float) -> list[str]:
        """Time has passed: return a unit whose wait ran out by ``now`` (s)."""
        return []

    @property
    def deadline(self) -> float | None:
        """When :meth:`poll` may next return a unit (s, the clock of ``now``), or None."""
        return None

    def settle(self) -> list[str]:
        """The text went quiet: a word that may end a sentence ends its unit."""
        return self._cut() if self._maybe else []

    def pause(self, ms: float = 0.0) -> list[str | Pause]:
        """The text says a unit ends here (a line break; ``ms`` > 0: a ``<break>``): return
        the unit, then the :class:`~myna.text.markup.Pause` to keep after it."""
        return [*self._cut(), *([Pause(ms)] if ms > 0 else [])]

    def flush(self) -> list[str]:
        """End of turn: return what remains as a unit (even without final punctuation), reset."""
        units = self._cut()
        self._new_turn()
        return units

    def _after(self, word: str, now: float) -> list[str]:
        """``word`` (as written) was just added."""
        end = self._ends_unit(word)
        self._maybe = end is End.MAYBE
        full = len(self._words) >= self.max_words or self._chars >= self.max_chars
        if full or (end is End.END and self._may_cut()):
            return self._cut()
        return []

    def _ends_unit(self, word: str) -> End:
        """Whether ``word`` (just added) ends the unit."""
        return End.NOT_END

    def _may_cut(self) -> bool:
        return True

    def _new_turn(self) -> None:
        pass

    def _cut(self, n: int | None = None) -> list[str]:
        """Return the first ``n`` words (all by default) as a unit; keep the rest."""
        n = len(self._words) if n is None else n
        unit, self._words, self._texts = " ".join(self._words[:n]), self._words[n:], self._texts[n:]
        self._chars, self._maybe = sum(len(w) + 1 for w in self._words), False
        return [unit] if has_speech(unit) else []


class ClauseChunker(_Chunker):
    """Group words into units ready to synthesise, one clause at a time.

    A unit ends at a word ending with clause punctuation (``, ; :``, ``—``), at a sentence end
    (``. ! ? …``, possibly followed by closing quotes or brackets; pysbd decides whether a full
    stop ends a sentence, so ``"Dr."``, ``"a.m. tomorrow"`` and ``"No. 5"`` do not), or when
    ``max_words`` words have come without one.

    The first unit is what the listener waits for, so a short first clause goes out alone as
    soon as its punctuation arrives (``"Hi,"``). Two options shape it further:

    - ``first_words`` / ``first_wait_s``, the first phrase early: while text streams in, the
      first unit also ends once ``first_words`` words are complete, or ``first_wait_s`` after
      its first word, whichever comes first (see :meth:`poll`; never inside a word, and not
      right after a word that may end a sentence, which the next word decides). It ends
      before the last word that leans on the next (``"the"``, ``"to"``), if two words or more
      come before it. Later units are clause-sized.
    - ``first_min_words``: the first unit ends at a clause boundary only once it holds that
      many words (trading first-audio latency for prosody).

    Args:
        max_words: the most words in one unit (a clause without punctuation longer than this is
            cut: the bound on one latent job; Piper decodes a unit in chunks, so its length costs
            no wait, and no clause of ordinary text reaches it).
        first_min_words: the fewest words the first unit ends on at a clause boundary.
        max_chars: a unit also ends once it holds this many characters (at a word boundary).
        first_words: the first unit ends after this many words (None: no limit).
        first_wait_s: the first unit ends this long after its first word (None: no limit).

    >>> chunker = ClauseChunker()
    >>> [unit for w in "Hi, I can help. Sure".split() for unit in chunker.push(w)]
    ['Hi,', 'I can help.']
    >>> chunker.flush()
    ['Sure']
    >>> early = ClauseChunker(first_words=4, first_wait_s=0.25)
    >>> early.push("Well", now=0.0), early.deadline, early.poll(0.2), early.poll(0.25)
    ([], 0.25, [], ['Well'])
    >>> early.flush(), [early.push(w, now=1.0) for w in "I think the".split()], early.poll(1.0)
    ([], [[], [], []], [])
    >>> early.push("answer", now=1.1), early.poll(1.1)  # four words: cut between phrases
    ([], ['I think'])
    >>> early.flush()
    ['the answer']
    """

    def __init__(self, max_words: int = 60, first_min_words: int = 1, max_chars: int = 480,
                 first_words: int | None = None, first_wait_s: float | None = None) -> None:
        super().__init__(max_words, max_chars)
        if first_min_words < 1 or (first_words is not None and first_words < 1):
            raise ValueError("first_min_words and first_words must be at least 1")
        self.first_min_words = first_min_words
        self.first_words = first_words
        self.first_wait_s = first_wait_s
        self._first = True  # no unit of this turn has been returned yet
        self._first_at = 0.0  # when the first unit's first word came

    def _after(self, word: str, now: float) -> list[str]:
        if self._first and len(self._words) == 1:
            self._first_at = now
        return super()._after(word, now)

    def poll(self, now: float) -> list[str]:
        """Call after each batch of words and at :attr:`deadline`: returns the first phrase
        once ``first_words`` words are in (and no more are at hand: a clause that arrives
        whole is one unit) or ``first_wait_s`` has passed since its first word."""
        due = self.deadline
        return self._cut(self._phrase_end()) if due is not None and now >= due else []

    @property
    def deadline(self) -> float | None:
        if not self._first or not self._words or self._maybe:
            return None
        if self.first_words is not None and len(self._words) >= self.first_words:
            return self._first_at
        return None if self.first_wait_s is None else self._first_at + self.first_wait_s

    @property
    def near_first_cut(self) -> bool:
        """Whether one more word would end the first phrase early (``first_words``)."""
        return self._first and self.first_words is not None and len(self._words) + 1 >= self.first_words

    @property
    def held_words(self) -> int:
        """Complete words waiting for their unit to end."""
        return len(self._words)

    def cut_early(self, min_words: int = 2) -> list[str]:
        """End the unit now, between phrases (as the early first phrase ends: before a last word
        that leans on the next), when it holds ``min_words`` words or more and its last word
        may not end a sentence (``"Dr."``, ``"p.m."``: the next word decides, as for the first
        phrase): the listener's audio runs out before the clause's punctuation comes
        (:class:`myna.engines.piper.PiperStream`). The rest of the words stay for the next unit."""
        return self._cut(self._phrase_end()) if len(self._words) >= min_words and not self._maybe else []

    def would_cut(self, word: str, now: float) -> list[str]:
        """The units :meth:`push` and :meth:`poll` would return for ``word`` at ``now``; the
        chunker is left as it is (a guess: :class:`myna.engines.piper.PiperStream`)."""
        trial = copy.deepcopy(self)
        return trial.push(word, now) + trial.poll(now)

    def _ends_unit(self, word: str) -> End:
        if not ends_clause(word):
            return End.NOT_END
        if word.rstrip(CLOSERS).endswith("."):
            return end_of(word, self._texts[:-1])
        return End.END

    def _may_cut(self) -> bool:
        return not self._first or len(self._words) >= self.first_min_words

    def _new_turn(self) -> None:
        self._first = True

    def _cut(self, n: int | None = None) -> list[str]:
        units = super()._cut(n)
        if units:
            self._first = False
        return units

    def _phrase_end(self) -> int:
        """How many words the early first phrase takes: all of them, or the words before the
        last one that leans on what follows ("the", "to", "with"…), so the cut falls between
        phrases ("She painted | the old fence") and not inside one ("the old | fence"),
        where the voice's fresh start makes the word after the cut harder to hear."""
        for i in range(len(self._words) - 1, 1, -1):
            if self._words[i].lower() in LEANING_WORDS:
                return i
        return len(self._words)


class SentenceChunker(_Chunker):
    """Like :class:`ClauseChunker`, but a unit ends only at a sentence end (``. ! ? …``).

    A unit also ends after ``max_words`` words or ``max_chars`` characters without one (at a
    word boundary), so a reply without punctuation cannot hold a thread forever.
    """

    def __init__(self, max_words: int = 60, max_chars: int = 480) -> None:
        super().__init__(max_words, max_chars)

    def _ends_unit(self, word: str) -> End:
        core = word.rstrip(CLOSERS)
        if core.endswith("."):
            return end_of(word, self._texts[:-1])
        return End.END if core and core[-1] in "!?…" else End.NOT_END


class WholeChunker(_Chunker):
    """The whole reply is one unit, returned at the end of the turn (a non-streaming pipeline).

    Capped at ``max_chars`` characters per unit (at a word boundary) so one turn cannot hold a
    synthesis thread without bound; a normal reply is far shorter.
    """

    def __init__(self, max_chars: int = 4000) -> None:
        super().__init__(max_words=10**9, max_chars=max_chars)
        self._held: list[str | Pause] = []  # units and pauses of the reply, released at the end

    def push(self, word: str, now: float = 0.0) -> list[str]:
        self._held += super().push(word, now)
        return []

    def pause(self, ms: float = 0.0) -> list[str | Pause]:
        if ms > 0:  # a line break stays inside the one unit; a <break> needs its own silence
            self._held += super().pause(ms)
        return []

    def flush(self) -> list[str | Pause]:
        out, self._held = [*self._held, *super().flush()], []
        return out
