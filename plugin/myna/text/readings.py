"""How agent text is read aloud: one written word (with the words around it) → its spoken words.

:func:`read` is the rule book of the text front end's normaliser (:mod:`myna.text.normaliser`),
which every engine's words go through. It reads, in this order:

- phone numbers, digit by digit in their written groups, a pause (comma) between groups:
  ``555-123-4567``, ``(555) 123-4567``, ``+1 415 555 0100``, ``+44 20 7946 0958``,
  ``1-800-555-0199``, ``555.123.4567`` ("five five five, one two three, …"; ``0`` is "zero"; a
  group written as a word of its own ends with the pause when another follows);
- e-mail addresses and web addresses: ``jane.doe@acme.com`` "jane dot doe at acme dot com",
  ``acme.com/returns`` "acme dot com slash returns" (``-`` "dash", ``_`` "underscore"; a label
  without a vowel is spelled: ``hr@acme.io`` "H R at acme dot I O"; two-letter country domains
  are spelled, ``co`` and ``me`` said);
- dates: ISO ``2025-03-14`` and ``3/14/2025`` "March fourteenth, twenty twenty-five"; ``3/14``
  (month first, the US order; day first when the first number is over 12) where a date reads
  (:func:`_slash`: ``due 6/12``, ``from 6/1 to 6/5``), ``March 14``, ``14 March``, ``Mar. 14th``
  with the day as an ordinal;
- other slashes: ``24/7`` "twenty-four seven", ratings ``9/10`` "nine out of ten", fractions
  ``1/2``, ``5/16``, ``½`` and mixed numbers ``2 1/2`` "two and a half";
- ranges, each side read by these rules and "to" between (:func:`_range`: ``$10-$20``,
  ``10-20%``, ``9am-5pm``; a spaced dash too, :func:`opens_range`), ``Mon-Fri`` "Monday through
  Friday";
- street addresses (:func:`_address_word`): ``40 Oak Dr.`` "Drive" but ``Dr. Patel`` "Doctor",
  USPS street types and unit designators, ``Ft. Worth``, directionals;
- times: ``5:30pm``, ``5.30pm``, ``5:30 p.m.``, ``17:45``, ``9:05`` ("nine oh five"), ``10am``, ``12:00``
  ("twelve o'clock"), ``pm`` / ``a.m.`` after a time "PM" / "AM";
- units after a number (``10kg``, ``5 km``, ``2.5GB``, ``72°F``, ``30 mph``, ``500 ml``): the
  unit's name, singular after exactly one (``1 kg`` "one kilogram");
- ordinals (``21st`` "twenty-first"), percentages (``15%``, ``2.5 %``), version numbers
  (``v2.3.1``, ``version 2.3``, ``iOS 17.2``, ``Python 3.12``: each part a number, "point"
  between);
- codes, letter by letter and digit by digit (a dash is a pause): a word of four or more
  characters that mixes capitals and digits (``XK7-92QZ``, ``A1B2C3``), digits or capitals of
  three or more after a word that names a code (``order 48213``, ``code QZXTR``, ``#48213``
  "number four eight two one three"), a number of six or more digits, digit groups joined by
  dashes, three groups or more (``123-45-6789``, ``4111-1111-1111-1111``);
- prices, years, Roman numerals and abbreviations as :mod:`myna.text.verbalise` reads them;
- any other number in words: ``5,000`` "five thousand", ``3.14`` "three point one four",
  ``-5`` "minus five".

Letters are spoken as capitals separated by spaces (``"X K seven"``): the voices read a lone
capital as its name. Number words come from ``num2words``; the rest is ours (no maintained
library reads these in a stream: see the module docstring of :mod:`myna.text.normaliser`).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from num2words import num2words

from myna.text import verbalise as v

DIGITS = "zero one two three four five six seven eight nine".split()
MONTHS = ("January February March April May June July August September October November "
          "December").split()
_MONTH_OF = {m.lower(): i for i, m in enumerate(MONTHS, 1)} | {
    m.lower()[:3]: i for i, m in enumerate(MONTHS, 1)} | {"sept": 9}
WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday mon tue tues wed thu thur "
                     "thurs fri sat sun".split())
#: Words after which ``a/b`` is a date, not a fraction.
DATE_CUES = frozenset("on by until till from due before after since date dated expires expiry starting "
                      "ending effective ends starts deadline updated posted published released shipped "
                      "delivered received scheduled booked renewed born".split()) | WEEKDAYS
#: Nouns a date follows ("deadline 6/12", "your appointment is 6/12").
DATE_NOUNS = frozenset("date deadline appointment birthday delivery meeting anniversary arrival departure "
                       "checkout check-in renewal payment shipment".split())
_COPULAS = frozenset("is was are were be falls".split())
# Words between two dates of a range: "from 6/1 to 6/5" (a date only after a date).
_DATE_LINKS = frozenset("to and through thru or - – —".split())
# Denominators read as fractions without a date word ("1/2", "3/8", "5/16"); others are dates.
_DENOMINATORS = frozenset({2, 3, 4, 5, 6, 8, 10, 12, 16, 32, 64, 100})
# Scales read as ratings ("9/10" "nine out of ten").
_RATING_SCALES = frozenset({5, 10, 100})
# Denominators of a fraction without a cue: a reduced a/b of these is a fraction ("1/3", "3/8"),
# any other pair a date where it can be one ("6/12", "6/10": June).
_PLAIN_DENOMINATORS = frozenset({2, 3, 4, 8, 16, 32, 64})
# Words around a rating ("rate it 9/10", "a 9/10", "4/5 stars"; a plural noun after it too).
_RATING_CUES = frozenset("rate rated rating rates score scored scores a gave give gives got get gets "
                         "graded grade review reviewed".split())
_RATING_NEXT = frozenset("stars star rating score points overall".split())
# Measures a fraction comes before ("1/5 cup", "3/10 mile").
_MEASURES = frozenset("cup cups teaspoon teaspoons tsp tablespoon tablespoons tbsp inch inches mile miles pound "
                      "pounds lb lbs ounce ounces oz gallon gallons liter liters litre litres hour hours second "
                      "seconds minute minutes acre acres".split())
# Words after which 1/2 is "half" ("1/2 off", "1/2 an hour").
_HALF_BEFORE = frozenset("off price an a the way time dozen".split())
# Slashed pairs with a reading of their own.
_SAYINGS = {(24, 7): "twenty-four seven", (50, 50): "fifty-fifty", (9, 11): "nine eleven"}
_NUMBER_WORDS = frozenset("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                          "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
                          "eighty ninety hundred thousand million billion trillion oh o'clock point and minus".split())
_DASHED_SAYINGS = frozenset({(24, 7), (50, 50)})  # ("24-7" too; "9-11" is a range)
#: Words after which digits or capitals are a code, read one by one.
CODE_CUES = frozenset("order confirmation code reference ref ticket account booking reservation tracking "
                      "case id pin invoice number no # serial policy member claim flight room gate "
                      "extension ext otp passcode".split())
#: Words after which a decimal is a version number.
VERSION_CUES = frozenset("version v ver release update build python ios android windows macos node java "
                         "chrome firefox firmware api sdk ubuntu debian kernel php ruby go rust".split())
#: Units after a number: written (case-sensitive first, then lower case) → (singular, plural).
UNITS = {
    "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"), "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"),
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"),
    "in.": ("inch", "inches"), "yd": ("yard", "yards"),
    "l": ("liter", "liters"), "ml": ("milliliter", "milliliters"), "gal": ("gallon", "gallons"),
    "mph": ("mile per hour", "miles per hour"), "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "kb": ("kilobyte", "kilobytes"), "mb": ("megabyte", "megabytes"), "gb": ("gigabyte", "gigabytes"),
    "tb": ("terabyte", "terabytes"), "mbps": ("megabit per second", "megabits per second"),
    "gbps": ("gigabit per second", "gigabits per second"),
    "hz": ("hertz", "hertz"), "khz": ("kilohertz", "kilohertz"), "mhz": ("megahertz", "megahertz"),
    "ghz": ("gigahertz", "gigahertz"), "w": ("watt", "watts"), "kw": ("kilowatt", "kilowatts"),
    "kwh": ("kilowatt hour", "kilowatt hours"), "v": ("volt", "volts"), "mah": ("milliamp hour", "milliamp hours"),
    "ms": ("millisecond", "milliseconds"), "sec": ("second", "seconds"), "secs": ("second", "seconds"),
    "min": ("minute", "minutes"), "mins": ("minute", "minutes"), "hr": ("hour", "hours"), "hrs": ("hour", "hours"),
    "h": ("hour", "hours"),
    "°f": ("degree Fahrenheit", "degrees Fahrenheit"), "°c": ("degree Celsius", "degrees Celsius"),
    "°": ("degree", "degrees"), "f": ("degree Fahrenheit", "degrees Fahrenheit"),
    "c": ("degree Celsius", "degrees Celsius"),
}
# Units that are only units right after a number written with them or after "°" (not as a word alone).
_GLUED_ONLY = frozenset({"h", "f", "c", "in.", "m", "g", "l", "w", "v"})
#: Currency codes before or after an amount.
CURRENCY_CODES = {"usd": ("dollar", "dollars"), "eur": ("euro", "euros"), "gbp": ("pound", "pounds"),
                  "cad": ("Canadian dollar", "Canadian dollars"), "aud": ("Australian dollar", "Australian dollars"),
                  "jpy": ("yen", "yen"), "inr": ("rupee", "rupees"), "chf": ("Swiss franc", "Swiss francs")}
#: Street types (USPS Publication 28, Appendix C1) read in full after a street name.
STREET_TYPES = {
    "ave": "Avenue", "av": "Avenue", "blvd": "Boulevard", "rd": "Road", "ln": "Lane", "ct": "Court",
    "pl": "Place", "pkwy": "Parkway", "hwy": "Highway", "cir": "Circle", "ter": "Terrace", "trl": "Trail",
    "sq": "Square", "expy": "Expressway", "fwy": "Freeway", "cres": "Crescent", "aly": "Alley",
    "xing": "Crossing", "hts": "Heights", "pt": "Point", "plz": "Plaza", "tpke": "Turnpike", "rte": "Route",
    "ctr": "Center", "mtn": "Mountain", "grv": "Grove", "crk": "Creek", "hwys": "Highways", "cv": "Cove",
    "jct": "Junction", "sta": "Station", "vlg": "Village", "vly": "Valley", "vw": "View", "brg": "Bridge",
}
# Words before a capitalised "Dr."/"St." that make it a title ("The Dr. will see you").
_BEFORE_A_TITLE = frozenset("the a an your my our his her their this that see ask call dear".split())
# Street types that are also titles: (street, title).
_STREET_OR_TITLE = {"dr": ("Drive", "Doctor"), "st": ("Street", "Saint")}
#: Unit designators (USPS Publication 28, Appendix C2) read in full before their number.
UNIT_DESIGNATORS = {"apt": "Apartment", "ste": "Suite", "fl": "Floor", "flr": "Floor", "rm": "Room",
                    "bldg": "Building", "dept": "Department", "lvl": "Level"}
#: Directionals of an address.
DIRECTIONS = {"N": "North", "S": "South", "E": "East", "W": "West", "NE": "Northeast", "NW": "Northwest",
              "SE": "Southeast", "SW": "Southwest"}
# Words before a unit's (or room's) number: "12C" after them is no temperature.
_UNIT_NUMBER_CUES = frozenset(UNIT_DESIGNATORS) | frozenset("unit room suite apartment gate seat row platform "
                                                             "building floor level".split())
#: Words whose reading depends on the word after (the normaliser holds them for it).
NEEDS_NEXT = frozenset(_STREET_OR_TITLE) | frozenset(UNIT_DESIGNATORS) | {"ft"} | {d.lower() for d in DIRECTIONS}
#: How "am" and "pm" after a time are said.
AMPM_SAID = {"a": "AM", "p": "PM"}  # (a capital pair: the voices spell it, "A M" has Piper pause)
#: Two-letter country domains said as a word, not spelled.
_SAID_DOMAINS = frozenset({"co", "me"})
_FRACTIONS = {2: ("half", "halves"), 4: ("quarter", "quarters")}

_NUM = r"\d[\d,]*(?:\.\d+)?"
_PHONE = re.compile(r"^(?:\+?(?P<cc>\d{1,3})[-.\s]?)?(?:\((?P<pa>\d{3})\)\s?|(?P<a>\d{3})[-.])(?P<b>\d{3})[-.](?P<c>\d{4})$"
                    r"|^(?P<b7>\d{3})-(?P<c7>\d{4})$")
_PLUS = re.compile(r"^\+\d{1,3}$")
_E164 = re.compile(r"^\+\d{8,15}$")
_GROUP = re.compile(r"^\d{2,4}$")
_EMAIL = re.compile(r"^(?P<local>[A-Za-z0-9][A-Za-z0-9._%+-]*)@(?P<host>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)$")
_TLDS = frozenset("com org net edu gov io ai dev app co uk us de fr ca au info biz me tv ly gg xyz eu nl es it "
                  "ch se no in jp cn ru br mx nz ie be at dk fi pl pt shop store online site tech cloud".split())
_WEB = re.compile(r"^(?P<host>(?:[A-Za-z0-9-]+\.)+(?P<tld>[A-Za-z]{2,6}))(?P<path>(?:/[A-Za-z0-9._~%-]*)*)$")
_ISO_DATE = re.compile(r"^(?P<y>\d{4})-(?P<m>\d{2})-(?P<d>\d{2})$")
_SLASH_DATE = re.compile(r"^(?P<a>\d{1,2})/(?P<b>\d{1,2})(?:/(?P<y>\d{4}|\d{2}))?$")
_TIME = re.compile(r"^(?P<h>\d{1,2})(?::(?P<m>\d{2})|\.(?P<dm>\d{2})(?=[ap]))?(?P<ap>[ap]\.?m\.?)?$", re.IGNORECASE)
_AMPM = re.compile(r"^(?P<ap>[ap])\.?m\.?$", re.IGNORECASE)
_ORDINAL = re.compile(r"^(?P<n>\d+)(?:st|nd|rd|th)$", re.IGNORECASE)
_PERCENT = re.compile(rf"^(?P<sign>[-−]?)(?P<n>{_NUM})\s?%$")
_VERSION = re.compile(r"^(?P<v>[vV])?(?P<n>\d+(?:\.\d+)+)$|^[vV](?P<n1>\d+)$")
_NUMBER = re.compile(rf"^(?P<sign>[-−]?)(?P<n>{_NUM})$")
_WITH_UNIT = re.compile(rf"^(?P<sign>[-−]?)(?P<n>{_NUM})(?P<unit>°?[A-Za-z/]+\.?|°)$")
_CODE = re.compile(r"^#?(?=[A-Z0-9-]*\d)(?=[A-Z0-9-]*[A-Z])[A-Z0-9]+(?:-[A-Z0-9]+)*$")
_HASH_NUMBER = re.compile(r"^#(?P<n>[A-Z0-9-]+)$")
_CODE_CHARS = re.compile(r"^[A-Z0-9]+(?:-[A-Z0-9]+)*$")
_DIGITS_ONLY = re.compile(r"^\d+$")
_DIGIT_GROUPS = re.compile(r"^\d+(?:-\d+)+$")
_ANY_DIGIT = re.compile(r"\d")
_CLOCK_OR_RANGE = re.compile(r"\d{1,2}(?::\d{2})?(?:[-–]\d{1,2}(?::\d{2})?)?")
_DECIMAL_RATING = re.compile(r"^(?P<a>\d+(?:\.\d+)?)/(?P<b>\d+)$")
_RANGE = re.compile(r"^(?P<a>[^-–—]+)[-–—](?P<b>[^-–—]+)$")
_RANGE_SIDE = re.compile(r"^(?:US\$|[$€£¥₹₨₩])?\d")
_NUM_RANGE = re.compile(rf"^{_NUM}[-–](?P<n>{_NUM})$")
_VULGAR_FRACTIONS = {"½": (1, 2), "⅓": (1, 3), "⅔": (2, 3), "¼": (1, 4), "¾": (3, 4), "⅕": (1, 5), "⅛": (1, 8),
                     "⅜": (3, 8), "⅝": (5, 8), "⅞": (7, 8)}
_VULGAR = re.compile(rf"^(?P<n>\d+)?(?P<f>[{''.join(_VULGAR_FRACTIONS)}])$")
# Days and months by their names and abbreviations (ranges: "Mon-Fri").
_DAY_NAMES = {d: d.title() for d in "monday tuesday wednesday thursday friday saturday sunday".split()} | {
    "mon": "Monday", "tue": "Tuesday", "tues": "Tuesday", "wed": "Wednesday", "thu": "Thursday",
    "thur": "Thursday", "thurs": "Thursday", "fri": "Friday", "sat": "Saturday", "sun": "Sunday"} | {
    name: MONTHS[i - 1] for name, i in _MONTH_OF.items()}


class Context:
    """What the rules know around one word.

    Attributes:
        before: the written words before it in the turn, nearest last (a few are enough).
        nxt: the written word after it, or None when none is known (the end of the text so far).
        phone: the word before it was read as part of a phone number.
    """

    def __init__(self, before: list[str], nxt: str | None, phone: bool = False):
        self.before, self.nxt, self.phone = before, nxt, phone

    @property
    def prev(self) -> str:
        """The word before, bare and lower case (``""`` at the start)."""
        return bare(self.before[-1]) if self.before else ""

    @property
    def next(self) -> str:
        """The word after, bare and lower case (``""`` when none is known)."""
        return bare(self.nxt) if self.nxt is not None else ""


def bare(word: str) -> str:
    """``word`` without surrounding quotes, brackets and punctuation, in lower case."""
    return word.strip("\"'“”‘’«»()[]{}.,;:!?…").lower()


def read(word: str, context: Context) -> tuple[str | None, str]:
    """How to read one written word.

    Args:
        word: the written word (punctuation attached, no whitespace).
        context: the words around it (:class:`Context`).

    Returns:
        ``(spoken, kind)``: the spoken form of the word's core (its leading and trailing
        punctuation excluded; see :func:`split`), or None when the word is read as written;
        ``kind`` names the rule (``"phone"``, ``"email"``, ``"url"``, ``"date"``, ``"time"``,
        ``"unit"``, ``"ordinal"``, ``"percent"``, ``"version"``, ``"code"``, ``"money"``,
        ``"number"``, ``"word"``; ``"range"``: a word whose dash is said "to", :func:`opens_range`),
        ``""`` for a word read as written.

    >>> read("555-123-4567", Context([], None))
    ('five five five, one two three, four five six seven', 'phone')
    >>> read("5:30pm,", Context(["at"], "please"))
    ('five thirty PM', 'time')
    """
    lead, core, trail = split(word)
    if not core:
        return None, ""
    if core.isalpha() and not core.isupper() and not (context.before and _ANY_DIGIT.search(context.before[-1])):
        got = _classic(core, trail, context) or (None, "")  # an ordinary word: the fast path
        if not trail.startswith(_DASHES):
            return got
    else:
        got = next((g for rule in _RULES if (g := rule(core, trail, context)) is not None), (None, ""))
    if opens_range(word, context.nxt):
        if core.lower() in _DAY_NAMES:
            return f"{_DAY_NAMES[core.lower()]} through", "range"
        return f"{got[0] or core} {'and' if context.prev == 'between' else 'to'}", "range"
    return got


def opens_range(word: str, nxt: str | None) -> bool:
    """Whether ``word`` ends with a dash that opens a range with the word after (``$10–`` then
    ``$20``, ``9am–`` then ``5pm``): the dash is said "to" (the reader drops it)."""
    lead, core, trail = split(word)
    if not trail.startswith(_DASHES) or nxt is None:
        return False
    after = split(nxt)[1]
    return bool((_RANGE_SIDE.match(core) or _AMPM.match(core)) and _RANGE_SIDE.match(after)
                or (core.lower() in _DAY_NAMES and after.lower() in _DAY_NAMES))


def split(word: str) -> tuple[str, str, str]:
    """``(lead, core, trail)``: opening quotes/brackets, the word, closing punctuation."""
    m = _SPLIT.match(word)
    lead, core, trail = m["lead"], m["core"], m["trail"]
    if core.endswith((".m", ".M")) and trail.startswith("."):  # "p.m." keeps its last stop
        core, trail = core + ".", trail[1:]
    return lead, core, trail


_SPLIT = re.compile(r"^(?P<lead>[\"'“‘«(\[{¿¡]*)(?P<core>.*?)(?P<trail>[.,;:!?…–—\"'”’»)\]}]*)$", re.DOTALL)
_DASHES = ("–", "—")


# -- pieces ------------------------------------------------------------------------------------
def digits(text: str) -> str:
    """Each digit of ``text`` as a word: "0199" → "zero one nine nine"."""
    return " ".join(DIGITS[int(c)] for c in text if c.isdigit())


def spell(text: str) -> str:
    """A code one character at a time: letters as capitals, digits as words, ``-`` a pause."""
    groups = [" ".join(DIGITS[int(c)] if c.isdigit() else c.upper() for c in part if c.isalnum())
              for part in text.split("-")]
    return ", ".join(g for g in groups if g)


def number(text: str, sign: str = "") -> str | None:
    """A written number in words: "5,000" → "five thousand", "3.14" → "three point one four"."""
    amount = v._amount(text, False)
    if amount is None:
        return None
    whole, point, fraction = str(amount).partition(".")
    words = v.cardinal(int(whole)) + (f" point {digits(text.rpartition('.')[2])}" if point else "")
    return f"minus {words}" if sign else words


def _plural_after(text: str) -> bool:
    return v._amount(text, False) != 1


# -- rules: each (core, trail, context) → (spoken, kind) or None -------------------------------
def _phone(core: str, trail: str, c: Context):
    if m := _PHONE.match(core):
        if m["b7"]:
            return f"{digits(m['b7'])}, {digits(m['c7'])}", "phone"
        groups = [g for g in (m["cc"], m["pa"] or m["a"], m["b"], m["c"]) if g]
        head = f"plus {digits(m['cc'])}" if m["cc"] and core.startswith("+") else None
        parts = ([head] if head else []) + [digits(g) for g in (groups[1:] if head else groups)]
        return ", ".join(parts), "phone"
    if _E164.match(core):
        return f"plus {digits(core)}", "phone"
    # a number in groups, one word each ("+44 20 7946 0958", "(555) 123-4567"): a pause between
    more = c.nxt is not None and bool(_GROUP.match(bare(c.nxt).strip("()")) or _PHONE.match(bare(c.nxt)))
    pause = "," if more else ""
    if _PLUS.match(core) and more:
        return f"plus {digits(core)}{pause}", "phone"
    pa = core.strip("()")
    if c.phone and _GROUP.match(pa):
        return digits(pa) + pause, "phone"
    if re.fullmatch(r"\(\d{3}\)|\d{3}", core) and c.nxt is not None and _PHONE.match(bare(c.nxt)):
        return digits(core) + pause, "phone"
    return None


def _email(core: str, trail: str, c: Context):
    m = _EMAIL.match(core)
    if not m:
        return None
    return f"{_address(m['local'])} at {_host(m['host'])}", "email"


def _url(core: str, trail: str, c: Context):
    m = _WEB.match(core)
    if not m or m["tld"].lower() not in _TLDS or not re.search(r"[A-Za-z]", m["host"].split(".")[0]):
        return None
    path = [p for p in m["path"].split("/") if p]
    spoken = _host(m["host"])
    for part in path:
        spoken += " slash " + _address(part)
    return spoken, "url"


def _address(text: str) -> str:
    """A local part or a path segment: words, and ``. _ - + %`` said."""
    names = {".": "dot", "_": "underscore", "-": "dash", "+": "plus", "%": "percent", "~": "tilde"}
    out = []
    for piece in re.findall(r"[A-Za-z]+|\d+|[._+%~-]", text):
        if piece in names:
            out.append(names[piece])
        elif piece.isdigit():
            out.append(number(piece) if len(piece) <= 2 else digits(piece))
        else:
            out.append(_label(piece))
    return " ".join(out)


def _label(word: str) -> str:
    """A letter run: said as a word, or spelled when it has no vowel (``hr``, ``xyz``)."""
    if not re.search(r"[aeiouAEIOU]", word) or (len(word) <= 2 and word.isupper()):
        return " ".join(word.upper())
    return word.lower() if not word.isupper() or len(word) > 4 else " ".join(word)


def _host(host: str) -> str:
    labels = host.split(".")
    if labels[0].lower() == "www":
        labels = labels[1:]
    spoken = []
    for i, label in enumerate(labels):
        last = i == len(labels) - 1
        if last and len(label) == 2 and label.lower() not in _SAID_DOMAINS:
            spoken.append(" ".join(label.upper()))
        else:
            spoken.append(_address(label))
    return " dot ".join(spoken)


def _date(core: str, trail: str, c: Context):
    if m := _ISO_DATE.match(core):
        y, mo, d = int(m["y"]), int(m["m"]), int(m["d"])
        if 1 <= mo <= 12 and 1 <= d <= 31:
            return f"{MONTHS[mo - 1]} {_ordinal(d)}, {v.year_words(y)}", "date"
        return None
    if m := _SLASH_DATE.match(core):
        return _slash(int(m["a"]), int(m["b"]), m["y"], c)
    if (m := _DECIMAL_RATING.match(core)) and int(m["b"]) in _RATING_SCALES and Decimal(m["a"]) <= int(m["b"]):
        return f"{number(m['a'])} out of {v.cardinal(int(m['b']))}", "number"  # "4.5/5", "85/100"
    if _DIGITS_ONLY.match(core) or _ORDINAL.match(core):  # a day next to its month
        n = int(re.match(r"\d+", core).group())
        if 1 <= n <= 31 and (c.prev in _MONTH_OF and (c.prev != "may" or c.before[-1][:1] == "M")):
            return _ordinal(n), "date"
        if 1 <= n <= 31 and c.next in _MONTH_OF and c.next not in ("may", "mar") and c.nxt[:1].isupper():
            return f"the {_ordinal(n)} of", "date"
    return None


def _ordinal(n: int) -> str:
    return num2words(n, lang="en", to="ordinal")


def _fraction(a: int, b: int, mixed: bool = False) -> str:
    """``a/b`` as a fraction: "one half", "three quarters", "five eighths"; after a whole number
    (``mixed``: ``2 1/2``) "a half", "a third", "three quarters"."""
    if b in _FRACTIONS:
        name = _FRACTIONS[b][0 if a == 1 else 1]
    else:
        name = _ordinal(b) + ("" if a == 1 else "s")
    if a == 1:
        return f"a {name}" if mixed else f"one {name}"
    return f"{v.cardinal(a)} {name}"


def _slash(a: int, b: int, year: str | None, c: Context):
    """``a/b`` or ``a/b/year``: what a person reads there, in this order.

    A date with a year, after a date word, weekday or date noun (``due 6/12``, ``the deadline
    is 6/12``), after a range word that follows a date (``from 6/1 to 6/5``) or before "at";
    a saying (``24/7`` "twenty-four seven", ``50/50`` "fifty-fifty"); a mixed number after a
    whole one (``2 1/2`` "two and a half"); ``1/2 off`` "half"; a fraction before "of" or a
    measure (``3/5 of``, ``1/5 cup``) or a reduced one of :data:`_PLAIN_DENOMINATORS` (``2/3``,
    ``5/16``); a rating on a 5, 10 or 100 scale after a rating word, before a plural noun or
    where no date can be (``rate it 9/10``, ``9/10 dentists``, ``10/10``); else a date where
    one can be (``arrive 6/12``, ``12/25``), a fraction of a common denominator, or nothing.
    """
    month, day = (a, b) if a <= 12 else (b, a)
    is_date = 1 <= month <= 12 and 1 <= day <= 31
    if year is not None:
        if not is_date:
            return None
        full = int(year) if len(year) == 4 else 2000 + int(year)
        return f"{MONTHS[month - 1]} {_ordinal(day)}, {v.year_words(full)}", "date"
    if is_date and _dated(c, b):
        return f"{MONTHS[month - 1]} {_ordinal(day)}", "date"
    if (a, b) in _SAYINGS:
        return _SAYINGS[a, b], "number"
    fraction = 0 < a < b and b in _DENOMINATORS
    if fraction and c.before and _DIGITS_ONLY.match(c.before[-1]):
        return _fraction(a, b, mixed=True), "number"
    if (a, b) == (1, 2) and c.next in _HALF_BEFORE:
        return "half", "number"  # "1/2 off", "1/2 an hour"
    if fraction and (c.next == "of" or c.next in _MEASURES or (math.gcd(a, b) == 1 and b in _PLAIN_DENOMINATORS)):
        return _fraction(a, b), "number"
    rating_cue = any(bare(w) in _RATING_CUES for w in c.before[-3:])  # "rate the room 9/10"
    if b in _RATING_SCALES and a <= b and (rating_cue or v._looks_plural(c.next) or c.next in _RATING_NEXT
                                            or a == b or not is_date):
        return f"{v.cardinal(a)} out of {v.cardinal(b)}", "number"
    if is_date:
        return f"{MONTHS[month - 1]} {_ordinal(day)}", "date"
    if fraction:
        return _fraction(a, b), "number"
    return None


def _dated(c: Context, denominator: int) -> bool:
    """Whether the word after ``c.before`` is in a date's place: after a date word, or after a
    range word ("to", "and", "-") that follows a date."""
    if c.prev in DATE_CUES or c.prev in DATE_NOUNS or (c.next == "at" and denominator > 4):
        return True  # "due 6/12", "the deadline 6/12", "6/12 at noon"
    if c.prev in _COPULAS and len(c.before) >= 2 and bare(c.before[-2]) in DATE_NOUNS | DATE_CUES:
        return True  # "the deadline is 6/12"
    if c.prev in _DATE_LINKS and len(c.before) >= 2 and _SLASH_DATE.match(split(c.before[-2])[1]):
        earlier = Context(c.before[:-2], c.before[-1])
        return read(c.before[-2], earlier)[1] == "date"
    return False


def is_mixed_fraction(word: str | None) -> bool:
    """Whether ``word`` is the fraction of a mixed number when it follows a whole number
    (``1/2`` in ``2 1/2 cups``)."""
    m = _SLASH_DATE.match(split(word)[1]) if word else None
    return bool(m) and m["y"] is None and 0 < int(m["a"]) < int(m["b"]) and int(m["b"]) in _DENOMINATORS


def _time(core: str, trail: str, c: Context):
    if _AMPM.match(core):
        prev_core = split(c.before[-1])[1] if c.before else ""
        if _CLOCK_OR_RANGE.fullmatch(prev_core) and c.before[-1] == prev_core:
            return AMPM_SAID[_AMPM.match(core)["ap"].lower()], "time"
        return None
    m = _TIME.match(core)
    if not m or (m["m"] is None and m["ap"] is None):
        return None
    if m["dm"]:  # "5.30pm"
        m = _TIME.match(f"{m['h']}:{m['dm']}{m['ap']}")
    h = int(m["h"])
    if h > 24 or (m["ap"] and not 1 <= h <= 12) or (m["m"] and int(m["m"]) > 59):
        return None
    ampm = f" {AMPM_SAID[m['ap'][0].lower()]}" if m["ap"] else ""
    next_ampm = bool(_AMPM.match(c.next))
    if m["m"] is None or m["m"] == "00":
        spoken = v.cardinal(h) + ("" if ampm or next_ampm or m["m"] is None else " o'clock")
    elif m["m"].startswith("0"):
        spoken = f"{v.cardinal(h)} oh {DIGITS[int(m['m'][1])]}"
    else:
        spoken = f"{v.cardinal(h)} {v.cardinal(int(m['m']))}"
    return spoken + ampm, "time"


def _unit_name(unit: str, glued: bool) -> tuple[str, str] | None:
    key = unit.lower()
    if key not in UNITS or (not glued and key in _GLUED_ONLY and not unit.startswith("°")):
        return None
    if key in ("m", "mb", "gb", "kb", "tb") and unit in ("M",):
        return None  # "5M" is millions (money handles "$5M")
    return UNITS[key]


def _unit(core: str, trail: str, c: Context):
    if c.prev in _UNIT_NUMBER_CUES:
        return None  # "Apt 12C", "Room 3F": a unit's number, not degrees
    if (m := _WITH_UNIT.match(core)) and (names := _unit_name(m["unit"], True)):
        said = number(m["n"], m["sign"])
        if said is not None:
            return f"{said} {names[1] if _plural_after(m['n']) else names[0]}", "unit"
    if c.before:  # a unit after its number: "5 km"
        prev_core = split(c.before[-1])[1]
        if (pm := _NUMBER.match(prev_core) or _NUM_RANGE.match(prev_core)) and c.before[-1] == prev_core:
            names = _unit_name(core + ("." if core == "in" and trail.startswith(".") else ""), False)
            if names and core not in ("in", "m", "min") or (names and core == "min"):
                return names[1] if _plural_after(pm["n"]) else names[0], "unit"
            key = core.lower()
            if key in CURRENCY_CODES and core.isupper():
                cur = CURRENCY_CODES[key]
                return cur[1] if _plural_after(pm["n"]) else cur[0], "money"
    return None


def _ordinal_rule(core: str, trail: str, c: Context):
    if m := _ORDINAL.match(core):
        return _ordinal(int(m["n"])), "ordinal"
    return None


def _percent(core: str, trail: str, c: Context):
    if m := _PERCENT.match(core):
        said = number(m["n"], m["sign"])
        return (f"{said} percent", "percent") if said else None
    return None


def _version(core: str, trail: str, c: Context):
    m = _VERSION.match(core)
    if not m:
        return None
    if m["n1"]:
        return f"version {v.cardinal(int(m['n1']))}", "version"
    parts = m["n"].split(".")
    if not (m["v"] or len(parts) > 2 or c.prev in VERSION_CUES):
        return None
    spoken = " point ".join(v.cardinal(int(p)) for p in parts)
    return (f"version {spoken}" if m["v"] else spoken), "version"


def _code(core: str, trail: str, c: Context):
    if (m := _HASH_NUMBER.match(core)) and _CODE_CHARS.match(m["n"]):
        return f"number {spell(m['n'])}", "code"
    cued = c.prev in CODE_CUES or (c.prev == "is" and len(c.before) >= 2 and bare(c.before[-2]) in CODE_CUES)
    if _CODE.match(core) and len(core.replace("-", "")) >= 4 and not _ORDINAL.match(core):
        return spell(core), "code"
    if cued and _CODE_CHARS.match(core) and len(core.replace("-", "")) >= 3 and (
            not core.isdigit() or len(core) >= 4) and not (core.isalpha() and re.search(r"[AEIOU]", core) and len(core) <= 4):
        return spell(core), "code"
    if _DIGITS_ONLY.match(core) and len(core) >= 6:
        return digits(core), "code"
    if _DIGIT_GROUPS.match(core) and core.count("-") >= 2:
        return spell(core), "code"  # "123-45-6789", "4111-1111-1111-1111": digit by digit, a pause between groups
    if re.fullmatch(r"\d{5}", core) and not v._looks_plural(c.next):
        return digits(core), "code"  # a ZIP code, an order number
    return None


def _money(core: str, trail: str, c: Context):
    spoken = v._money(core, c.nxt) or v._scale_after_money(core, c.before)
    if spoken and c.prev == "between":
        spoken = spoken.replace(" to ", " and ", 1)  # "between $5-$10": "between five and ten dollars"
    return (spoken, "money") if spoken else None


def _address_word(core: str, trail: str, c: Context):
    """Street types, unit designators, directionals and the titles that share their letters,
    decided by their neighbours (USPS Publication 28's suffix and unit abbreviations):

    - ``Dr.`` / ``St.``: a street type (Drive, Street) after a house number or a street name
      (``40 Oak Dr.``, ``Elm St. is closed``), a title (Doctor, Saint) before a name after any
      other word (``Dr. Patel``, ``in St. Louis``);
    - a capitalised street type after a street name or number, or with its stop (``Mill Rd.``
      "Road", ``5th Ave`` "Avenue", ``Sunset Blvd``); ``Ft.`` before a name "Fort";
    - a unit designator before its number (``Apt. 4`` "Apartment", ``Ste 200``, ``Fl. 3``,
      ``Rm 12``); ``Apt.`` and ``Bldg.`` with their stop anywhere;
    - ``N``, ``SW``… after a street type (``Pennsylvania Ave NW``) or between a house number and
      a name (``123 N Main St``) "North", "Southwest".
    """
    if not core[:1].isupper():
        return None
    key = core.lower()
    dotted = trail.startswith(".")
    before = split(c.before[-1])[1] if c.before else ""
    nxt = split(c.nxt)[1] if c.nxt is not None else ""
    if key in _STREET_OR_TITLE:
        street, title = _STREET_OR_TITLE[key]
        name_after = nxt[:1].isupper()
        if _DIGITS_ONLY.match(before) and name_after:
            return title, "word"  # "10 St. Mary's Rd.", "1 Dr. Martin Luther King Blvd."
        if _names_a_street(c) or (before[:1].isupper() and before.lower() not in _BEFORE_A_TITLE and not name_after):
            return street, "word"
        return title, "word"
    if core.isupper() and len(core) > 1 and core not in DIRECTIONS:
        return None  # "FL 32801", "CT": a state's code, not "Floor", "Court"
    if key in STREET_TYPES and (dotted or _names_a_street(c, sentence_start=True)):
        return STREET_TYPES[key], "word"
    if key == "ft" and not (c.before and c.before[-1] == before and _NUMBER.match(before)) and (
            dotted or nxt[:1].isupper()):  # ("5 Ft." is feet: the unit rule)
        return "Fort", "word"
    if key in UNIT_DESIGNATORS and (nxt[:1].isdigit() or nxt[:1] == "#" or (dotted and key in ("apt", "bldg", "dept"))):
        return UNIT_DESIGNATORS[key], "word"
    street_next = nxt[:1].isupper() or bool(_ORDINAL.match(nxt))  # "N Main", "W 34th"
    if core in DIRECTIONS and (before.lower() in STREET_TYPES or before.lower() in _STREET_OR_TITLE
                               or ((_DIGITS_ONLY.match(before) or before.lower() in ("on", "onto")) and street_next)):
        return DIRECTIONS[core], "word"
    return None


def _names_a_street(c: Context, sentence_start: bool = False) -> bool:
    """Whether the word before is a house number, an ordinal (``5th``) or a capitalised name
    (``Oak`` in ``40 Oak Dr.``; one that starts a sentence only with ``sentence_start``)."""
    if not c.before:
        return False
    word = split(c.before[-1])[1]
    if word != c.before[-1]:
        return False  # "John, Dr. Lee": punctuation between
    if _DIGITS_ONLY.match(word) or _ORDINAL.match(word):
        return True
    starts_sentence = len(c.before) < 2 or c.before[-2].rstrip("\"'”’)]").endswith((".", "!", "?"))
    return word[:1].isupper() and word.isalpha() and (sentence_start or not starts_sentence)


def _classic(core: str, trail: str, c: Context):
    spoken = _address_word(core, trail, c)
    if spoken:
        return spoken
    prev = c.prev
    spoken = v._year(core, prev, c.nxt, c.before)
    if spoken:
        return spoken, "number"
    spoken = v._roman(core, prev, c.before) or v._abbreviation(core, trail, c.nxt)
    return (spoken, "word") if spoken else None


def _range(core: str, trail: str, c: Context):
    """``a-b``: each side read as the rule book reads it, "to" between (``$10-$20`` "ten to twenty
    dollars", ``10-20%``, ``9am-5pm`` "nine AM to five PM", ``5-10``); days and months "through"
    (``Mon-Fri`` "Monday through Friday"). A unit both sides share is said once, after the second."""
    m = _RANGE.match(core)
    if not m:
        return None
    a, b = m["a"], m["b"]
    if (first := _DAY_NAMES.get(a.lower().rstrip("."))) and (last := _DAY_NAMES.get(b.lower().rstrip("."))):
        return f"{first} through {last}", "date"
    if not ((_RANGE_SIDE.match(a) or _AMPM.match(a)) and _RANGE_SIDE.match(b)):
        return None  # ("9 AM-5 PM": "AM-5" is a side's end and the next one's start)
    if a.isdigit() and b.isdigit() and (int(a), int(b)) in _DASHED_SAYINGS:
        return _SAYINGS[int(a), int(b)], "number"  # "24-7", "50-50"
    left, left_kind = read(a, Context(c.before, c.nxt))
    if left_kind == "date" and b.isdigit() and 1 <= int(b) <= 31:
        right = _ordinal(int(b))  # "June 1-5": "June first to fifth"
    else:
        right, _ = read(b, Context([*c.before, a], c.nxt))
    if left is None or right is None:
        return None
    return f"{_shared_unit_once(left, left_kind, right)} {'and' if c.prev == 'between' else 'to'} {right}", "number"


def _shared_unit_once(left: str, kind: str, right: str) -> str:
    """The left side of a range without the unit the right side ends with too ("ten dollars"
    before "twenty dollars" → "ten"; "nine AM" before "eleven AM" → "nine"), a number word
    never ("nine thirty" before "ten thirty" stays)."""
    head, _, unit = left.rpartition(" ")
    if head and kind in ("money", "percent", "unit", "time") and right.endswith(" " + unit) \
            and unit.split("-")[-1].lower() not in _NUMBER_WORDS \
            and all(w in _NUMBER_WORDS for w in re.split(r"[ -]", head.lower())):
        return head
    return left


def _plain_number(core: str, trail: str, c: Context):
    if m := _NUMBER.match(core):
        said = number(m["n"], m["sign"])
        if said and "." not in m["n"] and not m["sign"] and is_mixed_fraction(c.nxt):
            return f"{said} and", "number"  # "2 1/2": "two and a half"
        return (said, "number") if said else None
    if m := _VULGAR.match(core):
        a, b = _VULGAR_FRACTIONS[m["f"]]
        if m["n"] is None:
            return _fraction(a, b), "number"
        return f"{number(m['n'])} and {_fraction(a, b, mixed=True)}", "number"
    if re.search(r"\d", core) and re.fullmatch(r"[A-Za-z0-9]+", core):  # "4G", "mp3", "b2b"
        return " ".join(v.cardinal(int(p)) if p.isdigit() else (" ".join(p.upper()) if p.isupper() else p)
                        for p in re.findall(r"[A-Za-z]+|\d+", core)), "number"
    return None


_RULES = (_phone, _email, _url, _date, _time, _money, _unit, _ordinal_rule, _percent, _version, _code,
          _classic, _range, _plain_number)
