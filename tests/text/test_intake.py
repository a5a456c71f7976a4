"""The turn's text front end: markup, line breaks, words complete without waiting, scripts
(plugin/text/intake.py, plugin/text/markup.py, plugin/text/scripts.py)."""

import pytest

from myna.text import Pause, Skipped, TextIntake, said
from myna.text.intake import speech_in
from myna.text.markup import MAX_PAUSE_MS, TagScanner, break_ms
from myna.text.scripts import LATIN, foreign_script


def feed(chunks, intake=None, settle_after=()):
    """Items after each chunk (and after a settle where asked), then the flush."""
    intake = intake or TextIntake()
    steps = []
    for i, chunk in enumerate(chunks):
        steps.append(intake.push(chunk))
        if i in settle_after:
            steps.append(intake.settle())
    steps.append(intake.flush())
    return steps


def flat(steps):
    """The items of all steps, words as written (a word the normaliser marked: its written form)."""
    return [said.text_of(item) if isinstance(item, str) else item for step in steps for item in step]


# -- a finished sentence does not wait for the next token ---------------------------


def test_a_word_ending_a_sentence_is_complete_without_a_following_space():
    steps = feed(["Let", " me", " check", " that", " for", " you."])
    assert steps[-2] == ["for", "you."]  # given with the chunk that ends it, not at the end of the turn
    assert steps[-1] == []


@pytest.mark.parametrize("last", [" you!", " you?", " you…", " you...", ' you."', " you.)", " café."])
def test_every_sentence_punctuation_completes_the_word_at_once(last):
    intake = TextIntake()
    intake.push("Thank")
    assert intake.push(last)[-1] == last.strip().rstrip(")")  # (brackets are not spoken)
    assert not intake.pending


@pytest.mark.parametrize("first", ["Sure,", "Well;", "Note:", "Okay,", "Yes,\"", "Hmm…", "First,"])
def test_a_word_ending_a_clause_is_complete_at_once(first):
    """A first word that ends in , ; : does not wait for the next token (at a line's
    start too, where a short word might be a list marker)."""
    intake = TextIntake()
    assert intake.push(first) == [first]
    assert not intake.pending
    intake = TextIntake()
    intake.push("Thank you")
    assert intake.push(" " + first.lower()) == ["you", first.lower()]
    assert not intake.pending


@pytest.mark.parametrize("held", ["3,", "10:", "3.", "https:", "http:", "U.", "a,"])
def test_what_may_go_on_waits(held):
    """Digits before , . : may continue ("3,000", "10:30", "3.14"), a URL scheme waits for its
    "//", a single letter may be an initial."""
    intake = TextIntake()
    given = intake.push("It is ") + intake.push(held)
    assert given == ["It", "is"] and intake.pending
    assert [said.text_of(w) for w in intake.settle()] == [held]


def test_chunks_abutting_across_a_sentence_end_are_two_sentences_never_a_dot():
    words = flat(feed(["Let me check that for you.", "Your order ships on Friday."]))
    assert words == ["Let", "me", "check", "that", "for", "you.", "Your", "order", "ships", "on", "Friday."]
    assert all("." not in w[:-1] for w in words)


def test_a_word_with_nothing_after_it_is_complete_once_the_text_settles():
    intake = TextIntake()
    assert intake.push("It is done") == ["It", "is"]
    assert intake.pending
    assert intake.settle() == ["done"]
    assert not intake.pending and intake.flush() == []


@pytest.mark.parametrize(
    ("chunks", "words"),
    [
        (["Pi is 3", ".", "14 ok"], ["Pi", "is", "3.14", "ok"]),  # a decimal split at its point
        (["the U", ".S", ". Army"], ["the", "U.S.", "Army"]),  # an abbreviation in progress
        (["at 10 a", ".m", ". tomorrow"], ["at", "10", "a.m.", "tomorrow"]),
        (["go to https://docs.", "python.org/3/ now"], ["go", "to", "docs.python.org/3", "now"]),
        (["mail me@exa.", "mple.com"], ["mail", "me@exa.mple.com"]),
        (["Version 2.", "0 is out"], ["Version", "2.0", "is", "out"]),
    ],
)
def test_what_may_continue_past_a_stop_waits_for_the_next_chunk(chunks, words):
    assert flat(feed(chunks)) == words


# -- lists -------------------------------------------------------------------------


def test_a_numbered_list_is_one_phrase_per_line_with_the_marker_in_it():
    items = flat(feed(["Sure! Here are three fruits:\n1. Apple\n2. Banana\n3. Orange"]))
    assert items == ["Sure!", "Here", "are", "three", "fruits:", Pause(0.0), "1", "Apple.", Pause(0.0),
                     "2", "Banana.", Pause(0.0), "3", "Orange"]


@pytest.mark.parametrize("marker", ["-", "*", "+", "•", "1.", "1)", "12.", "a.", "B)"])
def test_every_list_marker_starts_a_phrase_and_each_line_ends_one(marker):
    items = flat(feed([f"{marker} Apple\n{marker} Banana\n"]))
    words = [i for i in items if isinstance(i, str)]
    assert words[-1].endswith("Banana.") and any(w.endswith("Apple.") for w in words)
    assert items.count(Pause(0.0)) == 2
    assert not any(w.endswith(".") and w[:-1] in ("1", "12", "a", "B") for w in words)  # no stop inside "1. Apple"


def test_a_list_streamed_token_by_token_gives_the_same_items():
    text = "Sure! Here are three fruits:\n1. Apple\n2. Banana\n3. Orange"
    tokens = ["Sure", "!", " Here", " are", " three", " fruits", ":\n", "1", ".", " Apple", "\n", "2", ".", " Banana",
              "\n", "3", ".", " Orange"]
    assert "".join(tokens) == text
    assert flat(feed(tokens)) == flat(feed([text]))


def test_blank_lines_and_headings_end_phrases_once():
    items = flat(feed(["# Title\n\n\nSome text\n\n## Sub"]))
    assert items == ["Title.", Pause(0.0), "Some", "text.", Pause(0.0), "Sub"]


# -- markup ------------------------------------------------------------------------


def test_a_break_tag_split_across_chunks_is_a_pause_and_never_words():
    items = flat(feed(["It's fine <bre", 'ak time="0.5s" />', " ok."]))
    assert items == ["It's", "fine", Pause(500.0), "ok."]


@pytest.mark.parametrize(
    ("tag", "ms"),
    [('<break time="0.5s"/>', 500.0), ("<break time='250ms'/>", 250.0), ("<break time=1s>", 1000.0),
     ('<break strength="strong"/>', 700.0), ("<break/>", 400.0), ('<break time="99s"/>', MAX_PAUSE_MS),
     ('<BREAK TIME="2S"/>', 2000.0)],
)
def test_break_durations(tag, ms):
    assert flat(feed([f"a {tag} b"])) == ["a", Pause(ms), "b"]


@pytest.mark.parametrize(
    "chunks",
    [
        ["<speak>Hello <emphasis level=\"strong\">there</emphasis></speak>"],
        ["<spe", "ak>Hel", "lo <empha", 'sis level="str', 'ong">there</em', "phasis></speak>"],
        ['<voice name="x">Hello</voice> <prosody rate="slow">there</prosody>'],
        ["Hello <!-- a note --> there"],
        ["Hello <foo bar='1'/>there"],
    ],
)
def test_other_tags_are_dropped_and_their_words_kept(chunks):
    assert [i for i in flat(feed(chunks)) if isinstance(i, str)] == ["Hello", "there"]


def test_line_ending_tags_end_a_phrase():
    assert flat(feed(["one<br>two<p>three"])) == ["one.", Pause(0.0), "two.", Pause(0.0), "three"]


@pytest.mark.parametrize(
    ("text", "words"),
    [("a < b", ["a", "b"]), ("I <3 you", ["I", "3", "you"]), ("see <https://example.org/x> now", ["see", "example.org/x", "now"]),
     ("if x<y then z", ["if", "x", "y", "then", "z"]), ("so a<b, then", ["so", "a", "b,", "then"])],
)
def test_what_is_not_a_tag_stays_text(text, words):
    assert flat(feed([text])) == words
    assert flat(feed(list(text))) == words  # also streamed character by character


def test_an_unclosed_tag_at_the_end_of_the_turn_is_never_spoken():
    assert flat(feed(["Fine <brea"])) == ["Fine"]


def test_a_tag_is_held_across_a_quiet_time():
    intake = TextIntake()
    assert intake.push("ok <break ti") == []
    assert intake.settle() == ["ok"] and intake.pending  # the word is complete; the tag still waits
    assert intake.push('me="1s"/> go') == [Pause(1000.0)]
    assert intake.flush() == ["go"]


def test_tag_scanner_and_break_ms_directly():
    scanner = TagScanner()
    assert scanner.push("<") == [] and scanner.holding
    assert scanner.push("br/>x") == ["\nx"] and not scanner.holding
    assert break_ms(' time="1.5s"') == 1500.0


# -- scripts -----------------------------------------------------------------------


def test_a_script_the_voice_cannot_read_is_skipped_and_named():
    assert flat(feed(["Привет"])) == [Skipped("Cyrillic", "Привет")]


def test_mixed_text_keeps_the_supported_words():
    items = flat(feed(["Hello Привет мир, how are you?"]))
    assert [i for i in items if isinstance(i, str)] == ["Hello", "how", "are", "you?"]
    assert {i.script for i in items if isinstance(i, Skipped)} == {"Cyrillic"}


@pytest.mark.parametrize(
    ("word", "script"),
    [("你好", "Han"), ("こんにちは", "Hiragana"), ("مرحبا", "Arabic"), ("שלום", "Hebrew"), ("γειά", "Greek"),
     ("नमस्ते", "Devanagari"), ("안녕", "Hangul"), ("สวัสดี", "Thai")],
)
def test_other_scripts_are_named(word, script):
    assert foreign_script(word, LATIN) == script
    assert flat(feed([f"ok {word}"])) == ["ok", Skipped(script, word)]


def test_latin_letters_with_marks_digits_and_symbols_are_supported():
    for word in ("café", "naïve", "Đặng", "Ærø", "3.14", "50%", "€3"):
        assert foreign_script(word, LATIN) is None


def test_speech_in_tells_whether_a_reply_has_anything_to_say():
    for text in ("👍", "...", ":)", "**", "", "  \n", "<break time='1s'/>", "🇬🇧 🎉", "— !!"):
        assert speech_in(text) == (False, []), text
    assert speech_in("Привет") == (False, [Skipped("Cyrillic", "Привет")])
    assert speech_in("ok 👍")[0] and speech_in("1")[0]


# -- found by a break-it pass: split end tags, addresses in attributes, empty IPA, long words ---
def _pushed(chunks: list[str]) -> tuple[list, list]:
    intake = TextIntake()
    return [intake.push(c) for c in chunks], intake.flush()


def test_an_end_tag_split_right_after_its_slash_still_closes_the_sub_and_words_flow_on():
    pushed, _ = _pushed(['Say <sub alias="World Wide Web">WWW</', "sub> now.", " More text", " here. And"])
    words = [said.split(w) for chunk in pushed for w in chunk if isinstance(w, str)]
    assert ("WWW", "World Wide Web") in words
    assert ("More", None) in words  # released while the turn streams, not held to its end


def test_an_end_tag_split_right_after_its_slash_is_the_same_tag():
    scanner = TagScanner()
    split = scanner.push("Item one</") + scanner.push("p>Item two") + scanner.flush()
    whole = TagScanner()
    assert "".join(split) == "".join(whole.push("Item one</p>Item two") + whole.flush()) == "Item one\nItem two"


@pytest.mark.parametrize("text, written, spoken", [
    ('Say <phoneme alphabet="x-sampa" ph="t@meItoU">tomato</phoneme> please.', "tomato", None),
    ('Say <sub alias="mail sam@acme.com">the desk</sub> please.', "the desk", "mail sam@acme.com"),
    ('See <sub alias="https://acme.com">our site</sub> now.', "our site", "https://acme.com"),
])
def test_a_tag_with_an_address_or_an_sampa_at_in_its_attributes_is_a_tag(text, written, spoken):
    pushed, flushed = _pushed([text])
    items = [i for chunk in pushed for i in chunk] + flushed
    words = [said.split(w) for w in items if isinstance(w, str)]
    assert not [w for w in words if w[0].strip("<>\"=").lower() in ("phoneme", "sub", "alias", "ph")], words
    assert (written, spoken or written) in words or (spoken is None and (written, None) in words), words


def test_autolinks_are_still_text():
    pushed, flushed = _pushed(["Write to <sam@acme.com> or see <https://acme.com> today."])
    text = " ".join(said.text_of(w) for chunk in pushed for w in chunk if isinstance(w, str))
    assert "sam@acme.com" in text or "acme" in text


def test_an_empty_ph_reads_the_word_as_written():
    pushed, flushed = _pushed(['Say <phoneme alphabet="ipa" ph="">tomato</phoneme> now.'])
    words = [said.split(w) for chunk in pushed for w in chunk + flushed if isinstance(w, str)]
    assert [w for w in words if w[0] == "tomato"] in ([("tomato", None)], [("tomato", "tomato")]), words  # as written


def test_a_long_run_of_letters_is_still_one_word_that_completes_at_its_comma():
    intake = TextIntake()
    items = intake.push("a" * 200_000) + intake.push(",")  # (searched whole: 200,000² steps, hours)
    items += intake.flush()
    text = "".join(said.text_of(w) for w in items if isinstance(w, str))
    assert text.count("a") == 200_000 and text.endswith(",")
