"""Say it right: numbers, prices, years, Roman numerals and abbreviations in words, with context.

The Piper voice's front end (espeak-ng) reads ``"$500"`` as "dollar five hundred", ``"1920"``
as "nineteen hundred twenty", ``"Jr."`` as "jay ar", ``"World War II"`` as "world war roman two",
and ends a sentence (a pause, a falling tone) at every ``"Mr."`` or ``"T."`` followed by a
capital. :func:`verbalise` rewrites one unit's words before the voice sees them; the written
words stay what captions show. Number words come from ``num2words``; what is ours is the
context: which number is a year, which Roman numeral is a numeral, which full stop is not a
sentence end.

- Prices: ``$500`` → "five hundred dollars", ``$12.75`` → "twelve dollars and seventy-five
  cents", ``€3,50`` → "three euros and fifty cents", ``$1.5M`` / ``$1.5 million`` → "one point
  five million dollars", ``-$5`` → "minus five dollars", ``50¢`` → "fifty cents", ``$5-10`` →
  "five to ten dollars".
- Years: a four-digit number from 1000 to 2099 is read as a year ("nineteen twenty") unless it
  counts something: followed by a plural noun (``"1920 people"``, ``"2000 goals"``) or after a word that
  introduces a quantity (``"about 1500"``); after a year word (``"in"``, ``"since"``, a month…)
  it is always a year. Decades (``1920s``, ``'90s``) and ranges (``1914-1918``) too. Other
  numbers, negatives and decimals (``-5``, ``3.14``) are left to the voice, which reads them
  right.
- Roman numerals after a word that numbers things (``World War II``, ``Part III``, ``Chapter
  IV``, ``World War I``) are cardinals ("two"); after a monarch's or pope's name (``Henry
  VIII``) ordinals ("the Eighth"), ``I`` excepted; a numeral of ``I``, ``V`` and ``X`` of two
  letters or more after another capitalised word is a title's number (``Rocky II``, ``Final
  Fantasy VII``). Nowhere else is a numeral read as one: ``I`` alone is the pronoun, ``DC``,
  ``XL`` and ``MIX`` are letters and words, ``IV`` and ``VI`` after a capital may be letters.
- Abbreviations the voice misreads (``Jr.`` "junior", ``vs.`` "versus", ``No. 5`` "number
  five", ``Sgt.`` "Sergeant"…) are spelled out.
- A full stop that does not end a sentence (pysbd, :mod:`myna.text.sentences`) is dropped, so
  ``"Mr. Smith"``, ``"James T. Kirk"`` and ``"U.S. Army"`` are one sentence to the voice (it
  pauses and falls in pitch at every stop it sees before a capital).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from num2words import num2words

from myna.text.sentences import is_boundary

#: Currency signs → (unit, units, subunit, subunits); None: no subunit in speech.
CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "US$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", None, None),
    "₹": ("rupee", "rupees", "paisa", "paise"),
    "₨": ("rupee", "rupees", "paisa", "paise"),
    "₩": ("won", "won", None, None),
}
_SCALES = {"k": "thousand", "m": "million", "mn": "million", "b": "billion", "bn": "billion", "t": "trillion",
           "thousand": "thousand", "million": "million", "billion": "billion", "trillion": "trillion"}

#: Words after which a four-digit number is a year.
YEAR_CUES = frozenset(
    "in since from until till by during before after circa c. year years born died founded built "
    "early late mid spring summer autumn fall winter of to and through between "
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
#: Words after which a number is a quantity, not a year.
COUNT_CUES = frozenset("about over under nearly almost approximately exactly only than some around total just".split())
_ERAS = frozenset({"bc", "ad", "bce", "ce", "b.c.", "a.d."})
# Words ending in "s" that are not plural nouns (a year can come before them).
_NOT_PLURAL = frozenset("was is has does this its his as us yes plus thus always perhaps across unless less news "
                        "series species whereas".split())
_IRREGULAR_PLURALS = frozenset("people men women children feet teeth mice geese persons staff cattle".split())

#: Words after which a Roman numeral is a cardinal number ("Part II" → "Part two").
NUMBERING_WORDS = frozenset(
    "war part chapter act book volume vol phase episode article section stage level round scene season "
    "bowl apollo title canto appendix grade class type step psalm unit".split()
)
#: Names after which a Roman numeral is a regnal ordinal ("Henry VIII" → "Henry the Eighth").
REGNAL_NAMES = frozenset(
    "henry edward george william richard charles james louis elizabeth mary john paul pius leo benedict "
    "gregory innocent clement urban boniface alexander peter frederick philip ferdinand nicholas "
    "catherine anne constantine ramesses ivan gustav napoleon victor emmanuel alfonso felipe juan carlos "
    "wilhelm friedrich otto rudolf francis sixtus julius stephen david robert malcolm alfred harold edmund "
    "ethelred matilda victoria amenhotep thutmose ptolemy cleopatra darius xerxes antiochus".split()
)
_ROMAN = re.compile(r"^(?=[MDCLXVI])M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})$")
_ROMAN_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
# Numerals that are as often letters with a meaning of their own ("an IV drip", "the VI editor").
_LETTERS_TOO = frozenset({"IV", "VI", "XX", "XXX"})

#: Abbreviations the voice misreads, by lowercase spelling without the final stop. Titles
#: (before a name), suffixes, company words and a few Latin ones.
ABBREVIATIONS = {
    "jr": "junior", "sr": "senior", "esq": "esquire",
    "mt": "Mount", "gen": "General", "gov": "Governor", "sen": "Senator", "rep": "Representative",
    "capt": "Captain", "lt": "Lieutenant", "sgt": "Sergeant", "rev": "Reverend", "fr": "Father",
    "hon": "Honorable", "prof": "Professor", "ms": "Miz",
    "inc": "incorporated", "corp": "corporation", "bros": "brothers",
    "vs": "versus", "approx": "approximately", "cf": "compare", "e.g": "for example", "i.e": "that is",
    "ph.d": "P H D", "wwi": "World War one", "wwii": "World War two",
}
#: Abbreviations spelled out only before a number ("No. 5", "Jan. 5").
NUMBER_ABBREVIATIONS = {
    "no": "number", "nos": "numbers", "jan": "January", "feb": "February", "apr": "April", "jun": "June",
    "jul": "July", "aug": "August", "sep": "September", "sept": "September", "oct": "October",
    "nov": "November", "dec": "December",
}

_SPLIT = re.compile(r"^(?P<lead>[\"'“‘«(\[{¿¡]*)(?P<core>.*?)(?P<trail>[.,;:!?…\"'”’»)\]}]*)$", re.DOTALL)
_MONEY = re.compile(
    r"^(?P<sign>[-−–]?)(?P<cur>US\$|[$€£¥₹₨₩])(?P<num>\d[\d,]*(?:\.\d+)?)(?P<mult>[kKmMbBtT]|bn|mn)?$"
    r"|^(?P<sign2>[-−–]?)(?P<num2>\d[\d,]*(?:\.\d+)?)(?P<cur2>[€£¢])$"
)
_MONEY_RANGE = re.compile(r"^(?P<cur>US\$|[$€£¥₹₨₩])(?P<a>\d[\d,]*(?:\.\d+)?)[-–](?:US\$|[$€£¥₹₨₩])?(?P<b>\d[\d,]*(?:\.\d+)?)$")
_YEAR = re.compile(r"^(?P<year>1\d{3}|20\d{2})(?P<s>s)?$")
_YEAR_RANGE = re.compile(r"^(?P<a>1\d{3}|20\d{2})[-–](?P<b>\d{2}|1\d{3}|20\d{2})$")
_DECADE = re.compile(r"^(?P<d>[1-9]0)s$")


def verbalise(words: list[str], previous: list[str] = ()) -> list[str]:
    """What the voice should read for each written word of one unit.

    Args:
        words: the unit's words, as written (punctuation attached).
        previous: the words spoken just before the unit (context for its first words).

    Returns:
        One spoken form per word, in order (a form may hold several words, never none).

    >>> verbalise("It costs $12.75 in 1920 , World War II".split())
    ['It', 'costs', 'twelve dollars and seventy-five cents', 'in', 'nineteen twenty', ',', 'World', 'War', 'two']
    >>> verbalise("Mr. Smith Jr. met James T. Kirk.".split())
    ['Mr', 'Smith', 'junior', 'met', 'James', 'T', 'Kirk.']
    """
    context = [*previous[-3:], *words]
    offset = len(context) - len(words)
    forms = []
    for i, word in enumerate(words):
        before, after = context[: offset + i], context[offset + i + 1 :]
        forms.append(_say(word, before, after[0] if after else None))
    return forms


def inner_stops(words: list[str], previous: list[str] = ()) -> list[bool]:
    """For each written word of one unit, whether its full stop ends no sentence (pysbd): the
    voice should not be given it, or it pauses and falls in pitch there (``Mr. Smith``).

    >>> inner_stops("Mr. Smith Jr. met James T. Kirk.".split())
    [True, False, True, False, False, True, False]
    """
    context = [*previous[-3:], *words]
    offset = len(context) - len(words)
    out = []
    for i, word in enumerate(words):
        before, after = context[: offset + i], context[offset + i + 1 :]
        trail = _SPLIT.match(word)["trail"]
        out.append(trail.startswith(".") and not trail.startswith("..") and bool(after)
                   and not is_boundary(word, after[0], before))
    return out


def drop_stop(form: str) -> str:
    """``form`` without the full stop its trailing punctuation starts with (``"Jr."`` → ``"Jr"``,
    ``'Mr.")'`` → ``'Mr")'``)."""
    parts = _SPLIT.match(form)
    trail = parts["trail"]
    return f"{parts['lead']}{parts['core']}{trail[1:]}" if trail.startswith(".") else form


def _say(word: str, before: list[str], nxt: str | None) -> str:
    parts = _SPLIT.match(word)
    lead, core, trail = parts["lead"], parts["core"], parts["trail"]
    prev = _bare(before[-1]) if before else ""
    spoken = (_money(core, nxt) or _scale_after_money(core, before) or _year(core, prev, nxt, before)
              or _roman(core, prev, before) or _abbreviation(core, trail, nxt))
    if spoken is None:
        spoken = core
    if trail.startswith(".") and not trail.startswith("..") and nxt is not None and not is_boundary(word, nxt, before):
        trail = trail[1:]  # not a sentence end: no stop for the voice to pause at
    return f"{lead}{spoken}{trail}"


def _bare(word: str) -> str:
    return word.strip("\"'“”‘’«»()[]{}.,;:!?…").lower()


def cardinal(number: int | Decimal) -> str:
    """``number`` in words, as one phrase (no commas): 1920 → "one thousand nine hundred and twenty"."""
    return num2words(number, lang="en").replace(",", "")


def year_words(year: int) -> str:
    """A year in words: 1920 → "nineteen twenty", 2005 → "two thousand and five"."""
    return num2words(year, lang="en", to="year").replace(",", "")


def _plural(words: str) -> str:
    head, _, last = words.rpartition(" ")
    last = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return f"{head} {last}" if head else last


# -- prices ----------------------------------------------------------------------------------
def _money(core: str, nxt: str | None) -> str | None:
    if r := _MONEY_RANGE.match(core):  # "$5-10" → "five to ten dollars"
        a, b = _amount(r["a"], r["cur"] == "€"), _amount(r["b"], r["cur"] == "€")
        if a is None or b is None or a % 1 or b % 1:
            return None  # (with cents each side is an amount: the normaliser's range reads them)
        return f"{cardinal(a)} to {cardinal(b)} {CURRENCIES[r['cur']][1]}"
    m = _MONEY.match(core)
    if not m:
        return None
    sign, cur, num, mult = (m["sign"], m["cur"], m["num"], m["mult"]) if m["cur"] else (m["sign2"], m["cur2"], m["num2"], None)
    amount = _amount(num, cur == "€")
    if amount is None:
        return None
    minus = "minus " if sign else ""
    if cur == "¢":
        return f"{minus}{cardinal(amount)} {'cent' if amount == 1 else 'cents'}"
    unit, units, sub, subs = CURRENCIES[cur]
    scale = _SCALES.get(mult.lower()) if mult else None
    if scale is None and nxt is not None and _bare(nxt) in _SCALES and len(_bare(nxt)) > 2:
        return f"{minus}{cardinal(amount)}"  # "$1.5 million": the unit follows the scale word
    if scale is not None:
        return f"{minus}{cardinal(amount)} {scale} {units}"
    whole = int(amount)
    fraction = amount - whole
    cents_text = num.replace(",", ".").rpartition(".")[2] if fraction else ""
    if fraction and (sub is None or len(cents_text) > 2):
        return f"{minus}{cardinal(amount)} {units}"
    cents = int(cents_text.ljust(2, "0")) if fraction else 0
    parts = []
    if whole or not cents:
        parts.append(f"{cardinal(whole)} {unit if whole == 1 else units}")
    if cents:
        parts.append(f"{cardinal(cents)} {sub if cents == 1 else subs}")
    return minus + " and ".join(parts)


def _scale_after_money(core: str, before: list[str]) -> str | None:
    """"million" after "$1.5": "million dollars"."""
    scale = _SCALES.get(core.lower())
    if scale is None or len(core) <= 2 or not before:
        return None
    m = _MONEY.match(_SPLIT.match(before[-1])["core"])
    if not m or m["mult"] or not m["cur"]:
        return None
    return f"{core} {CURRENCIES[m['cur']][1]}"


def _amount(num: str, decimal_comma: bool) -> Decimal | None:
    """The value of a written amount: "5,000" → 5000, "12.75" → 12.75, "3,50" (€) → 3.50."""
    if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", num):
        num = num.replace(",", "")
    elif decimal_comma and re.fullmatch(r"\d+,\d{1,2}", num):
        num = num.replace(",", ".")
    elif "," in num:
        return None
    try:
        return Decimal(num)
    except InvalidOperation:
        return None


# -- years -----------------------------------------------------------------------------------
def _year(core: str, prev: str, nxt: str | None, before: list[str]) -> str | None:
    if m := _DECADE.match(core):
        return _plural(cardinal(int(m["d"])))
    if m := _YEAR_RANGE.match(core):
        a, b = m["a"], m["b"]
        b = a[:2] + b if len(b) == 2 else b
        return f"{year_words(int(a))} to {year_words(int(b))}" if int(b) > int(a) else None
    m = _YEAR.match(core)
    if not m:
        return None
    year = int(m["year"])
    if m["s"]:
        return _plural(year_words(year))
    if before and _MONEY.match(_SPLIT.match(before[-1])["core"]):
        return None
    after = _bare(nxt) if nxt is not None else ""
    is_year = prev in YEAR_CUES or after in _ERAS or (
        prev not in COUNT_CUES and not _looks_plural(after)
    )
    return year_words(year) if is_year else None


def _looks_plural(word: str) -> bool:
    if word in _IRREGULAR_PLURALS:
        return True
    return len(word) > 3 and word.isalpha() and word.endswith("s") and word not in _NOT_PLURAL


# -- Roman numerals --------------------------------------------------------------------------
def _roman(core: str, prev: str, before: list[str]) -> str | None:
    if not _ROMAN.match(core) or not before:
        return None
    value = roman_value(core)
    if prev in NUMBERING_WORDS:
        return cardinal(value)  # "World War I" too; "I" anywhere else is the pronoun
    if len(core) >= 2 and prev in REGNAL_NAMES and before[-1][:1].isupper():
        return "the " + num2words(value, lang="en", to="ordinal").replace(",", "").title()
    if len(core) >= 2 and set(core) <= set("IVX") and core not in _LETTERS_TOO and before[-1][:1].isupper():
        return cardinal(value)  # a sequel or a title: "Rocky II", "Final Fantasy VII"
    return None


def roman_value(numeral: str) -> int:
    """The value of a valid uppercase Roman numeral: "XIV" → 14."""
    values = [_ROMAN_VALUES[ch] for ch in numeral]
    return sum(-v if i + 1 < len(values) and v < values[i + 1] else v for i, v in enumerate(values))


# -- abbreviations ---------------------------------------------------------------------------
def _abbreviation(core: str, trail: str, nxt: str | None) -> str | None:
    key = core.lower()
    dotted = trail.startswith(".")
    if key in ("e.g", "i.e", "ph.d") and not dotted:
        return None
    if key in ABBREVIATIONS and (dotted or key in ("vs", "jr", "sr", "wwi", "wwii")):
        return ABBREVIATIONS[key]
    if key in NUMBER_ABBREVIATIONS and nxt is not None and nxt[:1].isdigit():
        return NUMBER_ABBREVIATIONS[key]
    return None
