"""HTML character references are decoded before the voice, however the chunks split them."""

from __future__ import annotations

import html

import pytest

from myna.text.entities import EntityDecoder

ESCAPED = "&quot;That&#x27;s cool,&quot; Tom &amp; Jerry &lt;3 &#39;98 caf&eacute; &CounterClockwiseContourIntegral;"


def decode(chunks: list[str]) -> str:
    decoder = EntityDecoder()
    return "".join(decoder.feed(c) for c in chunks) + decoder.flush()


def test_every_reference_kind_is_decoded_once():
    assert decode([ESCAPED]) == html.unescape(ESCAPED) == "\"That's cool,\" Tom & Jerry <3 '98 café ∳"
    assert decode(["&amp;quot;"]) == "&quot;"  # decoded once, as a browser shows it


@pytest.mark.parametrize("cut", range(1, len(ESCAPED)))
def test_a_reference_split_anywhere_is_decoded_as_if_whole(cut):
    assert decode([ESCAPED[:cut], ESCAPED[cut:]]) == html.unescape(ESCAPED)


def test_one_character_at_a_time_and_every_second_cut():
    assert decode(list(ESCAPED)) == html.unescape(ESCAPED)
    assert decode([ESCAPED[i:i + 2] for i in range(0, len(ESCAPED), 2)]) == html.unescape(ESCAPED)


def test_text_without_references_goes_through_unchanged_and_is_held_only_while_it_could_be_one():
    for text in ("AT&T and R&D", "Tom & Jerry", "a && b", "50% & more", "&"):
        assert decode([text]) == text
    decoder = EntityDecoder()
    assert decoder.feed("Tom &am") == "Tom "  # could still be &amp;
    assert decoder.feed("p; Jerry") == "& Jerry"
    assert decoder.feed("AT&" + "x" * 40) == "AT&" + "x" * 40  # too long to be a reference: not held
    assert decoder.feed("fish &") == "fish "
    assert decoder.feed(" chips") == "& chips"
    assert decoder.feed("end &amp") == "end "
    assert decoder.flush() == "&"  # the legacy reference without ";" at the end of the turn
