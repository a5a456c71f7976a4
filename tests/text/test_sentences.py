"""Sentence ends decided with pysbd, one word at a time (plugin/text/sentences.py)."""

import pytest

from myna.text.sentences import End, end_of, is_boundary


@pytest.mark.parametrize("word", ["you.", "Friday.", "done!", "Really?!", 'said."', "wait...", "1920.", "$5.", "it…"])
def test_a_plain_sentence_end_is_an_end_before_the_next_word_is_known(word):
    assert end_of(word, ["and", "that", "is"]) is End.END


@pytest.mark.parametrize("word", ["Mr.", "Dr.", "Mrs.", "T.", "U.S.", "a.m.", "p.m.", "No.", "Jr.", "e.g.", "i.e.",
                                  "etc.", "Inc.", "St.", "vs.", "Prof."])
def test_an_abbreviation_or_initial_waits_for_the_next_word(word):
    assert end_of(word, ["we", "saw"]) is End.MAYBE


@pytest.mark.parametrize("word", ["well", "3.14", "10:30", "Hi,", "U.S", ""])
def test_no_final_stop_is_no_sentence_end(word):
    assert end_of(word) is End.NOT_END


@pytest.mark.parametrize(
    ("before", "word", "after"),
    [
        ("The meeting is at 10", "a.m.", "tomorrow"),
        ("at 5", "p.m.", "today"),
        ("James", "T.", "Kirk"),
        ("Please take", "No.", "5"),
        ("", "Mr.", "Smith"),
        ("Martin Luther King", "Jr.", "was"),
        ("the", "U.S.", "Army"),
        ("I met", "J.", "R."),
        ("see", "e.g.", "the"),
        ("Acme", "Inc.", "is"),
    ],
)
def test_abbreviations_and_initials_inside_a_sentence_are_not_boundaries(before, word, after):
    assert not is_boundary(word, after, before.split())


@pytest.mark.parametrize(
    ("before", "word", "after"),
    [
        ("Let me check that for", "you.", "Your"),
        ("We meet at 5", "p.m.", "Then"),
        ("apples, pears", "etc.", "Then"),
        ("Is that", "fine?", "Great"),
    ],
)
def test_real_sentence_ends_are_boundaries(before, word, after):
    assert is_boundary(word, after, before.split())


def test_an_earlier_sentence_end_in_the_context_is_not_taken_for_this_one():
    # "5 p.m. | Take No. 5": the boundary after "p.m." is not one after "No."
    assert not is_boundary("No.", "5", ["at", "5", "p.m.", "Take"])
