"""Markup tags in streamed text: never spoken; ``<break time="…"/>`` becomes a pause.

LLMs write SSML and HTML into replies (``<break time="0.5s"/>``, ``<emphasis>``, ``<br>``),
and token streams cut them anywhere (``"It's fine <bre"``, ``'ak time="0.5s" />'``).
:class:`TagScanner` holds a possible tag until its ``>`` arrives, then:

- ``<break>`` (SSML 1.1 §3.2.3): a :class:`Pause` of its ``time`` (``"500ms"``, ``"0.5s"``,
  at most :data:`MAX_PAUSE_MS`) or, without one, of its ``strength`` (default ``medium``);
- a tag that ends a line in HTML (``<br>``, ``<p>``, ``<li>``, ``<h1>``…): a line break;
- ``<sub alias="…">W3C</sub>`` and ``<phoneme alphabet="ipa" ph="…">word</phoneme>``: a
  :class:`~myna.text.said.Said` item once the end tag arrives (written words, and what to read
  instead); without an alias or IPA, or never closed, the words inside are plain text;
- any other tag (``<emphasis>``, ``</speak>``, ``<voice name="x">``, comments): a space.

What is not a tag stays text: ``a < b``, ``<3``, ``x<y then z`` (an attribute without a value
can only be a tag's last), and autolinks (``<https://x.y>``, ``<a@b.c>``), which the
normaliser reduces to their host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from myna.text.said import Said

#: Longest pause a ``<break>`` may ask for (ms); SSML engines cap it similarly (Polly: 10 s).
MAX_PAUSE_MS = 10_000.0
#: Longest text held while waiting for a tag's ``>`` (characters); past it, ``<`` is text.
MAX_TAG_CHARS = 256
#: ``<break strength="…">`` without ``time``, in ms (SSML leaves them to the engine; these
#: follow the pauses a reader makes after a comma, a sentence and a paragraph).
STRENGTH_MS = {"none": 0.0, "x-weak": 100.0, "weak": 200.0, "medium": 400.0, "strong": 700.0, "x-strong": 1200.0}
#: Tags that end a line: text after them starts a new unit.
_LINE_TAGS = frozenset({"br", "p", "div", "li", "ul", "ol", "tr", "table", "h1", "h2", "h3", "h4", "h5", "h6",
                        "blockquote", "pre", "hr", "section", "article", "paragraph", "s"})

_ATTRIBUTE = r"""[A-Za-z_:][-\w:.]*(?:\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s"'<>=`]+))?"""
_TAG = re.compile(rf"<(/?)([A-Za-z][-\w:.]*)((?:\s+{_ATTRIBUTE})*)\s*/?\s*>")
# The start of a tag still arriving: a name, then attributes with values (the last one may be
# cut anywhere). "<y then more" is no tag: an attribute without a value can only be the last.
_PARTIAL_TAG = re.compile(
    r"""<(?:!|\?|/|/?[A-Za-z][-\w:.]*(?:\s+[A-Za-z_:][-\w:.]*\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s"'<>=`]+))*"""
    r"""(?:\s+(?:[A-Za-z_:][-\w:.]*(?:\s*=\s*(?:"[^"<>]*|'[^'<>]*|[^\s"'<>=`]*))?)?)?\s*/?)?$"""
)
_COMMENT = re.compile(r"<!--.*?-->|<![^<>]*>|<\?[^<>]*\?>", re.DOTALL)
_TIME = re.compile(r"""\btime\s*=\s*["']?\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)?\s*["']?""", re.IGNORECASE)
_STRENGTH = re.compile(r"""\bstrength\s*=\s*["']?([-\w]+)""", re.IGNORECASE)
# What may follow "<" in a tag (a name, "/" for an end tag, "!" or "?" for comments and the like).
_TAG_START = re.compile(r"<[/!?A-Za-z]")


@dataclass(frozen=True)
class Pause:
    """A pause in the turn: ``ms`` milliseconds of silence (0: a boundary, e.g. a line end)."""

    ms: float


LINE_BREAK = "\n"

ScanItem = str | Pause | Said
_ALIAS = re.compile(r"""\balias\s*=\s*(?:"([^"<>]*)"|'([^'<>]*)')""", re.IGNORECASE)
_PH = re.compile(r"""\bph\s*=\s*(?:"([^"<>]*)"|'([^'<>]*)')""", re.IGNORECASE)
_ALPHABET = re.compile(r"""\balphabet\s*=\s*["']?([-\w]+)""", re.IGNORECASE)


@dataclass(frozen=True)
class _Open:
    """``<sub>`` or ``<phoneme>`` began: the text up to its end tag is what it applies to."""

    name: str
    spoken: str | None = None
    ipa: str | None = None


@dataclass(frozen=True)
class _Close:
    name: str


def break_ms(attributes: str) -> float:
    """The pause a ``<break>`` asks for, from its attribute text (ms).

    >>> break_ms(' time="0.5s"'), break_ms(" time='250ms'"), break_ms(' strength="strong"'), break_ms("")
    (500.0, 250.0, 700.0, 400.0)
    """
    time = _TIME.search(attributes)
    if time:
        value = float(time.group(1)) * (1.0 if (time.group(2) or "ms").lower() == "ms" else 1000.0)
        return min(value, MAX_PAUSE_MS)
    strength = _STRENGTH.search(attributes)
    return STRENGTH_MS.get(strength.group(1).lower(), STRENGTH_MS["medium"]) if strength else STRENGTH_MS["medium"]


class TagScanner:
    """Remove tags from streamed text, keeping their meaning (pauses, line ends).

    >>> scanner = TagScanner()
    >>> scanner.push("It's fine <bre"), scanner.push('ak time="0.5s" />'), scanner.push(" ok.")
    (["It's fine "], [Pause(ms=500.0)], [' ok.'])
    """

    def __init__(self) -> None:
        self._held = ""  # from a "<" that may start a tag
        self._open: _Open | None = None  # a <sub> or <phoneme> whose end tag has not come
        self._inside = ""  # the text inside it so far

    @property
    def holding(self) -> bool:
        """True while a possible tag waits for its end."""
        return bool(self._held)

    def push(self, chunk: str) -> list[ScanItem]:
        """Add text; return text (tags replaced) and :class:`Pause` items, in order."""
        return self._given(self._push(chunk))

    def _push(self, chunk: str) -> list:
        text, self._held = self._held + chunk, ""
        out: list = []
        start = 0
        while (lt := text.find("<", start)) >= 0:
            rest = text[lt:]
            tag = _COMMENT.match(rest) or _TAG.match(rest)
            if tag and not _is_autolink(tag.group(0)):
                out.append(text[start:lt])
                out += _meaning(tag)
                start = lt + tag.end()
            elif _may_become_tag(rest):
                out.append(text[start:lt])
                self._held = rest
                return out
            else:
                out.append(text[start : lt + 1])
                start = lt + 1
        out.append(text[start:])
        return out

    def _given(self, items: list) -> list[ScanItem]:
        """Text inside ``<sub>`` / ``<phoneme>`` becomes one :class:`Said` at its end tag."""
        out: list = []
        for item in items:
            if isinstance(item, _Open):
                out += self._unclosed()
                self._open, self._inside = item, ""
            elif isinstance(item, _Close):
                if self._open is not None and self._open.name == item.name:
                    opened, inside = self._open, self._inside
                    self._open, self._inside = None, ""
                    if inside.strip():
                        out.append(Said(" ".join(inside.split()), opened.spoken, opened.ipa))
                else:
                    out.append(" ")
            elif self._open is not None and isinstance(item, str):
                self._inside += item
            else:
                out.append(item)
        return _merge(out)

    def _unclosed(self) -> list:
        inside, self._open, self._inside = self._inside, None, ""
        return [inside] if inside else []

    def flush(self) -> list[ScanItem]:
        """End of text: a tag that never closed is dropped (it was never meant to be heard);
        the words of a ``<sub>`` or ``<phoneme>`` that never closed are read as written."""
        held, self._held = self._held, ""
        return _merge(self._unclosed() + ([] if _TAG_START.match(held) else ([held] if held else [])))


def _is_autolink(tag: str) -> bool:
    """``<https://…>`` or ``<sam@acme.com>``: told by what follows ``<`` up to a space, so an
    attribute value with an address or an X-SAMPA ``@`` leaves a tag a tag."""
    head = tag[1:].split(None, 1)[0] if tag[1:].strip() else ""
    return "://" in head or "@" in head


def _may_become_tag(rest: str) -> bool:
    """Whether text starting at "<" could still turn into a tag with more text."""
    if len(rest) > MAX_TAG_CHARS or ">" in rest or _is_autolink(rest):
        return False
    if rest.startswith("<!--"):
        return True  # a comment may hold anything until its "-->"
    return bool(_PARTIAL_TAG.match(rest))


def _meaning(tag: re.Match[str]) -> list[ScanItem]:
    if tag.re is _COMMENT:
        return [" "]
    name = tag.group(2).lower().split(":")[-1]
    if name == "break":
        return [Pause(break_ms(tag.group(3) or ""))]
    if name in ("sub", "phoneme"):
        if tag.group(1):
            return [_Close(name)]
        attributes = tag.group(3) or ""
        if tag.group(0).rstrip(">").rstrip().endswith("/"):
            return [" "]  # (self-closing: nothing to apply to)
        if name == "sub":
            alias = _ALIAS.search(attributes)
            return [_Open(name, spoken=next(g for g in alias.groups() if g is not None))] if alias else [_Open(name)]
        ph, alphabet = _PH.search(attributes), _ALPHABET.search(attributes)
        ipa = (next(g for g in ph.groups() if g is not None).strip() or None) if ph else None  # (ph="": the word)
        if alphabet and alphabet.group(1).lower() != "ipa":
            ipa = None  # (x-sampa and the rest: read the word)
        return [_Open(name, ipa=ipa)]
    return [LINE_BREAK if name in _LINE_TAGS else " "]


def _merge(items: list[ScanItem]) -> list[ScanItem]:
    """Join adjacent text pieces; drop empty ones."""
    out: list[ScanItem] = []
    for item in items:
        if isinstance(item, str) and out and isinstance(out[-1], str):
            out[-1] += item
        elif item != "":
            out.append(item)
    return out
