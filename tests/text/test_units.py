"""What the chunkers give an engine: abbreviations kept in their sentence, line breaks and pauses
as unit ends, the first phrase early on a virtual clock (plugin/text/segment.py)."""

import pytest

from myna.text import ClauseChunker, Pause, SentenceChunker, TextIntake, WholeChunker, said


def units_of(text: str, chunker) -> list:
    """The intake and a chunker, as an engine stream runs them (whole text, no clock)."""
    intake, out = TextIntake(), []
    for item in intake.push(text) + intake.flush():
        if isinstance(item, Pause):
            out += chunker.pause(item.ms)
        elif isinstance(item, str):
            out += chunker.push(item)
    return [" ".join(said.text_of(w) for w in u.split()) if isinstance(u, str) else u for u in out + chunker.flush()]


@pytest.mark.parametrize("make", [ClauseChunker, SentenceChunker])
@pytest.mark.parametrize(
    "sentence",
    [
        "The meeting is at 10 a.m. tomorrow in room four.",
        "James T. Kirk is the captain of the ship.",
        "She moved to the U.S. last year with her family.",
        "The call is at 5 p.m. today.",
        "Please take No. 5 from the shelf.",
        "Mr. Smith met Dr. Jones and Mrs. Lee at St. Mary's.",
        "Martin Luther King Jr. was born in Atlanta.",
        "Fruit, e.g. apples, is good.",
        "J. R. R. Tolkien wrote it.",
        "Acme Inc. is hiring.",
    ],
)
def test_abbreviations_and_initials_stay_in_their_unit(make, sentence):
    units = units_of(sentence, make())
    assert not any(u.endswith((".", ". ")) and not u.endswith(("!", "?")) for u in units[:-1]), units
    assert " ".join(units) == sentence


def test_real_sentence_ends_after_abbreviations_still_end_units():
    assert units_of("We meet at 5 p.m. Then we eat.", SentenceChunker()) == ["We meet at 5 p.m.", "Then we eat."]
    assert units_of("Let me check that for you. Your order ships on Friday.", SentenceChunker()) == [
        "Let me check that for you.", "Your order ships on Friday."]


def test_a_list_is_one_unit_per_item_with_its_marker():
    text = "Sure! Here are three fruits:\n1. Apple\n2. Banana\n3. Orange"
    assert units_of(text, ClauseChunker()) == ["Sure!", "Here are three fruits:", "1 Apple.", "2 Banana.", "3 Orange"]
    assert units_of("- Apple\n- Banana", ClauseChunker()) == ["Apple.", "Banana"]
    assert units_of(text, SentenceChunker())[-3:] == ["1 Apple.", "2 Banana.", "3 Orange"]


def test_a_line_without_punctuation_ends_its_unit():
    assert units_of("First line\nsecond line", ClauseChunker()) == ["First line.", "second line"]


def test_a_break_ends_a_unit_and_leaves_a_pause_in_order():
    text = 'It\'s fine <break time="0.5s"/> ok.'
    assert units_of(text, ClauseChunker()) == ["It's fine", Pause(500.0), "ok."]
    assert units_of(text, SentenceChunker()) == ["It's fine", Pause(500.0), "ok."]
    whole = WholeChunker()
    assert units_of(text, whole) == ["It's fine", Pause(500.0), "ok."]  # all released at the end


def test_the_whole_reply_keeps_line_breaks_inside_its_one_unit():
    assert units_of("One\nTwo", WholeChunker()) == ["One. Two"]


def test_a_maybe_end_is_decided_by_the_next_word_or_by_quiet():
    chunker = SentenceChunker()
    assert chunker.push("We") + chunker.push("meet") + chunker.push("at") + chunker.push("5") == []
    assert chunker.push("p.m.") == []  # maybe: "p.m. today" or "p.m. Then"
    assert chunker.settle() == ["We meet at 5 p.m."]  # the text went quiet: it was an end
    assert chunker.push("Then") == [] and chunker.settle() == []  # nothing pending
    chunker.flush()
    assert [u for w in "at 5 p.m. today.".split() for u in chunker.push(w)] == ["at 5 p.m. today."]


# -- the first phrase early, on a virtual clock ----------------------------------


def early():
    return ClauseChunker(first_words=4, first_wait_s=0.25)


def test_the_first_phrase_goes_at_four_words_when_no_clause_break_has_come():
    chunker = early()
    units = []
    for i, word in enumerate("Well I think the answer is probably yes but".split()):
        now = 0.033 * i
        units += chunker.push(word, now) + chunker.poll(now)  # as the stream does after each batch
    assert units[0] == "Well I think"  # four words in, cut before the word that leans on the next
    assert chunker.flush() == ["the answer is probably yes but"]  # later units are clause-sized


def test_the_first_phrase_goes_after_the_wait_when_words_come_slowly():
    chunker = early()
    assert chunker.push("Hmm", 10.0) + chunker.poll(10.0) == []
    assert chunker.deadline == pytest.approx(10.25)
    assert chunker.push("let", 10.2) + chunker.poll(10.2) == []
    assert chunker.poll(10.249) == []
    assert chunker.poll(10.25) == ["Hmm let"]
    assert chunker.deadline is None
    assert chunker.push("me", 10.3) + chunker.poll(10.5) == []  # only the first phrase is early


def test_a_clause_break_before_four_words_ends_the_first_phrase():
    chunker = early()
    assert chunker.push("Sure,", 0.0) == ["Sure,"]
    assert chunker.deadline is None


def test_a_clause_that_arrives_whole_is_one_unit():
    chunker = early()
    units = [u for w in "The meeting is at ten tomorrow in room four.".split() for u in chunker.push(w, 0.0)]
    assert units + chunker.poll(0.0) == ["The meeting is at ten tomorrow in room four."]


def test_the_first_phrase_never_ends_on_a_word_the_next_word_decides():
    chunker = early()
    for word in "I met Mr.".split():
        assert chunker.push(word, 0.0) + chunker.poll(0.0) == []
    assert chunker.deadline is None and chunker.poll(1.0) == []  # "Mr." may not end it
    assert chunker.push("Smith", 1.0) + chunker.poll(1.0) == ["I met Mr. Smith"]


def test_a_new_turn_gets_the_first_phrase_rule_again():
    chunker = early()
    chunker.push("a", 0.0)
    assert chunker.poll(0.3) == ["a"]
    assert chunker.flush() == []
    chunker.push("b", 5.0)
    assert chunker.deadline == pytest.approx(5.25)


@pytest.mark.parametrize(
    ("words", "first"),
    [
        ("She painted the old fence", "She painted"),
        ("Please remember to bring your", "Please remember"),
        ("I have checked the schedule", "I have checked"),
        ("The weather today is sunny", "The weather today is"),
        ("Go to the", "Go to"),  # two words at least before the cut: not "Go | to the"
        ("It is the", "It is"),
    ],
)
def test_the_early_first_phrase_ends_between_phrases(words, first):
    chunker = early()
    for word in words.split()[:4]:
        chunker.push(word, 0.0)
    assert chunker.poll(0.3) == [first]
