"""Words whose spoken form is given (SSML ``<sub>``, ``<phoneme>``, the lexicon): one marked word.

A given form travels through the text front end as one word string, ``written`` + :data:`MARK` +
``spoken`` (spaces inside either as :data:`SPACE`), so chunkers and units treat it as one word,
captions keep ``written`` (:func:`written_of`) and the engine reads ``spoken``: words, or IPA
phonemes between :data:`IPA` marks (``<phoneme alphabet="ipa">``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARK, SPACE, IPA = "\ue000", "\ue001", "\ue002"


@dataclass(frozen=True)
class Said:
    """A scanner item: ``written`` is read as ``spoken`` words, or as ``ipa`` phonemes."""

    written: str
    spoken: str | None = None
    ipa: str | None = None


def mark(written: str, spoken: str | None = None, ipa: str | None = None) -> str:
    """One word string for ``written`` read as ``spoken`` (or as the phonemes ``ipa``)."""
    form = f"{IPA}{ipa}{IPA}" if ipa is not None else (spoken or written)
    return f"{written.strip()}{MARK}{' '.join(form.split())}".replace(" ", SPACE)


def split(word: str) -> tuple[str, str | None]:
    """``(written, spoken)`` of a word; ``spoken`` is None for an ordinary word. The spoken form
    may hold spaces, and IPA between :data:`IPA` marks."""
    if MARK not in word:
        return word, None
    written, spoken = word.split(MARK, 1)
    return written.replace(SPACE, " "), spoken.replace(SPACE, " ")


def written_of(word: str) -> str:
    """The written form of a (possibly marked) word: what captions show."""
    return split(word)[0]


def ipa_of(spoken: str) -> str | None:
    """The IPA of a spoken form given as phonemes, else None."""
    return spoken[1:-1] if len(spoken) >= 2 and spoken[0] == IPA and spoken[-1] == IPA else None


_TRAIL = re.compile(r"[.,;:!?…\"'”’»)\]}]*\Z")


def text_of(word: str) -> str:
    """The written word with the punctuation that follows it (a mark keeps that punctuation
    after the spoken form: ``Jr`` + MARK + ``junior.`` → ``Jr.``): what sentence and clause
    boundaries are decided on."""
    if MARK not in word:
        return word
    written, spoken = split(word)
    return written + _TRAIL.search(spoken).group()
