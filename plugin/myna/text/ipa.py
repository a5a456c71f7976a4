"""IPA as people write it → the phonemes a Piper voice knows (espeak-ng's conventions).

A Piper voice was trained on espeak-ng's IPA, one symbol (code point) per phoneme id, so IPA
copied from a dictionary, Wiktionary or an SSML example is misheard when handed over as it is
(``ˈbʌtər`` was heard "but it"; espeak writes ``bˈʌɾɚ``). :class:`IpaReader` rewrites a
``<phoneme alphabet="ipa">`` string (or a lexicon entry's IPA) into the voice's own notation:

- **notation**: slashes and brackets (``/…/``, ``[…]``), parentheses of optional sounds,
  syllable dots ``.``, linking ``‿`` and hyphens are removed; tie bars (``t͡ʃ``, ``t͜s``) and the
  ligatures ``ʧ ʤ ʦ ʣ ʨ ʥ`` become the two symbols espeak writes (``tʃ``, ``dʒ``…); ASCII
  ``g`` is the IPA ``ɡ`` (U+0261), ``'`` and ``:`` typed for ``ˈ`` and ``ː`` are those; the
  rhotic hook (``ə˞``, ``ɜ˞``) is the r-coloured vowel (``ɚ``, ``ɝ``); text is in Unicode NFD,
  as espeak's phonemes reach the voice (``ã`` is ``a`` + U+0303);
- **stress**: the IPA handbook puts ``ˈ``/``ˌ`` before the stressed *syllable* (``ˈbʌtər``),
  espeak-ng immediately before its *vowel* (``bˈʌtɚ``): each mark moves to the next vowel (or
  syllabic consonant, ``n̩``) of its word; the length mark ``ː`` stays right after its vowel
  (a doubled one is one);
- **English voices** (espeak ``en…``), the symbols espeak-ng's English writes: ``r`` is ``ɹ``,
  ``ɫ`` is ``l``, ``ʍ`` is ``w``; ``ər``/``ɚ``/``ə˞`` is ``ɚ`` and ``ɜr``/``ɝ``/``ɜːr`` is ``ɜː``
  (an ``ɹ`` kept before a vowel: ``ˈhɝi`` → ``hˈɜːɹi``; a voice other than ``en-us`` is not
  rhotic: ``ə``); the vowels dictionaries write short where espeak writes them long are long
  (``ɑ``, ``ɔ`` outside ``ɔɪ``, ``ɜ``; ``i``, ``u`` when stressed; ``ɒ`` is ``ɑː`` for en-us);
  ``e`` outside ``eɪ`` is ``ɛ``, ``o`` outside ``oʊ`` is ``oʊ``, ``a`` outside ``aɪ``/``aʊ`` is
  ``æ``; aspiration and other narrow diacritics (``ʰ``, ``̪``, ``̯``, ``ˑ``) are dropped; a word
  written without a stress mark is stressed on its first full vowel (espeak stresses every
  content word, monosyllables included: ``tʃɜrtʃ`` → ``tʃˈɜːtʃ``);
- **unknown symbols**: a code point the voice's ``phoneme_id_map`` lacks would be dropped by
  Piper with only a log line; it is left out and returned, so the turn can say so once
  (``phonemes_ignored``).

Sources: the *Handbook of the International Phonetic Association* (CUP, 1999: stress marks
before the syllable, ``ː``, tie bars, syllable dots) and the IPA chart (2020); espeak-ng's
phoneme notation as its ``--ipa`` output writes it (``docs/phonemes.md`` and the ``ph_english*``
tables of espeak-ng; stress before the vowel, ``ɹ``, ``ɚ``, ``ɜː``, ``tʃ`` without a tie), which is
what Piper's ``phonemize_espeak`` hands a voice; Unicode's IPA Extensions block for the
ligatures and the ASCII look-alikes.

Only Piper reads phonemes, so the reader is per voice (its ``phoneme_id_map`` and espeak
language): the DSM engine takes text and reads the written word (``phonemes_ignored``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

#: Code points of vowels (a syllable's nucleus), IPA chart and espeak-ng's extras.
VOWELS = frozenset("aeiouyæɐɑɒɔəɘɚɛɜɝɞɤɨɪɯɵøœɶʉʊʌʏᵻᵿ")
PRIMARY, SECONDARY, LONG = "ˈ", "ˌ", "ː"
_STRESS = frozenset((PRIMARY, SECONDARY))
_SYLLABIC = "\u0329"  # combining vertical line below: n̩, l̩
_SYLLABIC_ABOVE = "\u030d"

#: Code points removed: notation around or between phonemes, not phonemes.
_REMOVED = frozenset("/[]()⟨⟩{}.‿-\u0361\u035c\u2040")
#: One code point → what espeak-ng writes (any language).
_ANY = {
    "ʧ": "tʃ", "ʤ": "dʒ", "ʦ": "ts", "ʣ": "dz", "ʨ": "tɕ", "ʥ": "dʑ",
    "g": "ɡ", "'": PRIMARY, "\u2019": PRIMARY, "\u2032": PRIMARY, "\u00b4": PRIMARY,
    ":": LONG, "\ua789": LONG,
}
#: Pairs → one code point (any language): a vowel with a rhotic hook.
_PAIRS = {"ə˞": "ɚ", "ɜ˞": "ɝ"}
#: Modifiers that belong to the symbol before them (length, diacritics, secondary articulations).
_MODIFIERS = frozenset("ːˑ˞ʰʲʷˠˤⁿˡ̴ʼ")
#: Vowels an English dictionary writes short where espeak-ng's English writes them long.
_EN_LONG = frozenset("ɑɔɜ")
_EN_LONG_STRESSED = frozenset("iu")
#: Offglides that make a diphthong with the vowel before them.
_GLIDES = frozenset("ɪʊəɐ")
#: Reduced vowels: not where an unmarked word's stress goes.
_REDUCED = frozenset("əɚɐᵻ")
#: Diacritics of narrow transcriptions that espeak-ng's English never writes (aspiration,
#: dental, non-syllabic, half-long): dropped for English voices, which never learnt them.
_EN_NARROW = frozenset("ʰ\u032a\u032f\u02d1")

#: Normalised strings kept per reader (IPA repeats: a lexicon's entries, a turn's tags).
CACHE_SIZE = 1024


def _segments(word: str) -> list[str]:
    """``word`` cut into symbols: a base code point with the combining marks and modifiers after it."""
    out: list[str] = []
    for ch in word:
        if out and out[-1] not in _STRESS and (unicodedata.combining(ch) or ch in _MODIFIERS):
            out[-1] += ch
        else:
            out.append(ch)
    return out


def _is_nucleus(segment: str) -> bool:
    return segment[0] in VOWELS or _SYLLABIC in segment or _SYLLABIC_ABOVE in segment


def _next(segments: list[str], i: int) -> int:
    """The index of the first symbol after ``segments[i]`` that is no stress mark (``len``: none)."""
    j = i + 1
    while j < len(segments) and segments[j] in _STRESS:
        j += 1
    return j


#: English: a consonant spelt as another language would → espeak-ng's English one.
_EN_CONSONANTS = {"r": "ɹ", "ɫ": "l", "ʍ": "w"}


def _english(segments: list[str], american: bool = True) -> list[str]:
    """espeak-ng's English symbols for one word's segments (see the module docstring);
    ``american``: en-us (no ``ɒ``: it is ``ɑː``); other English is not rhotic (``ər``, ``ɚ``: ``ə``)."""
    segs = [s if s in _STRESS else _EN_CONSONANTS.get(s[0], s[0]) + "".join(c for c in s[1:] if c not in _EN_NARROW)
            for s in segments]
    if american:
        segs = ["ɑ" + LONG + s[1:].replace(LONG, "") if s[0] == "ɒ" else s for s in segs]
    out: list[str] = []
    stressed = False  # a stress mark came, and its vowel has not yet
    i = 0
    while i < len(segs):
        seg = segs[i]
        if seg in _STRESS:
            stressed = True
            out.append(seg)
            i += 1
            continue
        base, rest = seg[0], seg[1:].replace("˞", "")
        j = _next(segs, i)
        after = segs[j][0] if j < len(segs) else ""
        then = _next(segs, j)
        r_coda = after == "ɹ" and not (then < len(segs) and _is_nucleus(segs[then]))  # ər, ɜr: no vowel after
        if base in "ɜɝɚ" or (base == "ə" and r_coda):
            seg = ("ɜ" + LONG if base in "ɜɝ" else "ɚ" if american else "ə") + rest.replace(LONG, "")
            if r_coda:
                del segs[j]  # (the r is the vowel's colour)
            elif base in "ɝɚ" and after and _is_nucleus(segs[j]):
                seg += "ɹ"  # ˈhɝi: hˈɜːɹi
        elif base in _EN_LONG and LONG not in rest and after not in _GLIDES:
            seg = base + rest + LONG
        elif base in _EN_LONG_STRESSED and stressed and LONG not in rest and after not in _GLIDES:
            seg = base + rest + LONG
        elif base == "e" and after not in ("ɪ", "i"):
            seg = "ɛ" + rest
        elif base == "o" and after not in ("ʊ", "ɪ", "u"):
            seg = "oʊ" + rest
        elif base == "a" and after not in ("ɪ", "ʊ", "i", "u"):
            seg = "æ" + rest
        if _is_nucleus(seg):
            stressed = False
        out.append(seg)
        i += 1
    return out


def _stressed_if_unmarked(segments: list[str]) -> list[str]:
    """A word with no stress mark, stressed on its first full vowel (not ``ə ɚ ɐ ᵻ``), as
    espeak-ng's English stresses every content word; a word of reduced vowels stays as it is."""
    if any(seg in _STRESS for seg in segments):
        return segments
    for i, seg in enumerate(segments):
        if seg[0] in VOWELS and seg[0] not in _REDUCED:
            return segments[:i] + [PRIMARY] + segments[i:]
    return segments


def _placed(segments: list[str]) -> list[str]:
    """Stress marks moved to right before the next nucleus (a mark with none after it is
    dropped; ``ˈ`` wins over ``ˌ`` where both come); a doubled length mark is one."""
    out: list[str] = []
    pending = ""
    for seg in segments:
        if seg in _STRESS:
            pending = PRIMARY if PRIMARY in (pending, seg) else seg
            continue
        if LONG + LONG in seg:
            seg = seg.replace(LONG + LONG, LONG)
        if pending and _is_nucleus(seg):
            out.append(pending)
            pending = ""
        out.append(seg)
    return out


class IpaReader:
    """Rewrites IPA into one voice's phonemes (see the module docstring).

    Args:
        symbols: the voice's phoneme symbols (its config's ``phoneme_id_map`` keys); None: any
            symbol is kept.
        language: the voice's espeak-ng language (``en-us``; its config's ``espeak.voice``):
            English voices get espeak-ng's English symbols.

    >>> IpaReader(language="en-us").read("/ˈbʌtər/")
    ('bˈʌtɚ', frozenset())
    """

    def __init__(self, symbols: Iterable[str] | None = None, language: str | None = "en-us"):
        self.symbols = frozenset(symbols) if symbols is not None else None
        self.language = (language or "").lower().replace("_", "-")
        self.english = self.language.split("-")[0] == "en"
        self.american = self.english and self.language in ("en", "en-us")
        self._cache: dict[str, tuple[str, frozenset[str]]] = {}

    def read(self, ipa: str) -> tuple[str, frozenset[str]]:
        """``(phonemes, unknown)``: ``ipa`` in the voice's notation, and the symbols left out
        because the voice has no phoneme for them (empty: none). Words stay apart (one space)."""
        got = self._cache.get(ipa)
        if got is None:
            got = self._read(ipa)
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[ipa] = got
        return got

    def _read(self, ipa: str) -> tuple[str, frozenset[str]]:
        text = unicodedata.normalize("NFD", ipa)
        for pair, one in _PAIRS.items():
            text = text.replace(pair, one)
        text = "".join(_ANY.get(ch, ch) for ch in text if ch not in _REMOVED)
        words = []
        for word in text.split():
            segments = _segments(word)
            if self.english:
                segments = _english(_stressed_if_unmarked(segments), american=self.american)
            words.append("".join(_placed(segments)))
        phonemes = " ".join(w for w in words if w)
        if self.symbols is None:
            return phonemes, frozenset()
        unknown = frozenset(ch for ch in phonemes if ch not in self.symbols and ch != " ")
        if unknown:
            phonemes = " ".join(w for w in ("".join(ch for ch in word if ch not in unknown)
                                            for word in phonemes.split()) if w)
        return phonemes, unknown


_ENGLISH = IpaReader(language="en-us")


def normalise(ipa: str, language: str | None = "en-us") -> str:
    """``ipa`` in espeak-ng's notation for ``language`` (any symbol kept): ``ˈbʌtər`` → ``bˈʌtɚ``.

    >>> normalise("təˈmeɪtoʊ")
    'təmˈeɪtoʊ'
    """
    reader = _ENGLISH if language == "en-us" else IpaReader(language=language)
    return reader.read(ipa)[0]
