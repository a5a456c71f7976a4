"""Which writing system a word is in, so a voice is never asked to read a script it cannot.

An English Piper voice given ``"Привет"`` spells it letter by letter; the right answer is to say
nothing and tell the client (``unsupported_language``). Scripts are the Unicode Script property
(UAX #24) as ``fontTools.unicodedata`` reports it (``"Latin"``, ``"Cyrillic"``, ``"Han"``…);
digits, punctuation and combining marks (Common, Inherited) belong to every script.
"""

from __future__ import annotations

from fontTools import unicodedata as ucd

#: What the embedded voices read: Latin letters (plus digits and punctuation).
LATIN = frozenset({"Latin"})
_ANY = frozenset({"Zyyy", "Zinh", "Zzzz"})  # Common, Inherited, Unknown


def foreign_script(word: str, scripts: frozenset[str]) -> str | None:
    """The first script of a letter in ``word`` that is not in ``scripts``, else None.

    Args:
        word: a whole word.
        scripts: script names the voice reads (e.g. :data:`LATIN`).

    >>> foreign_script("Привет!", LATIN), foreign_script("café", LATIN), foreign_script("3.14", LATIN)
    ('Cyrillic', None, None)
    """
    if word.isascii():
        return None
    for ch in word:
        if ch.isalpha():
            code = ucd.script(ch)
            if code not in _ANY:
                name = ucd.script_name(code)
                if name not in scripts:
                    return name
    return None
