"""Pronunciation control: ``<sub alias>``, ``<phoneme alphabet="ipa">`` and the
lexicon, heard through the real Piper voice by Whisper tiny.en; captions keep the written words."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from myna.engines import AudioChunk, ErrorEvent, WordEvent
from myna.engines.base import SynthesisStream
from myna.text import lexicon
from myna.text.intake import TextIntake

from inprocess import collect

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def spoken(engine, whisper, text: str) -> tuple[str, list[str]]:
    stream = engine.stream()
    for i in range(0, len(text), 7):  # tags cut anywhere, as tokens cut them
        stream.push_text(text[i : i + 7])
    stream.end_input()
    items = await collect(stream)
    pcm = np.concatenate([i.pcm for i in items if isinstance(i, AudioChunk)])
    segments, _ = whisper.transcribe(soxr.resample(pcm, engine.sample_rate, 16_000).astype(np.float32),
                                     beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments).lower(), [i.word for i in items if isinstance(i, WordEvent)]


@pytest.mark.slow
async def test_sub_speaks_the_alias_and_captions_keep_the_written_word(engine, whisper):
    heard, words = await spoken(engine, whisper, 'The <sub alias="World Wide Web Consortium">W3C</sub> sets the standard.')
    assert words == ["The", "W3C", "sets", "the", "standard"]
    assert "world wide web consortium" in heard.replace(",", ""), heard


async def test_a_lexicon_entry_respells_a_brand_name(engine, whisper):
    lexicon.use(lexicon.Lexicon({"Zyntrix": "banana split"}))
    try:
        after, words = await spoken(engine, whisper, "Ask Zyntrix today.")
    finally:
        lexicon.use(None)
    assert words == ["Ask", "Zyntrix", "today"]
    assert "banana" in after, after  # (the respelling is what is read)


async def test_phoneme_ipa_is_read_as_given(engine, whisper):
    heard, words = await spoken(engine, whisper, 'I say <phoneme alphabet="ipa" ph="pətˈeɪɾoʊ">banana</phoneme> now.')
    assert words == ["I", "say", "banana", "now"]
    assert "potato" in heard and "banana" not in heard, heard


@pytest.mark.parametrize("before, ipa, after, word", [
    ("Pass the", "ˈbʌtər", ", please.", "butter"),
    ("A glass of", "/ˈwɔtər/", " please.", "water"),
    ("Go to the", "t͡ʃɝːt͡ʃ", " now.", "church"),
    ("I saw a", "bɝd", " today.", "bird"),
])
async def test_phoneme_ipa_as_dictionaries_write_it_is_heard(engine, whisper, before, ipa, after, word):
    """Stress before the syllable, plain r, tie bars, ɝ, slashes (issue: IPA as people write it):
    the voice reads it in espeak-ng's notation (myna.text.ipa). Handed over as written, Whisper
    heard "past the about a", "a glass of oil", "go to the channel", "i saw abe"."""
    heard, words = await spoken(engine, whisper, f'{before} <phoneme alphabet="ipa" ph="{ipa}">thing</phoneme>{after}')
    assert words == [*before.split(), "thing", *after.strip(" ,.").split()]
    assert word in heard and "thing" not in heard, heard


async def test_ipa_symbols_the_voice_lacks_are_left_out_and_reported_once_a_turn(engine):
    stream = engine.stream()
    stream.push_text('Some <phoneme alphabet="ipa" ph="ˈbʌʬtər">butter</phoneme> and '
                     '<phoneme alphabet="ipa" ph="ʬ">jam</phoneme> and <phoneme ph="ˈʬwɔtər">water</phoneme>.')
    stream.end_input()
    items = await collect(stream)
    errors = [i for i in items if isinstance(i, ErrorEvent)]
    assert [e.code for e in errors] == ["phonemes_ignored"] and "ʬ" in errors[0].message, errors
    assert [i.word for i in items if isinstance(i, WordEvent)] == ["Some", "butter", "and", "jam", "and", "water"]
    assert sum(len(i.pcm) for i in items if isinstance(i, AudioChunk)) > engine.sample_rate  # the rest is spoken


async def test_an_engine_that_cannot_take_phonemes_reads_the_word_and_says_so_once():
    class Plain(SynthesisStream):
        def __init__(self):
            super().__init__()
            self.got: list[str] = []

        def _on_words(self, words):
            self.got += words

        def _on_end_input(self):
            self._finish()

    stream = Plain()
    stream.push_text('<phoneme alphabet="ipa" ph="x">one</phoneme> <phoneme ph="y">two</phoneme> '
                     '<sub alias="three four">34</sub> ')
    stream.end_input()
    items = await collect(stream)
    assert stream.got == ["one", "two", "three", "four"]
    assert [i.code for i in items if isinstance(i, ErrorEvent)] == ["phonemes_ignored"]


async def test_a_bad_lexicon_line_names_its_line(tmp_path):
    path = tmp_path / "lex.txt"
    path.write_text("# brands\nMyna = my nah\nbroken line\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"lex.txt:3"):
        lexicon.Lexicon.load(path)
    path.write_text("Myna = my nah\n", encoding="utf-8")
    assert TextIntake(lexicon=lexicon.Lexicon.load(path)).push("myna, ") == [
        lexicon.said.mark("myna", "my nah") + ","]


async def test_myna_serve_lexicon_flag_loads_the_process_lexicon_or_names_the_bad_line(tmp_path):
    from myna.engines.build import EngineOptions, EngineOptionsError, build_engines

    path = tmp_path / "brands.txt"
    path.write_text("nope\n", encoding="utf-8")
    with pytest.raises(EngineOptionsError, match=r"--lexicon: .*brands.txt:1"):
        build_engines(EngineOptions(engines="piper", lexicon=str(path), phrase_cache_mb=0))
    path.write_text("Zyntrix = banana split\n", encoding="utf-8")
    try:
        build_engines(EngineOptions(engines="piper", lexicon=str(path), phrase_cache_mb=0))
        intake = TextIntake()
        assert intake.push("Ask Zyntrix ") + intake.flush() == ["Ask", lexicon.said.mark("Zyntrix", "banana split")]
    finally:
        lexicon.use(None)
