"""Lexicon entries: word, exact-case, regex and IPA entries, from a file and as
JSON (the WebSocket ``config.lexicon``); bad entries are clear errors naming the entry."""

from __future__ import annotations

import json

import pytest

from myna.messages import BadMessage, parse_message, parse_turn_defaults
from myna.text import said
from myna.text.lexicon import Lexicon


def spoken(lexicon: Lexicon, word: str) -> tuple[str, str | None]:
    return said.split(lexicon.apply(word))


def test_file_entries_word_exact_case_regex_and_ipa(tmp_path):
    path = tmp_path / "lexicon.txt"
    path.write_text("Zyntrix = zin tricks  # a brand\n"
                    "US == you ess\n"
                    "/ORD-(\\d+)/ = order \\1\n"
                    "tomato = /təmˈɑːtoʊ/\n", encoding="utf-8")
    lex = Lexicon.load(path)
    assert spoken(lex, "zyntrix,") == ("zyntrix", "zin tricks,")  # any case; the comma stays after it
    assert spoken(lex, "US") == ("US", "you ess")
    assert spoken(lex, "us") == ("us", None)  # exact case: "us" is a word of its own
    assert spoken(lex, "ord-4521.") == ("ord-4521", "order 4521.")  # regex: any case, whole word, groups
    assert spoken(lex, "ORD-4521x") == ("ORD-4521x", None)
    assert said.ipa_of(spoken(lex, "Tomato")[1]) == "təmˈɑːtoʊ"


@pytest.mark.parametrize("line, says", [("/ORD-(/ = x", "does not compile"), ("two words = x", "expected"),
                                        ("novalue =", "expected")])
def test_a_bad_file_line_is_named(tmp_path, line, says):
    path = tmp_path / "bad.txt"
    path.write_text(f"ok = fine\n{line}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"bad.txt:2: .*{says}"):
        Lexicon.load(path)


def test_json_object_and_list_forms():
    lex = Lexicon.from_json({"Zyntrix": "zin tricks", "tomato": "/təmˈɑːtoʊ/"})
    assert spoken(lex, "ZYNTRIX") == ("ZYNTRIX", "zin tricks") and said.ipa_of(spoken(lex, "tomato")[1])
    lex = Lexicon.from_json([{"word": "US", "say": "you ess", "case": "exact"},
                             {"regex": "([A-Z]{2})(\\d{3})", "say": "\\1 \\2", "case": "exact"},
                             {"word": "gif", "ipa": "dʒˈɪf"}])
    assert spoken(lex, "US")[1] == "you ess" and spoken(lex, "Us")[1] is None
    assert spoken(lex, "AB123")[1] == "AB 123" and spoken(lex, "ab123")[1] is None  # exact-case regex
    assert said.ipa_of(spoken(lex, "GIF")[1]) == "dʒˈɪf"


@pytest.mark.parametrize("value, says", [
    ("Zyntrix", "must be an object"),
    ([{"say": "x"}], "entry 1: needs one of \"word\" or \"regex\""),
    ([{"word": "a", "regex": "b", "say": "x"}], "entry 1: needs one of"),
    ([{"word": "a"}], "entry 1: needs one of \"say\" or \"ipa\""),
    ([{"word": "a", "say": "x", "ipa": "y"}], "entry 1: needs one of \"say\""),
    ([{"word": "a", "say": "x"}, {"word": "b", "say": "y", "case": "upper"}], "entry 2: \"case\""),
    ([{"regex": "(", "say": "x"}], "entry 1: regex '\\(' does not compile"),
    ([{"word": "two words", "say": "x"}], "is one word"),
    ([{"word": "w", "say": "x" * 300}], "over 200"),
    ([{"word": f"w{i}", "say": "x"} for i in range(1001)], "at most 1000"),
])
def test_bad_json_entries_are_named(value, says):
    with pytest.raises(ValueError, match=says.replace("(", "\\(") if "compile" not in says else says):
        Lexicon.from_json(value)


def test_a_session_lexicon_comes_before_the_process_one():
    session = Lexicon({"Zyntrix": "session says"})
    process = Lexicon({"Zyntrix": "process says", "Myna": "my nah"})
    both = session.then(process)
    assert spoken(both, "Zyntrix")[1] == "session says" and spoken(both, "Myna")[1] == "my nah"
    assert spoken(both, "other")[1] is None and session.then(None) is session


def test_a_regex_too_large_to_compile_is_bad_lexicon_not_an_overflow():
    for defaults in ({"lexicon": [{"regex": "a{99999999999}", "say": "x"}]},):
        with pytest.raises(BadMessage) as caught:
            parse_turn_defaults(defaults)
        assert caught.value.code == "bad_lexicon" and "does not compile" in caught.value.message
    with pytest.raises(BadMessage) as caught:
        parse_message(json.dumps({"type": "config", "lexicon": [{"regex": "x{99999999999}", "say": "y"}]}), config=True)
    assert caught.value.code == "bad_lexicon"


def test_a_regex_that_backtracks_without_end_is_left_out_and_the_others_stay():
    lexicon = Lexicon.from_json([{"regex": "(a|a)+$", "say": "x"}, {"regex": "kw[a-z]+", "say": "strawberry"}])
    assert lexicon.apply("aaa") == said.mark("aaa", "x")
    bomb = "a" * 40 + "b"  # 2^40 ways to match the a's before failing at "b": days
    assert lexicon.apply(bomb) == bomb  # given up on within its time limit, then left out
    assert lexicon.apply("aaa") == "aaa"
    assert lexicon.apply("kwzzpt") == said.mark("kwzzpt", "strawberry")


@pytest.mark.parametrize("entry", [{"word": "hello", "ipa": "/"}, {"word": "hello", "ipa": "/ /"},
                                   {"word": "hello", "say": "/ /"}])
def test_an_empty_spoken_form_is_bad_lexicon_not_a_silent_word(entry):
    with pytest.raises(BadMessage) as caught:
        parse_turn_defaults({"lexicon": [entry]})
    assert caught.value.code == "bad_lexicon" and "entry 1" in caught.value.message, caught.value.message
