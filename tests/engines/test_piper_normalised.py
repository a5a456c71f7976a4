"""Said right: the agent sentence set (tests/text/data/agent_sentences.json: phone
numbers, e-mails, URLs, dates, times, units, codes, prices) spoken by the seeded Piper voice and
heard by Whisper tiny.en is the intended spoken form, WER ≤ 0.10 over the set.

Whisper writes what it hears in written form (``555-0199``, ``$42.50``, ``5:30 p.m.``), so its
transcript is read by the same normaliser before it is compared with the intended spoken form
(``myna.bench.wer.words``: lower case, no punctuation; a run of single letters is one word on
both sides, as Whisper writes a spelled ``H R`` or ``X K`` as ``HR``, ``xk``): a number Piper
said wrong is written wrong by Whisper and reads differently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soxr

from myna.bench.wer import words
from myna.engines import AudioChunk, WordEvent
from myna.text import normalise
from myna.text.intake import read_text

from inprocess import collect

pytestmark = pytest.mark.asyncio(loop_scope="module")

SENTENCES = json.loads((Path(__file__).parent.parent / "text" / "data" / "agent_sentences.json").read_text())
#: The issue's target.
MAX_WER = 0.10


def compared(text: str) -> str:
    """Lower case, no punctuation, a run of single letters one word ("h r" → "hr")."""
    return re.sub(r"\b([a-z])\s+(?=[a-z]\b)", r"\1", words(text))


@pytest.mark.slow
@pytest.mark.timeout(900)  # (60 renders and transcriptions on a shared CPU)
async def test_the_agent_sentences_are_heard_as_intended(engine, whisper):
    """About 90 s: 60 sentences synthesised, each heard by Whisper on its own (a 30 s window each)."""
    references, heard, misses = [], [], []
    for sentence in SENTENCES:
        stream = engine.stream()
        stream.push_text(sentence["text"])
        stream.end_input()
        items = await collect(stream)
        captions = [i.word for i in items if isinstance(i, WordEvent)]
        assert len(captions) == len(normalise(sentence["text"]).split())  # one word event per written word
        pcm = np.concatenate([i.pcm for i in items if isinstance(i, AudioChunk)])
        segments, _ = whisper.transcribe(soxr.resample(pcm, engine.sample_rate, 16_000).astype(np.float32),
                                         beam_size=1, language="en", vad_filter=False)
        transcript = " ".join(s.text for s in segments)
        reference, hypothesis = compared(sentence["spoken"]), compared(read_text(transcript))
        references.append(reference)
        heard.append(hypothesis)
        if reference != hypothesis:
            misses.append((sentence["text"], transcript.strip(), round(jiwer.wer(reference, hypothesis), 2)))
    wer = jiwer.wer(references, heard)
    print(f"\nnormalisation WER over {len(SENTENCES)} sentences ({sum(len(r.split()) for r in references)} words): "
          f"{wer:.3f}")
    for text, transcript, one in misses:
        print(f"  {one:.2f}  {text!r} → heard {transcript!r}")
    assert wer <= MAX_WER
