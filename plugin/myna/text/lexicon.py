"""A pronunciation lexicon: written word (or a pattern) → respelling or IPA, in the text front end.

Entries (:class:`Entry`) match one written word, its punctuation stripped (``Myna,`` matches
``myna``; the punctuation is kept); captions keep the written word (:mod:`myna.text.said`):

- a *word* entry matches that word, in any case by default, or only as written (``case`` exact:
  ``US`` is not ``us``); an exact entry wins over an any-case one;
- a *regex* entry's pattern must match the whole word (Python :mod:`re`; any case unless exact);
  its respelling may use the pattern's groups (``\\1``); word entries are tried first, then the
  regex entries in order;
- the spoken form is a *respelling* (words the voice reads) or *IPA* (as a dictionary or
  espeak-ng writes it, ``ˈbʌtər`` or ``bˈʌɾɚ``; Piper puts it in its voice's notation,
  :mod:`myna.text.ipa`; an engine that cannot take phonemes says ``phonemes_ignored`` and
  reads the word).

The file (``myna serve --lexicon FILE``), one entry a line (UTF-8; ``#`` starts a comment)::

    Zyntrix = zin tricks         # a word, any case
    US == you ess                # exact case only
    /([A-Z]{2})-(\\d+)/ = \\1 \\2  # a regex (whole word), groups in the respelling
    tomato = /təmˈɑːtoʊ/          # IPA between slashes

The same entries as JSON (the WebSocket ``config.lexicon``, :meth:`Lexicon.from_json`): an
object ``{"Zyntrix": "zin tricks", "tomato": "/təmˈɑːtoʊ/"}`` (any case), or a list of objects
``{"word" | "regex": …, "say" | "ipa": …, "case"?: "any" | "exact"}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import regex

from myna.text import said

log = logging.getLogger(__name__)

_PUNCTUATION = ".,;:!?\"'()[]{}…-—"
#: Bounds on a lexicon sent by a client (entries, characters of a pattern or a spoken form).
MAX_ENTRIES, MAX_PATTERN_CHARS, MAX_SPOKEN_CHARS = 1000, 200, 200
#: The longest a regex entry may take to match one word (s); one that takes longer is left out
#: of its lexicon from then on (a pattern that backtracks without end, sent by a client).
MATCH_TIMEOUT_S = 0.02
_default: "Lexicon | None" = None


@dataclass(frozen=True)
class Entry:
    """One lexicon entry (see the module docstring): ``match`` a word or a regex pattern, read
    as ``say`` (a respelling) or ``ipa`` (phonemes); ``exact`` case or any case."""

    match: str
    say: str | None = None
    ipa: str | None = None
    regex: bool = False
    exact: bool = False


def _spoken(text: str) -> tuple[str | None, str | None]:
    """``(say, ipa)`` of a right-hand side: ``/…/`` is IPA, anything else a respelling."""
    text = " ".join(text.split())
    if len(text) > 2 and text.startswith("/") and text.endswith("/"):
        return None, text[1:-1].strip()
    return text, None


class Lexicon:
    """Respellings by word and by pattern (see the module docstring).

    Args:
        entries: written word → respelling (any case; ``/…/`` is IPA), or :class:`Entry` s.

    Raises:
        ValueError: a regex entry that does not compile (the message names it).

    >>> Lexicon({"Myna": "my nah"}).apply("myna,") == said.mark("myna", "my nah") + ","
    True
    """

    def __init__(self, entries: "dict[str, str] | list[Entry]"):
        if isinstance(entries, dict):
            entries = [Entry(k.strip(), *_spoken(v)) for k, v in entries.items() if k.strip() and v.strip()]
        self.entries: list[Entry] = list(entries)
        self._exact: dict[str, Entry] = {}
        self._any: dict[str, Entry] = {}
        self._patterns: list[tuple[regex.Pattern, Entry]] = []
        for entry in self.entries:
            if entry.regex:
                self._patterns.append((_compiled(entry.match, entry.exact), entry))
            elif entry.exact:
                self._exact[entry.match] = entry
            else:
                self._any[entry.match.casefold()] = entry
        self._then: Lexicon | None = None

    @classmethod
    def load(cls, path: str | Path) -> "Lexicon":
        """Read a lexicon file.

        Raises:
            ValueError: a line is not ``word = respelling`` (or ``==``, a ``/regex/`` on the
                left, ``/ipa/`` on the right), a regex does not compile (the message names the
                line), or the file cannot be read.
        """
        entries = []
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the lexicon {path}: {exc}") from None
        for number, line in enumerate(text.splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            exact = "==" in line
            word, eq, spoken = line.partition("==" if exact else "=")
            word = word.strip()
            if not eq or not word or not spoken.strip() or len(word.split()) != 1:
                raise ValueError(f"{path}:{number}: expected 'word = respelling', got {line[:60]!r}")
            regex = len(word) > 2 and word.startswith("/") and word.endswith("/")
            try:
                entries.append(_checked(Entry(word[1:-1] if regex else word, *_spoken(spoken), regex=regex, exact=exact)))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
        return cls(entries)

    @classmethod
    def from_json(cls, value: object) -> "Lexicon":
        """A lexicon sent as JSON (see the module docstring).

        Raises:
            ValueError: not an object or a list of entry objects, more than
                :data:`MAX_ENTRIES` entries, an entry without ``word``/``regex`` or
                ``say``/``ipa`` (or with both), a ``case`` other than ``any``/``exact``, a
                pattern that does not compile, or over-long strings; the message names the entry.
        """
        if isinstance(value, dict):
            items = [{"word": k, "say": v} for k, v in value.items()]
        elif isinstance(value, list):
            items = value
        else:
            raise ValueError("lexicon must be an object (word → respelling) or a list of entries")
        if len(items) > MAX_ENTRIES:
            raise ValueError(f"lexicon has {len(items)} entries; at most {MAX_ENTRIES}")
        entries = []
        for i, item in enumerate(items):
            where = f"lexicon entry {i + 1}"
            if not isinstance(item, dict):
                raise ValueError(f"{where}: must be an object with \"word\" or \"regex\", and \"say\" or \"ipa\"")
            match = item.get("word", item.get("regex"))
            if ("word" in item) == ("regex" in item) or not isinstance(match, str) or not match.strip():
                raise ValueError(f"{where}: needs one of \"word\" or \"regex\" (a non-empty string)")
            spoken = [k for k in ("say", "ipa") if k in item]
            if len(spoken) != 1 or not isinstance(item[spoken[0]], str) or not item[spoken[0]].strip():
                raise ValueError(f"{where}: needs one of \"say\" or \"ipa\" (a non-empty string)")
            case = item.get("case", "any")
            if case not in ("any", "exact"):
                raise ValueError(f"{where}: \"case\" must be \"any\" or \"exact\"")
            say, ipa = _spoken(item["say"]) if spoken == ["say"] else (None, " ".join(item["ipa"].split()).strip("/"))
            if "word" in item and len(match.split()) != 1:
                raise ValueError(f"{where}: a \"word\" is one word (use \"regex\" for patterns)")
            try:
                entries.append(_checked(Entry(match.strip(), say, ipa, regex="regex" in item, exact=case == "exact")))
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        return cls(entries)

    def then(self, other: "Lexicon | None") -> "Lexicon":
        """This lexicon, falling back to ``other`` for a word it has no entry for (a session's
        lexicon over the process's)."""
        if other is None:
            return self
        chained = Lexicon(self.entries)
        chained._then = other
        return chained

    def _find(self, core: str) -> str | None:
        """The marked word for ``core`` (no punctuation), or None."""
        entry = self._exact.get(core) or self._any.get(core.casefold())
        if entry is not None:
            return said.mark(core, entry.say, entry.ipa)
        for pattern, entry in self._patterns:
            try:
                m = pattern.fullmatch(core, timeout=MATCH_TIMEOUT_S)
            except TimeoutError:  # a pattern that backtracks without end ("(a|a)+$"): left out
                # (a new list: the loop goes on over the old one)
                self._patterns = [kept for kept in self._patterns if kept[1] is not entry]
                log.warning("lexicon regex %r took over %g ms on one word; left out from now on",
                            entry.match, 1000 * MATCH_TIMEOUT_S)
                continue
            if m is not None:
                try:
                    spoken = m.expand(entry.say) if entry.say is not None else None
                except (regex.error, IndexError):
                    spoken = entry.say
                return said.mark(core, spoken, entry.ipa)
        return self._then._find(core) if self._then is not None else None

    def apply(self, word: str) -> str:
        """``word`` marked with its respelling or IPA when the lexicon has an entry for it
        (punctuation kept outside the mark), else ``word`` unchanged."""
        if said.MARK in word:
            return word
        core = word.strip(_PUNCTUATION)
        marked = self._find(core) if core else None
        if marked is None:
            return word
        head, tail = word[: word.index(core)], word[word.index(core) + len(core):]
        return head + marked + tail


def _checked(entry: Entry) -> Entry:
    """``entry`` if its strings are within bounds and its regex compiles.

    Raises:
        ValueError: naming what is wrong.
    """
    if len(entry.match) > MAX_PATTERN_CHARS:
        raise ValueError(f"{entry.match[:30]!r}…: at most {MAX_PATTERN_CHARS} characters")
    if not (entry.say or entry.ipa or "").strip():
        raise ValueError(f"the spoken form of {entry.match[:30]!r} is empty (\"/\" is no IPA)")
    if len(entry.say or entry.ipa or "") > MAX_SPOKEN_CHARS:
        raise ValueError(f"the spoken form of {entry.match[:30]!r} is over {MAX_SPOKEN_CHARS} characters")
    if entry.regex:
        _compiled(entry.match, entry.exact)
    return entry


def _compiled(pattern: str, exact: bool) -> "regex.Pattern":
    """``pattern`` compiled (the ``regex`` package, in ``re``'s syntax: its matches take a time
    limit, :data:`MATCH_TIMEOUT_S`; the standard ``re`` has none, and lexicons come from clients).

    Raises:
        ValueError: it does not compile (bad syntax, a repeat count too large to compile…).
    """
    try:
        return regex.compile(pattern, regex.V0 | (0 if exact else regex.IGNORECASE))
    except (regex.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"regex {pattern!r} does not compile: {exc}") from None


def default() -> "Lexicon | None":
    """The process's lexicon (:func:`use`); None: none."""
    return _default


def use(lexicon: "Lexicon | None") -> None:
    """Make ``lexicon`` the process's: every turn's text front end applies it from now on."""
    global _default
    _default = lexicon
