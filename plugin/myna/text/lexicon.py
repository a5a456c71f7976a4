"""A pronunciation lexicon: written word → respelling, applied in the text front end.

The file (``myna serve --lexicon FILE``) has one entry a line, ``word = respelling`` (UTF-8;
``#`` starts a comment, blank lines are skipped). A word matches whatever its case and the
punctuation around it (``Myna,`` matches ``myna``); the punctuation is kept, captions keep the
written word (:mod:`myna.text.said`).
"""

from __future__ import annotations

from pathlib import Path

from myna.text import said

_PUNCTUATION = ".,;:!?\"'()[]{}…-—"
_default: "Lexicon | None" = None


class Lexicon:
    """Respellings by word (see the module docstring).

    Args:
        entries: written word → respelling.

    >>> Lexicon({"Myna": "my nah"}).apply("myna,") == said.mark("myna", "my nah") + ","
    True
    """

    def __init__(self, entries: dict[str, str]):
        self.entries = {k.strip().casefold(): " ".join(v.split()) for k, v in entries.items() if k.strip() and v.strip()}

    @classmethod
    def load(cls, path: str | Path) -> "Lexicon":
        """Read a lexicon file.

        Raises:
            ValueError: a line is not ``word = respelling`` (the message names the line), or
                the file cannot be read.
        """
        entries = {}
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the lexicon {path}: {exc}") from None
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            word, eq, respelling = line.partition("=")
            if not eq or not word.strip() or not respelling.strip() or len(word.split()) != 1:
                raise ValueError(f"{path}:{number}: expected 'word = respelling', got {line[:60]!r}")
            entries[word.strip()] = respelling
        return cls(entries)

    def apply(self, word: str) -> str:
        """``word`` marked with its respelling when the lexicon has it (punctuation kept
        outside the mark), else ``word`` unchanged."""
        if said.MARK in word:
            return word
        core = word.strip(_PUNCTUATION)
        respelling = self.entries.get(core.casefold()) if core else None
        if respelling is None:
            return word
        head, tail = word[: word.index(core)], word[word.index(core) + len(core):]
        return head + said.mark(core, respelling) + tail


def default() -> "Lexicon | None":
    """The process's lexicon (:func:`use`); None: none."""
    return _default


def use(lexicon: "Lexicon | None") -> None:
    """Make ``lexicon`` the process's: every turn's text front end applies it from now on."""
    global _default
    _default = lexicon
