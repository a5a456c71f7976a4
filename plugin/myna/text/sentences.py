"""Where sentences end, decided by a maintained segmenter (``pysbd``) one word at a time.

A word ending in ``!``, ``?``, ``…`` or ``...`` ends its sentence. A full stop is ambiguous:
``"you."`` ends one, ``"Mr."`` never does, and ``"a.m."``, ``"No."``, ``"Jr."`` or ``"U.S."``
end one or not depending on the next word (``"10 a.m. tomorrow"`` against ``"at 10 a.m. Then"``).
pysbd (Golden Rules English segmentation: abbreviations, initials, numbers, "No. 5") knows
these rules; we do not keep our own list. Streaming text asks it twice:

- :func:`end_of` when the word arrives: ``END`` when the word ends a sentence whatever comes
  next (pysbd splits after it before a lowercase word, a capitalised word and a number alike),
  ``NOT_END`` when it has no final punctuation, ``MAYBE`` otherwise;
- :func:`is_boundary` for a ``MAYBE`` word once the next word is known.

A caller that never learns the next word (the text went quiet, the turn ended) treats
``MAYBE`` as an end: a pause after ``"Mr."`` is harmless; holding a real sentence end is not.
"""

from __future__ import annotations

import enum
from functools import lru_cache

#: Closing quotes and brackets (and markdown emphasis) that may follow the final punctuation.
CLOSERS = "\"'”’»)]}*_"
#: Punctuation that ends a sentence whatever follows.
_ALWAYS_END = "!?…"
#: Words of context given to pysbd before the word in question.
_CONTEXT_WORDS = 4
#: Next words tried by :func:`end_of`: lowercase, capitalised, a number.
_PROBES = ("then", "Then", "5")


class End(enum.Enum):
    """Whether a word ends a sentence (see :func:`end_of`)."""

    NOT_END = 0
    MAYBE = 1
    END = 2


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False, char_span=True)


@lru_cache(maxsize=4096)
def _splits(before: str, after: str) -> bool:
    """Whether pysbd puts a sentence boundary between ``before`` and ``after`` (not elsewhere
    in ``before``, which may hold an earlier sentence end)."""
    return any(len(before) <= span.end <= len(before) + 1 for span in _segmenter().segment(f"{before} {after}")[:-1])


def _context(previous: list[str], word: str) -> str:
    # Closing quotes and brackets after the stop are left out: pysbd keeps "(quietly.)" inside
    # its sentence, where a listener hears the stop.
    return " ".join([*previous[-_CONTEXT_WORDS:], word.rstrip(CLOSERS)])


def end_of(word: str, previous: list[str] = ()) -> End:
    """Whether ``word`` ends its sentence, before the next word is known.

    Args:
        word: a whole word with its punctuation, e.g. ``"you."``, ``'it!"'``, ``"a.m."``.
        previous: the words before it in the same sentence (the last few are used).

    >>> [end_of(w).name for w in ("you.", "Really?!", "Mr.", "a.m.", "3.14", "well")]
    ['END', 'END', 'MAYBE', 'MAYBE', 'NOT_END', 'NOT_END']
    """
    core = word.rstrip(CLOSERS)
    if not core:
        return End.NOT_END
    if core[-1] in _ALWAYS_END or core.endswith(".."):  # "..." is an ellipsis, like "…"
        return End.END
    if core[-1] != "." or not any(ch.isalnum() for ch in core):
        return End.NOT_END
    before = _context(list(previous), word)
    if all(_splits(before, probe) for probe in _PROBES):
        return End.END
    return End.MAYBE


def is_boundary(word: str, next_word: str, previous: list[str] = ()) -> bool:
    """Whether a sentence ends between ``word`` and ``next_word`` (pysbd's decision).

    >>> is_boundary("a.m.", "tomorrow", ["at", "10"]), is_boundary("Mr.", "Smith")
    (False, False)
    >>> is_boundary("you.", "Your"), is_boundary("p.m.", "Then", ["at", "5"])
    (True, True)
    """
    core = word.rstrip(CLOSERS)
    if core and core[-1] in _ALWAYS_END or core.endswith(".."):
        return True
    if not core.endswith("."):
        return False
    return _splits(_context(list(previous), word), next_word)
