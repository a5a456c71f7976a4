"""Symbols: turn agent text (markdown, emoji, URLs) into words a TTS can speak: which symbols
are kept and which dropped (the spoken forms of numbers, dates and addresses are
:mod:`myna.text.normaliser`'s).

Everything works on one whitespace-free *raw word* at a time, so the streaming segmenter
(:mod:`myna.text.segment`) and the whole-text :func:`normalise` give the same words.

What is kept:
- letters, digits and combining marks (a mark only on a kept letter or digit);
- clause and sentence punctuation ``. , ; : ! ?``, quotes and apostrophes (``' " ‘ ’ “ ” « »``),
  ``… — – ¿ ¡``, so ``3.14``, ``10:30``, ``5,000``, ``don't`` and ``"Hi,"`` survive;
- ``-`` inside a word (``well-known``, ``5-6``, ``$10-$20``) and before a number (``-5``); a
  spaced ``-`` after a word with a digit, ``AM``/``PM`` or a day or month name is a range's
  dash (``$10 - $20`` → ``$10–`` ``$20``); ``/`` between
  digits (``1/2``); ``&`` and ``@`` between letters (``AT&T``, emails); a lone ``&`` becomes ``and``;
- ``%``, ``°`` and the currency signs espeak-ng reads aloud in English (``$ ¢ £ ¥ € ₹ ₨ ₩``):
  ``$5`` is "five dollars" to the front-end. Other currency signs (``₿``, ``₽``…) are silent
  there, so they are dropped like any other symbol.

What is dropped:
- every other symbol (Unicode categories ``S*``) and punctuation: emoji, ZWJ sequences,
  variation selectors, skin-tone modifiers, regional-indicator flags, keycaps (``1️⃣`` as a
  whole), arrows, math signs, brackets, ``* _ ~ # > | ` \\``;
  a dropped run inside a word becomes a space (``snake_case`` → ``snake case``, ``a😀b`` →
  ``a b``) unless closing punctuation follows it (``Hi👋,`` → ``Hi,``) or it ends the word;
- invisible format characters (ZWJ, soft hyphen, zero-width space, BOM);
- markdown syntax, keeping its words: emphasis markers, inline code and code fences (the
  fence line's language tag is dropped too), headings, list bullets, block quotes, table bars,
  rules, simple HTML tags (``<br>``), link and image targets (``[text](url)`` → ``text``,
  ``![alt](src)`` → ``alt``; a link whose text spans several words works word by word);
- URLs lose their scheme, ``www.``, user, port, query and fragment, and keep a short path (two
  segments at most, 30 characters, letters, digits and ``. _ - ~``; a longer one is dropped):
  ``https://www.acme.com/returns?id=5`` → ``acme.com/returns``,
  ``https://docs.python.org/3/library/re.html`` → ``docs.python.org``: enough for a listener
  to know where to go, without reading out long paths and query strings. A web address
  without a scheme (``acme.com/help``, a known top-level domain) is kept whole too; the
  normaliser (:mod:`myna.text.readings`) reads it "acme dot com slash help". E-mail addresses
  are kept whole (``sam_lee@mail.com``).
- ``+`` and ``#`` opening a word before a digit (``+44``, ``#48213``) are kept: "plus", "number".
"""

from __future__ import annotations

import re
import unicodedata

# Punctuation kept wherever it occurs in a word.
_KEEP = frozenset(".,;:!?'\"‘’“”«»…—–¿¡%°")
# Currency signs espeak-ng speaks in English ("$5" -> "five dollars").
CURRENCY = frozenset("$¢£¥€₹₨₩")
# Characters that end a clause when they end a word (see :func:`ends_clause`).
_CLAUSE_END = frozenset(",;:.!?…—–")
# Closing quotes/brackets that may follow the clause punctuation: 'said,"' or 'done.)'.
_CLOSERS = "\"'’”»)]}"
# Punctuation that closes what precedes it: no space before it where symbols were dropped.
_TRAILING = _CLAUSE_END | frozenset(")]}’”»%°")
# Pure punctuation that may attach to the previous word ("wait ..." -> "wait...").
_ATTACHABLE = _CLAUSE_END | frozenset(_CLOSERS) | frozenset("%")
# Variation selectors (emoji/text presentation), dropped even though they are marks.
_DIGIT = re.compile(r"\d")
# Words that may end a range's first side besides numbers: "9 AM - 5 PM", "Mon - Fri".
_RANGE_ENDS = frozenset("am pm monday tuesday wednesday thursday friday saturday sunday mon tue tues wed "
                        "thu thur thurs fri sat sun january february march april may june july august september "
                        "october november december jan feb mar apr jun jul aug sep sept oct nov dec".split())
_VARIATION = re.compile(r"[\ufe00-\ufe0f\U000e0100-\U000e01ef]")

_FENCE = re.compile(r"^(```|~~~)")
_KEYCAP = re.compile(r"[0-9#*]\ufe0f?\u20e3")
_LINK_TARGET = re.compile(r"\]\((?:[^()\s]|\([^()\s]*\))*\)")  # "](url)", one level of (...)
_REF_TARGET = re.compile(r"\]\[[^\]\s]*\]")  # "][ref]"
_HTML_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*\s*/?>")
_URL = re.compile(
    r"(?:(?:https?|ftp)://|www\.)"
    r"([^\s/?#<>()\[\]]+?)"  # authority (user@host:port), lazy so trailing "." stays outside
    r"([/?#][^\s<>()\[\]]*?)?"  # path, query, fragment
    r"(?=[.,;:!?'\"]*(?:$|[\s<>()\[\]]))",
    re.IGNORECASE,
)
#: Top-level domains that make ``name.tld`` a web address without a scheme.
WEB_DOMAINS = frozenset("com org net edu gov io ai dev app co uk us de fr ca au info biz me tv ly gg xyz eu nl es "
                        "it ch se no in jp cn ru br mx nz ie be at dk fi pl pt shop store online site tech cloud".split())
_WEB_WORD = re.compile(r"^(?P<lead>[\"'“‘«(\[<]*)"
                       r"(?P<web>(?P<host>(?:[A-Za-z0-9-]+\.)+(?P<tld>[A-Za-z]{2,6}))(?:/[A-Za-z0-9._~-]+)*/?)"
                       r"(?P<trail>[.,;:!?…\"'”’»)\]>]*)$")
_EMAIL_WORD = re.compile(r"^(?P<lead>[\"'“‘«(\[<]*)(?P<mail>[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)"
                         r"(?P<trail>[.,;:!?…\"'”’»)\]>]*)$")
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._~-]+")
#: The longest URL path kept (segments, characters).
URL_PATH_SEGMENTS, URL_PATH_CHARS = 2, 30


def has_speech(text: str) -> bool:
    """True when ``text`` contains a letter or a digit, i.e. something a TTS can say.

    >>> has_speech("3.14"), has_speech("..."), has_speech("")
    (True, False, False)
    """
    return any(ch.isalnum() for ch in text)


def ends_clause(word: str) -> bool:
    """True when ``word`` ends with clause or sentence punctuation.

    Closing quotes and brackets after the punctuation are skipped.

    >>> ends_clause('said,"'), ends_clause("3.14"), ends_clause("dogs'")
    (True, False, False)
    """
    core = word.rstrip(_CLOSERS)
    return bool(core) and core[-1] in _CLAUSE_END


def normalise_word(word: str) -> str:
    """Normalise one raw word (a run of text without whitespace) for speech.

    Args:
        word: raw text between two whitespace runs, markdown and emoji included.

    Returns:
        The spoken form: ``""`` when nothing is left, punctuation only (e.g. ``"..."``) when
        nothing speakable is left (check with :func:`has_speech`), and occasionally several
        words separated by single spaces (``"snake_case"`` → ``"snake case"``).

    >>> normalise_word("**bold**"), normalise_word("[docs](https://x.y/z)."), normalise_word("👍")
    ('bold', 'docs.', '')
    >>> normalise_word("$3.50,"), normalise_word("https://www.example.com/a?b=1")
    ('$3.50,', 'example.com/a')
    """
    if _FENCE.match(word):
        return ""
    text = unicodedata.normalize("NFC", word).replace("\u2212", "-")  # (U+2212 MINUS SIGN: "−5" is "-5")
    text = _KEYCAP.sub("", text)
    text = _HTML_TAG.sub(" ", text)
    text = _LINK_TARGET.sub("", text).replace("![", "[")
    text = _REF_TARGET.sub("", text)
    text = _URL.sub(_url_host, text)
    if (web := _WEB_WORD.match(text)) and web["tld"].lower() in WEB_DOMAINS and re.search("[A-Za-z]", web["host"]):
        return _filter_chars(web["lead"]) + web["web"].rstrip("/") + _filter_chars(web["trail"])
    if mail := _EMAIL_WORD.match(text):  # kept whole: "sam_lee@mail.com" (the normaliser says "_")
        return _filter_chars(mail["lead"]) + mail["mail"] + _filter_chars(mail["trail"])
    text = re.sub(r"(?<!-)--(?!-)", "—", text)  # ASCII em dash
    text = _VARIATION.sub("", text)
    text = _filter_chars(text)
    return "and" if text == "&" else text


def normalise(text: str) -> str:
    """Normalise a whole text: the words :class:`myna.text.WordSegmenter` would produce.

    Whitespace (tabs, newlines, NBSP…) is collapsed to single spaces; a word that is only
    punctuation joins the word before it (``"wait ..."`` → ``"wait..."``) or is dropped.

    Returns:
        The normalised text, ``""`` when there is nothing speakable in it.

    >>> normalise("# Title\\n\\n- **Hi** there 👋 ...\\tsee [the docs](https://x.y)")
    'Title Hi there... see the docs'
    """
    words: list[str] = []
    is_open = False
    for raw in text.split():
        is_open = append_word(words, raw, is_open)
    return " ".join(words)


def append_word(words: list[str], raw: str, is_open: bool) -> bool:
    """Normalise ``raw`` and add its words to ``words`` (the shared step of the segmenters).

    Args:
        words: the words so far; appended to, and its last item may grow punctuation.
        raw: one raw word.
        is_open: whether ``words[-1]`` may still take trailing punctuation.

    Returns:
        Whether ``words[-1]`` may still take trailing punctuation: true after a speakable word
        that does not end a clause, false once a raw word with a letter or digit follows it.
    """
    if raw in ("-", "–") and is_open and (_DIGIT.search(words[-1]) or words[-1].lower() in _RANGE_ENDS):
        words[-1] += "–"  # "$10 - $20", "9 AM - 5 PM", "Monday - Friday": a range's dash ("to")
        return False
    if has_speech(raw):
        is_open = False
    for piece in normalise_word(raw).split():
        if has_speech(piece):
            words.append(piece)
            is_open = not ends_clause(piece)
        elif is_open and all(ch in _ATTACHABLE for ch in piece):
            words[-1] += piece
            is_open = not ends_clause(words[-1])
    return is_open


def _url_host(match: re.Match[str]) -> str:
    host = match.group(1).rsplit("@", 1)[-1].split(":", 1)[0]
    host = host[4:] if host.lower().startswith("www.") else host
    path = re.split(r"[?#]", match.group(2) or "", maxsplit=1)[0]
    segments = [p for p in path.split("/") if p]
    if segments and len(segments) <= URL_PATH_SEGMENTS and len("/".join(segments)) <= URL_PATH_CHARS \
            and all(_PATH_SEGMENT.fullmatch(p) for p in segments):
        return host + "/" + "/".join(segments)
    return host


def _filter_chars(text: str) -> str:
    """Keep letters, digits, their marks and the kept punctuation; see the module docstring."""
    out: list[str] = []
    gap = False  # a visible character was dropped since the last kept one
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        prev = out[-1] if out else ""
        nxt = text[i + 1] if i + 1 < len(text) else ""
        if cat[0] == "C":  # format/control/unassigned: invisible, dropped silently
            continue
        if cat[0] == "M":  # combining mark: only on a kept base character (keycap "⃣" never)
            if cat != "Me" and prev and not gap and (prev.isalnum() or unicodedata.category(prev)[0] == "M"):
                out.append(ch)
            continue
        if not (ch.isalnum() or _keep_punct(ch, " " if gap else prev, nxt)):
            gap = True
            continue
        if gap and out and ch not in _TRAILING:
            out.append(" ")  # "a😀b" -> "a b", "print('x')" -> "print 'x'", but "Hi👋," -> "Hi,"
        out.append(ch)
        gap = False
    return "".join(out).strip()


def _keep_punct(ch: str, prev: str, nxt: str) -> bool:
    """Whether a non-alphanumeric character is kept, given its kept neighbour and the next one."""
    if ch in _KEEP or ch in CURRENCY:
        return True
    if ch == "-":
        if (prev.isalnum() and nxt in CURRENCY) or (prev == "%" and nxt.isdigit()):
            return True  # a range of amounts: "$10-$20", "$1k-$2k", "10%-20%"
        return nxt.isalnum() and (prev.isalnum() or (prev in ("", *CURRENCY) and nxt.isdigit()))
    if ch == "/":
        return prev.isdigit() and nxt.isdigit()
    if ch in "+#":
        return prev in ("", " ") and nxt.isdigit()
    if ch in "&@":
        return (prev.isalnum() and nxt.isalnum()) or (ch == "&" and not prev and not nxt)
    return False
