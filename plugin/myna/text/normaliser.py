"""The text front end's normaliser: written words in, words marked with how to say them out.

Every engine's words pass through one :class:`Normaliser` (inside :class:`myna.text.TextIntake`),
so Piper and DSM say ``555-123-4567``, ``jane@acme.com``, ``3/14``, ``5:30pm``, ``10 kg``,
``21st``, ``15%``, ``v2.3.1``, ``XK7-92QZ`` and ``$12.75`` alike. The rules are
:mod:`myna.text.readings` (number words from ``num2words``). A word whose reading differs from
its writing comes out *marked* (:mod:`myna.text.said`: written + spoken, its punctuation outside
the mark), so captions and ``word`` events keep the written word while the engine reads the
spoken one; a word already marked (``<sub>``, ``<phoneme>``, the lexicon) is left as it is.

Streaming: words arrive whole (the word segmenter never cuts one), but a few readings depend on
the word after (``1920 people`` is a count, ``$1.5 million``, ``No. 5``, ``14 March``, ``5:00
pm``, ``(555) 123-4567``). A word that may need it (one with a digit that does not end a clause,
or ``No.`` and the month abbreviations) is held until the next word comes, a pause or line end,
the quiet time (:meth:`release`) or the end of the turn; every other word passes at once, so
ordinary prose waits for nothing.

Why our own rules: the maintained text normalisers for English TTS (NVIDIA's
``nemo-text-processing``, WeTextProcessing) are weighted finite-state grammars (pynini) that
normalise a whole sentence at a time, and ``phonenumbers`` validates and formats numbers it is
given whole. ``nemo-text-processing`` 1.2.0 (pynini 2.1.6) was tried on this project's 2-core CPU:
its English grammars take ~2 min to build (1–2 s to load from a cache), and one call costs
~8 ms of CPU for one word, ~30 ms for six and 27–64 ms for a 15-word sentence, 10–60× the
front end's budget (≤ 1 ms a chunk); it also reads this project's cases of the kinds these
rules decide by context otherwise (``24/7`` "twenty four sevenths", ``due 6/12`` "six twelfths",
``from 6/1`` "six over one", ``Mill Rd.`` and ``Ave.`` left as written). None reads a word
stream with one word of look-ahead inside the budget, so the readings are ours and only number
words come from a library.
"""

from __future__ import annotations

import re

from myna.text import readings, said
from myna.text.symbols import ends_clause
from myna.text.verbalise import NUMBER_ABBREVIATIONS

#: Words of context kept before the word being read.
CONTEXT_WORDS = 3


def needs_next(word: str) -> bool:
    """Whether the reading of ``word`` may depend on the word after it (so it is held)."""
    key = readings.bare(word)
    if key in NUMBER_ABBREVIATIONS and word.rstrip("\"'”’)").endswith("."):
        return True
    if key in readings.NEEDS_NEXT and word.lstrip("\"'“‘([")[:1].isupper() and not ends_clause(word.rstrip(".")):
        return True  # "Dr." (Drive or Doctor), "Apt 4", "N Main"
    if word.endswith(("–", "—")):
        return True  # a range's dash: "9am–" then "5pm", "Monday–" then "Friday"
    return bool(_DIGIT.search(word)) and not ends_clause(word)


_DIGIT = re.compile(r"\d")


class Normaliser:
    """One turn's words → the same words, marked where they are said otherwise.

    Args:
        enabled: False passes every word through as written (the session turned it off).

    >>> n = Normaliser()
    >>> n.push(["Call"]), n.push(["555-123-4567"]), n.push(["now."])[0].split(said.MARK)[1]
    (['Call'], [], 'five\\ue001five\\ue001five,\\ue001one\\ue001two\\ue001three,\\ue001four\\ue001five\\ue001six\\ue001seven')
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._before: list[str] = []  # written words of the turn so far (the last few)
        self._held: str | None = None  # a word waiting for the next one
        self._phone = False  # the last word read was part of a phone number

    @property
    def holding(self) -> bool:
        """True while a word waits for the next one (:meth:`release` returns it)."""
        return self._held is not None

    def push(self, items: list) -> list:
        """Take intake items (words as str; pauses and other items pass in order); return
        the items ready, words marked where they are said otherwise."""
        out: list = []
        for item in items:
            if not isinstance(item, str):
                out += self.release()
                out.append(item)
                continue
            if self._held is not None:
                out.append(self._say(self._held, said.written_of(item)))
                self._held = None
            if self.enabled and said.MARK not in item and needs_next(item):
                self._held = item
            else:
                out.append(self._say(item, None))
        return out

    def release(self) -> list[str]:
        """The held word, read without the word after it (none is coming soon)."""
        if self._held is None:
            return []
        word, self._held = self._held, None
        return [self._say(word, None)]

    def reset(self) -> None:
        """A new turn: forget the context."""
        self._before, self._held, self._phone = [], None, False

    def _say(self, word: str, nxt: str | None) -> str:
        written = said.written_of(word)
        context = readings.Context(self._before, nxt, self._phone)
        self._before = [*self._before[-(CONTEXT_WORDS - 1):], written]
        if not self.enabled or said.MARK in word:
            self._phone = False
            return word
        spoken, kind = readings.read(word, context)
        self._phone = kind == "phone"
        if spoken is None:
            return word
        lead, core, trail = readings.split(word)
        if kind == "range":
            trail = trail[1:]  # the dash is the "to" (readings.opens_range)
        elif spoken == core:
            return word
        return lead + said.mark(core, spoken) + trail

