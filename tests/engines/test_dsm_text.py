"""The dsm engine gets the same text front end as Piper (engines/base.py): tags are never
spoken and scripts the voice cannot read are reported, not spoken. A
``<break>`` is not timed there (the words run on; see docs/text.md)."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch

from inprocess import collect
from myna.engines import ErrorEvent, WordEvent

os.environ.setdefault("NO_TORCH_COMPILE", "1")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from myna.bench.tiny_dsm import build_tiny_checkpoint
    from myna.bench.tiny_dsm import TINY_VOICE
    from myna.engines.dsm import DSMEngine

    threads = torch.get_num_threads()
    folder = build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_text"), seed=0)
    eng = DSMEngine(folder, voice=folder / TINY_VOICE, n_q=32, max_ahead_s=float("inf"), seed=9, threads=1)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.close())
    torch.set_num_threads(threads)


async def _run(engine, chunks):
    stream = engine.stream()
    for chunk in chunks:
        stream.push_text(chunk)
    stream.end_input()
    return await collect(stream, 120)


async def test_tags_are_never_spoken(engine):
    items = await _run(engine, ["It's fine <bre", 'ak time="0.5s" />', " <emphasis>ok</emphasis>."])
    assert [i.word for i in items if isinstance(i, WordEvent)] == ["It's", "fine", "ok"]


async def test_unsupported_scripts_are_reported_and_the_rest_spoken(engine):
    items = await _run(engine, ["Hello Привет, you."])
    assert [i.word for i in items if isinstance(i, WordEvent)] == ["Hello", "you"]
    errors = [i for i in items if isinstance(i, ErrorEvent)]
    assert [e.code for e in errors] == ["unsupported_language"] and "Cyrillic" in errors[0].message


async def test_the_model_gets_the_words_verbalised_and_captions_keep_the_written_ones(engine):
    """The same normaliser as Piper's runs in front of DSM, so the model's text
    tokens are those of the spoken words ("five five five, …"), never of digits or symbols; the
    word events carry the written words."""
    from myna.text.intake import read_text

    tokenizer = engine.tts.tokenizer
    encoded: list[tuple[str, list[int]]] = []

    class Spy:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode(self, word):
            tokens = tokenizer.encode(word)
            encoded.append((word, list(tokens)))
            return tokens

    text = "Call 555-0199 by 3/14 at 5:30pm, code XK7-92QZ, $12.75."
    engine.tts.tokenizer = Spy()
    try:
        items = await _run(engine, [text[:9], text[9:30], text[30:]])  # (cut inside the number and the time)
    finally:
        engine.tts.tokenizer = tokenizer
    model_words = [w for w, _ in encoded[len(encoded) - len(read_text(text).split()):]]
    assert model_words == read_text(text).split()
    assert not any(ch.isdigit() or ch in "$/:@" for w in model_words for ch in w)
    assert [tokens for _, tokens in encoded[-len(model_words):]] == [list(tokenizer.encode(w)) for w in model_words]
    assert [i.word for i in items if isinstance(i, WordEvent)] == [
        "Call", "555-0199", "by", "3/14", "at", "5:30pm", "code", "XK7-92QZ", "$12.75"]


async def test_a_session_may_turn_the_normaliser_off(engine):
    stream = engine.stream()
    stream.set_normalise(False)
    stream.push_text("Call 555-0199 now.")
    stream.end_input()
    items = await collect(stream, 120)
    assert [i.word for i in items if isinstance(i, WordEvent)] == ["Call", "555-0199", "now"]
