"""Incremental word segmentation and clause chunking (plugin/text/segment.py)."""

import random

import pytest

from myna.text import ClauseChunker, WordSegmenter, has_speech, normalise

SENTENCES = [
    "Hello there, my friend. How are you today?",
    "The reference manual, version 3.14, costs $5 at 10:30 — wait ... really?!",
    "**Bold** move: see [click here](https://example.com/a?b=1) or `code` now",
    "# Heading\n\n- first item\n- second item with 👨\u200d👩\u200d👧 and 👍🏽\n> quoted",
    "don't stop; it's a well-known,\tfact\u00a0that 50 % of   people\nagree \"100%\".",
    "Visit https://docs.python.org/3/ and ![a cat](cat.png) 🇬🇧 1️⃣ done",
    "no final punctuation here at all",
    "... — !! ...",
]


def segment(chunks, seg=None):
    seg = seg or WordSegmenter()
    words = []
    for chunk in chunks:
        words += seg.push(chunk)
    return words + seg.flush()


def random_split(text, k, rng):
    cuts = sorted(rng.sample(range(1, len(text)), min(k - 1, len(text) - 1)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def chunk_units(words, chunker):
    units = []
    for word in words:
        units += chunker.push(word)
    return units + chunker.flush()


# -- WordSegmenter --------------------------------------------------------------------------


@pytest.mark.parametrize("chunks", [[""], ["   "], [" \t\n", "\u00a0 "], ["...", " !!", " — ?"], ["👍", " 👨\u200d👩\u200d👧"]])
def test_turns_with_nothing_speakable_give_no_words_and_no_units(chunks):
    assert segment(chunks) == []
    assert chunk_units(segment(chunks), ClauseChunker()) == []


def test_word_split_across_chunks_is_joined_without_a_space():
    seg = WordSegmenter()
    assert seg.push("ref") == []
    assert seg.push("erence") == []
    assert seg.push(" manual") == ["reference"]
    assert seg.flush() == ["manual"]


def test_word_complete_only_when_whitespace_follows():
    seg = WordSegmenter()
    assert seg.push("Hi,") == []
    assert seg.push(" ") == ["Hi,"]  # ends a clause: returned at once, not held
    assert seg.push("there") == []
    assert seg.push(" you") == ["there"]  # next word has a letter: nothing can attach any more
    assert seg.flush() == ["you"]
    assert seg.flush() == []


def test_punctuation_only_word_attaches_to_the_previous_word():
    seg = WordSegmenter()
    assert seg.push("wait ") == []  # held: "..." may still follow
    assert seg.push("... ") == ["wait..."]
    assert seg.push("— ok") == []  # the clause already ended: "—" is dropped
    assert seg.flush() == ["ok"]


def test_zwj_sequence_split_at_the_zwj_is_never_emitted_in_halves():
    family = "👨\u200d👩\u200d👧"
    text = f"My {family} family{family} rocks"
    zwj_cuts = [i for i, ch in enumerate(text) if ch == "\u200d"]
    for cut in zwj_cuts:
        for i in (cut, cut + 1):
            words = segment([text[:i], text[i:]])
            assert words == ["My", "family", "rocks"], i
    # and a turn made only of the sequence, split at its ZWJ, says nothing
    assert segment(["👨\u200d", "👩\u200d👧"]) == []


def test_multi_word_markdown_link_split_across_chunks():
    chunks = ["Please [cli", "ck", " here](https://ex", "ample.com/a_(b)", "). Then", " stop"]
    assert segment(chunks) == ["Please", "click", "here.", "Then", "stop"]


def test_markdown_across_chunks():
    chunks = ["# Tit", "le\n", "- **bo", "ld** it", "em\n", "```py", "thon\nx = 1\n``", "`\nok"]
    assert segment(chunks) == ["Title", "bold", "item", "x", "1", "ok"]


def test_words_are_normalised_nonempty_speakable_and_whitespace_free():
    for text in SENTENCES:
        for word in segment([text]):
            assert word and has_speech(word)
            assert not any(ch.isspace() for ch in word)


@pytest.mark.parametrize("text", SENTENCES)
def test_every_two_way_split_gives_the_same_words(text):
    whole = segment([text])
    assert " ".join(whole) == normalise(text)
    for i in range(len(text) + 1):
        assert segment([text[:i], text[i:]]) == whole, i


@pytest.mark.parametrize("text", SENTENCES)
def test_random_k_way_splits_give_the_same_words(text):
    rng = random.Random(f"k-way {text}")
    whole = segment([text])
    for _ in range(200):
        chunks = random_split(text, rng.randint(3, 12), rng)
        assert "".join(chunks) == text
        assert segment(chunks) == whole, chunks


def test_char_by_char_stream_of_all_sentences_in_one_turn():
    text = "\n".join(SENTENCES)
    assert segment(list(text)) == segment([text]) == normalise(text).split()


def test_flush_resets_between_turns():
    seg = WordSegmenter()
    assert seg.push("first tur") == ["first"]
    assert seg.flush() == ["tur"]
    assert seg.push("n2, ") == ["n2,"]  # nothing of the previous turn leaks into this one


def test_numbers_and_currency_survive_segmentation():
    chunks = ["Pi is 3", ".14, it", "'s 10:", "30 and $", "5.99 or €3", ",50."]
    assert segment(chunks) == ["Pi", "is", "3.14,", "it's", "10:30", "and", "$5.99", "or", "€3,50."]


# -- ClauseChunker ---------------------------------------------------------------------------


def test_short_first_clause_is_sent_alone_and_at_once():
    chunker = ClauseChunker()
    assert chunker.push("Hi,") == ["Hi,"]
    assert chunker.push("I") == []
    assert chunker.push("can") == []
    assert chunker.push("help.") == ["I can help."]


@pytest.mark.parametrize(
    ("words", "units"),
    [
        ("One, two; three: four. Five! Six? Seven", ["One,", "two;", "three:", "four.", "Five!", "Six?", "Seven"]),
        ('He said, "Go." Then (quietly.) left', ["He said,", '"Go."', "Then (quietly.)", "left"]),
        ("wait... what— ok", ["wait...", "what—", "ok"]),
        ("Dr. Smith met Mr. Jones e.g. today.", ["Dr. Smith met Mr. Jones e.g. today."]),
        ("pi 3.14 and 10:30 stay", ["pi 3.14 and 10:30 stay"]),
    ],
)
def test_units_end_at_clause_punctuation(words, units):
    assert chunk_units(words.split(), ClauseChunker()) == units


def test_turn_without_final_punctuation_is_spoken_in_full_at_flush():
    chunker = ClauseChunker()
    words = "this turn has no final punctuation".split()
    assert [u for w in words for u in chunker.push(w)] == []
    assert chunker.flush() == ["this turn has no final punctuation"]
    assert chunker.flush() == []


def test_max_words_splits_at_word_boundaries():
    chunker = ClauseChunker(max_words=3)
    assert chunk_units("a b c d e f g".split(), chunker) == ["a b c", "d e f", "g"]


def test_units_without_speech_are_never_returned():
    chunker = ClauseChunker()
    assert chunker.push("...") == []
    assert chunker.push("—") == []
    assert chunker.flush() == []
    assert chunk_units(["Hi.", "!!", "?"], ClauseChunker()) == ["Hi."]


def test_first_min_words_merges_only_the_first_clause_when_asked():
    chunker = ClauseChunker(first_min_words=3)
    assert chunk_units("Hi, there, friend. Ok, go.".split(), chunker) == ["Hi, there, friend.", "Ok,", "go."]
    # a new turn starts with the first-unit rule again
    assert chunk_units("Yes, sir.".split(), chunker) == ["Yes, sir."]


def test_an_early_cut_falls_between_phrases_and_never_right_after_a_possible_sentence_end():
    chunker = ClauseChunker()
    assert chunker.push("Sure,") == ["Sure,"]
    for word in "the order you asked about left".split():
        assert chunker.push(word) == []
    assert chunker.held_words == 6
    assert chunker.cut_early() == ["the order you asked"]  # not before "about", which leans on "left"
    assert chunker.held_words == 2 and chunker.cut_early(min_words=3) == []
    for word in "with Dr.".split():
        chunker.push(word)
    assert chunker.cut_early() == []  # "Dr." may end a sentence: the next word decides
    chunker.push("Smith")
    assert chunker.cut_early() == ["about left"] and chunker.flush() == ["with Dr. Smith"]


def test_invalid_sizes_are_rejected():
    with pytest.raises(ValueError):
        ClauseChunker(max_words=0)
    with pytest.raises(ValueError):
        ClauseChunker(first_min_words=0)


def test_5000_chars_without_punctuation_become_units_with_every_word_in_order():
    rng = random.Random(5000)
    vocab = ["alpha", "reference", "speech", "streaming", "voice", "agent", "token", "latency", "a", "of"]
    words = []
    while len(" ".join(words)) < 5000:
        words.append(rng.choice(vocab))
    text = " ".join(words)
    assert len(text) >= 5000
    chunks = random_split(text, 1500, rng)  # token-sized pieces that split words anywhere

    for max_words in (24, 7):
        chunker = ClauseChunker(max_words=max_words)
        units = []
        seg = WordSegmenter()
        for chunk in chunks:
            for word in seg.push(chunk):
                units += chunker.push(word)
        for word in seg.flush():
            units += chunker.push(word)
        units += chunker.flush()

        assert all(1 <= len(u.split()) <= max_words for u in units)
        assert [w for u in units for w in u.split()] == words
        assert len(units) == -(-len(words) // max_words)


def test_intake_pipeline_keeps_every_word_in_order_for_any_chunking():
    rng = random.Random("pipeline")
    text = " ".join(SENTENCES)
    expected = normalise(text).split()
    for _ in range(50):
        seg, chunker, units = WordSegmenter(), ClauseChunker(max_words=5), []
        for chunk in random_split(text, rng.randint(2, 40), rng):
            for word in seg.push(chunk):
                units += chunker.push(word)
        for word in seg.flush():
            units += chunker.push(word)
        units += chunker.flush()
        assert [w for u in units for w in u.split()] == expected
        assert all(has_speech(u) and len(u.split()) <= 5 for u in units)


def test_a_giant_word_is_cut_into_bounded_pieces_and_clauses_stay_short():
    from myna.text.segment import MAX_WORD_CHARS

    seg = WordSegmenter()
    words = []
    for _ in range(100):  # 4,000 letters in 40-letter chunks, no whitespace
        words += seg.push("a" * 40)
    words += seg.flush()
    assert "".join(words) == "a" * 4000
    assert max(len(w) for w in words) <= MAX_WORD_CHARS
    chunker = ClauseChunker(max_chars=120)
    units = [u for w in words for u in chunker.push(w)] + chunker.flush()
    assert "".join(units).replace(" ", "") == "a" * 4000
    assert max(len(u) for u in units) <= 120 + MAX_WORD_CHARS
