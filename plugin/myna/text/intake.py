"""The text front end of a turn: LLM token chunks in, words and pauses for the voice out.

:class:`TextIntake` is what every engine stream puts in front of its voice
(:class:`myna.engines.base.SynthesisStream`). Follow one chunk:

1. :class:`~myna.text.markup.TagScanner` removes markup (also when a tag is split across
   chunks); ``<break time="0.5s"/>`` becomes a :class:`Pause` and line-ending tags a line break.
2. Line breaks end a phrase: the line's last word gets a full stop when it has no clause
   punctuation, and a ``Pause(0)`` boundary follows it, so list items and headings are spoken
   as units with a pause after each. A list marker opening a line (``1.``, ``2)``, ``a.``, ``B)``)
   loses its punctuation, so ``"1. Apple"`` is one phrase, "one Apple", with no stop inside.
3. :class:`~myna.text.segment.WordSegmenter` cuts the text into whole normalised words.
4. A word is complete when whitespace follows it, or at once when it ends a sentence or a
   clause (``"you."``, ``"done!"``, ``"Sure,"``, ``"Note:"``: token streams put the space in
   front of the next word, so waiting for it would hold a finished phrase until the LLM writes
   more). ``"3."`` (maybe ``3.14``), ``"3,"`` (maybe ``3,000``), ``"U."`` (maybe ``U.S.``),
   ``"https:"`` and URLs wait. A word with nothing after it is also complete once
   the text has been quiet a while: the caller calls :meth:`TextIntake.settle` for that.
5. Words in a script the voice cannot read come out as :class:`Skipped`, not as words.
6. The normaliser (:mod:`myna.text.normaliser`) marks the words said otherwise than written
   (phone numbers, addresses, dates, times, units, codes, numbers): the engine reads the
   spoken form, captions keep the written one. A word with a digit waits for the next word
   (its reading may depend on it), unless it ends a clause.

Two chunks that abut across a sentence end (``"…for you."`` then ``"Your order…"``) are two
words, never ``"you.Your"``.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from myna.text import lexicon as lexicon_module
from myna.text import said
from myna.text.markup import LINE_BREAK, Pause, Said, TagScanner
from myna.text.normaliser import Normaliser
from myna.text.symbols import ends_clause
from myna.text.scripts import LATIN, foreign_script
from myna.text.segment import WordSegmenter
from myna.text.sentences import CLOSERS

__all__ = ["Pause", "Skipped", "TextIntake", "IntakeItem", "speech_in"]


@dataclass(frozen=True)
class Skipped:
    """A word left out because the voice cannot read its script (e.g. ``"Cyrillic"``)."""

    script: str
    word: str


IntakeItem = str | Pause | Skipped

_LINE_BREAKS = re.compile(r"(\r\n|[\n\r\v\f\u2028\u2029])")
# A list marker opening a line, followed by whitespace: "1.", "12)", "a.", "B)" (not "J.", an
# initial as often as a marker).
_LIST_MARKER = re.compile(r"^(\s*)(\d{1,3}|[a-z](?=\.)|[A-Za-z](?=\)))[.)](?=\s)")
# The longest first word at a line start that is still held to see whether it is a marker.
_MARKER_CHARS = 4
# A raw word that ends its sentence or clause now: letters (two or more, so not an initial or
# "U.S" in progress) then . ! ? … , ; :, or ! ? … after anything. After digits a comma, a stop
# or a colon may go on ("3,000", "3.14", "10:30").
_COMPLETE_NOW = re.compile(r"(?:[^\W\d_]{2,}[.!?…,;:]+|[!?…]+)$")
# ... looked for in a word's last characters only: searched over a whole word, a long run of
# letters without punctuation costs its length squared, on every chunk.
_COMPLETE_TAIL = 64
# Not complete although it looks it: a URL, an address, a URL scheme waiting for its "//".
_URL_LIKE = re.compile(r"://|^www\.|@|\]\(|/|^(?:https?|ftp|file|mailto|tel|wss?):$", re.IGNORECASE)


def _complete_now(word: str) -> bool:
    """Whether ``word`` (closing quotes and brackets aside) is complete by :data:`_COMPLETE_NOW`."""
    return bool(_COMPLETE_NOW.search(word.rstrip(CLOSERS)[-_COMPLETE_TAIL:]))


class TextIntake:
    """Turn one turn's text chunks into words (str), :class:`Pause` and :class:`Skipped` items.

    Args:
        scripts: script names the voice reads (:mod:`myna.text.scripts`).
        lexicon: respellings applied to each word (:class:`myna.text.lexicon.Lexicon`; None:
            the process's, :func:`myna.text.lexicon.default`). A respelled word, like the words
            of ``<sub>`` and ``<phoneme>``, comes out marked (:mod:`myna.text.said`).
        normalise: mark how phone numbers, dates, units, codes and other numbers are said
            (:mod:`myna.text.normaliser`); False: words are given as written.

    >>> intake = TextIntake(normalise=False)  # (words as written: see myna.text.normaliser)
    >>> intake.push("Let"), intake.push(" me check"), intake.push(" that for you.")
    ([], ['Let', 'me'], ['check', 'that', 'for', 'you.'])
    >>> intake.push("Here:\\n1. Apple\\n2. Pear"), intake.flush()
    (['Here:', Pause(ms=0.0), '1', 'Apple.', Pause(ms=0.0), '2'], ['Pear'])
    """

    def __init__(self, scripts: frozenset[str] = LATIN, lexicon=None, normalise: bool = True):
        self.scripts = scripts
        self._norm = Normaliser(normalise)
        self.lexicon = lexicon if lexicon is not None else lexicon_module.default()
        self._tags = TagScanner()
        self._words = WordSegmenter()
        self._head: str | None = ""  # raw text of a line's start (None: past the first word)
        self._since_break = False  # a word has gone out since the last boundary

    @property
    def pending(self) -> bool:
        """True while text is held that :meth:`settle` would release (a partial word, a word
        that may still take punctuation, a line start), or a tag waits for its end."""
        return bool(self._head) or self._words.holding or self._tags.holding or self._norm.holding

    @property
    def normalise(self) -> bool:
        """Whether words are normalised (:mod:`myna.text.normaliser`); settable before a turn's text."""
        return self._norm.enabled

    @normalise.setter
    def normalise(self, on: bool) -> None:
        self._norm.enabled = bool(on)

    def push(self, chunk: str) -> list[IntakeItem]:
        """Add a chunk (any split); return the items it completed, in order."""
        out = self._scan(self._tags.push(chunk))
        if _complete_now(self._words.partial) and not _URL_LIKE.search(self._words.partial):
            out += self._accept(self._words.flush())
        return out

    def guess(self) -> list[IntakeItem]:
        """What :meth:`settle` would return now, the intake left as it is: a guess that the text
        held is complete (the next chunk may still continue it)."""
        return copy.deepcopy(self, {id(self.lexicon): self.lexicon}).settle()

    def settle(self) -> list[IntakeItem]:
        """The text has been quiet: what is held (except an unfinished tag) is complete."""
        return self._release_head() + self._accept(self._words.flush()) + self._norm.release()

    def flush(self) -> list[IntakeItem]:
        """End of the turn: return everything left and reset."""
        out = self._scan(self._tags.flush()) + self.settle()
        self._head, self._since_break = "", False
        self._norm.reset()
        return out

    # -- internals --------------------------------------------------------------------------
    def _scan(self, pieces) -> list[IntakeItem]:
        out: list[IntakeItem] = []
        for piece in pieces:
            if isinstance(piece, Said):  # one word, its spoken form given (<sub>, <phoneme>)
                out += self._release_head() + self._accept(self._words.flush())
                out += self._norm.push([said.mark(piece.written, piece.spoken, piece.ipa)])
                self._since_break = True
                continue
            if isinstance(piece, Pause):
                out += self.settle()
                out.append(piece)
                self._since_break = False
                continue
            for part in _LINE_BREAKS.split(piece.replace(LINE_BREAK, "\n")):
                if _LINE_BREAKS.fullmatch(part):
                    out += self._line_end()
                elif part:
                    out += self._line_text(part)
        return out

    def _line_text(self, text: str) -> list[IntakeItem]:
        if self._head is None:
            return self._accept(self._words.push(text))
        self._head += text
        first = self._head.split(maxsplit=1)[0] if self._head.strip() else ""
        complete = bool(re.match(r"\s*\S+\s", self._head)) or (
            _complete_now(first) and not _URL_LIKE.search(first))
        if complete or len(first) > _MARKER_CHARS:
            return self._release_head()  # the line's first word is complete, or too long to be a marker
        return []

    def _release_head(self) -> list[IntakeItem]:
        head, self._head = self._head, None
        if not head:
            return []
        return self._accept(self._words.push(_LIST_MARKER.sub(r"\1\2", head)))

    def _line_end(self) -> list[IntakeItem]:
        out = self._release_head()
        words = self._words.flush()
        if words and not ends_clause(words[-1]):
            words[-1] += "."  # the line ends a phrase: say it so
        out += self._accept(words) + self._norm.release()
        if self._since_break:
            out.append(Pause(0.0))
            self._since_break = False
        self._head = ""
        return out

    def _accept(self, words: list[str]) -> list[IntakeItem]:
        out: list[IntakeItem] = []
        for word in words:
            script = foreign_script(word, self.scripts)
            if script is None:
                out.append(self.lexicon.apply(word) if self.lexicon is not None else word)
                self._since_break = True
            else:
                out.append(Skipped(script, word))
        return self._norm.push(out)


def speech_in(text: str, scripts: frozenset[str] = LATIN) -> tuple[bool, list[Skipped]]:
    """Whether ``text`` (a whole reply or its start) holds a word a voice reading ``scripts``
    would speak, and the words it would leave out.

    >>> speech_in("👍 ..."), speech_in("<break time='1s'/>"), speech_in("Привет")[0], speech_in("1")
    ((False, []), (False, []), False, (True, []))
    """
    intake = TextIntake(scripts)
    items = intake.push(text) + intake.flush()
    return any(isinstance(item, str) for item in items), [item for item in items if isinstance(item, Skipped)]


def read_text(text: str, enabled: bool = True) -> str:
    """A whole text as the engines are given it: normalised words, each marked word replaced
    by its spoken form (tests and the WER check compare with this).

    >>> read_text("Call 555-0199 at 5pm.")
    'Call five five five, zero one nine nine at five PM.'
    """
    intake = TextIntake(normalise=enabled)
    items = intake.push(text) + intake.flush()
    return " ".join(said.split(w)[1] or w for w in items if isinstance(w, str))
