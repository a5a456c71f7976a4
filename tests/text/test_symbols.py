"""Speech normalisation (plugin/myna/text/symbols.py)."""

import unicodedata

import pytest

from myna.text import has_speech, normalise, normalise_word


@pytest.mark.parametrize("text", ["", " ", "\t\n \u00a0\u2003", "...", "!? — –", "** __ ``` ---", "# > - * +"])
def test_nothing_speakable_normalises_to_empty(text):
    assert normalise(text) == ""
    assert not has_speech(normalise(text))


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("...", "..."),
        ("—", "—"),
        ("?!", "?!"),
        ("👍", ""),
        ("**", ""),
        ("#", ""),
    ],
)
def test_symbol_only_word_is_punctuation_or_empty(word, expected):
    assert normalise_word(word) == expected
    assert not has_speech(normalise_word(word))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("**bold** and __strong__", "bold and strong"),
        ("*italic* and _emph_ and ~~gone~~", "italic and emph and gone"),
        ("run `pip install` now", "run pip install now"),
        ("```python\nprint('hi')\n```\nDone.", "print 'hi' Done."),
        ("# Title\n## Sub title\nText", "Title Sub title Text"),
        ("- one\n* two\n+ three", "one two three"),
        ("> quoted line\n>> nested", "quoted line nested"),
        ("See [the docs](https://example.com/a_(b)).", "See the docs."),
        ("![a cat](cat.png) sat", "a cat sat"),
        ("[ref link][1] here", "ref link here"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a b 1 2"),
        ("line<br>break <b>bold</b>", "line break bold"),
        ("***\nAfter the rule", "After the rule"),
    ],
)
def test_markdown_is_stripped_and_words_kept(text, expected):
    assert normalise(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Go to https://docs.python.org/3/library/re.html?x=1#y.", "Go to docs.python.org."),
        ("(see http://www.example.com)", "see example.com"),
        ("<https://example.org/path> and www.test.io/x", "example.org/path and test.io/x"),
        ("login at https://user:pw@host.net:8080/a, then", "login at host.net/a, then"),
    ],
)
def test_bare_urls_are_reduced_to_their_host_and_a_short_path(text, expected):
    assert normalise(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I 👍 it", "I it"),
        ("thumbs 👍🏽 up", "thumbs up"),  # skin-tone modifier
        ("love ❤️ you", "love you"),  # variation selector 16
        ("family 👨\u200d👩\u200d👧 time", "family time"),  # ZWJ sequence
        ("flag 🇬🇧 day", "flag day"),  # regional indicators
        ("press 1️⃣ or #️⃣ now", "press or now"),  # keycaps, digit included
        ("tag 🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f here", "tag here"),
        ("done✅", "done"),
        ("a😀b", "a b"),
        ("→ next ★ ©", "next"),
    ],
)
def test_emoji_and_symbols_are_dropped(text, expected):
    assert normalise(text) == expected


def test_every_emoji_codepoint_is_dropped_by_category():
    # Not a hand list: every symbol in the main emoji blocks must go, attached to a word or not.
    for cp in range(0x1F300, 0x1FB00):
        ch = chr(cp)
        if unicodedata.category(ch).startswith("S"):
            assert normalise_word(f"ok{ch}") == "ok", hex(cp)


@pytest.mark.parametrize(
    "text",
    [
        "pi is 3.14",
        "meet at 10:30,",
        "costs $5 or €3.50 or £20 or ¥100",
        "about 5,000 people",
        "it was -5 today",
        "50% off",
        "add 1/2 cup",
        "it is 25°C",
        "don't stop",
        "rock’n’roll",
        "a well-known fact",
        "\"Quoted,\" she said.",
        "Really?!",
    ],
)
def test_numbers_currency_and_clause_punctuation_survive(text):
    assert normalise(text) == text


def test_whitespace_is_collapsed():
    assert normalise("  a\tb\n\nc\u00a0d\u2003e\r\nf  ") == "a b c d e f"


def test_invisible_and_combining_characters():
    assert normalise("zero\u200bwidth soft\u00adhyphen") == "zerowidth softhyphen"
    assert normalise("cafe\u0301") == "café"  # composed, mark kept on its letter


def test_symbols_between_letters_become_a_space():
    assert normalise("snake_case and/or 2+2") == "snake case and or 2 2"
    assert normalise("Q&A with R&D & more") == "Q&A with R&D and more"


def test_punctuation_only_word_joins_the_previous_word():
    assert normalise("wait ... what — ok") == "wait... what— ok"
    assert normalise("50 %") == "50%"
    assert normalise("... hello") == "hello"  # no previous word: dropped
    assert normalise("Hi, ...") == "Hi,"  # the clause already ended
    assert normalise("wait 👍 ...") == "wait..."  # a dropped emoji does not separate them


def test_has_speech():
    assert has_speech("a") and has_speech("7") and has_speech("é") and has_speech("日")
    assert not has_speech("") and not has_speech("...") and not has_speech("$") and not has_speech("—")
