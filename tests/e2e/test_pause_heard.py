"""``pause`` after 1 s of a turn, ``resume`` after 2 s, on the paced output with the embedded
voice: the whole output, transcribed (Whisper tiny.en), has every word of the reply once, the
cut word repeated whole and not half; nothing is heard during the pause."""

from __future__ import annotations

import asyncio
import re

import jiwer
import numpy as np
import soxr

from myna.audio.playout import FRAME_SECONDS, Playout, SAMPLE_RATE
from myna.engines.build import EngineOptions, build_engines
from myna.messages import EndTurn, Pause, Resume, Text
from myna.metrics import Metrics
from myna.session import Session

REPLY = "The weather today is sunny with a light breeze from the west, so bring a jacket for the evening."


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


async def test_pause_then_resume_is_heard_once_with_the_cut_word_whole(whisper):
    engines = build_engines(EngineOptions(engines="piper", phrase_cache_mb=0.0, piper_seed=0))
    await engines.start()
    now = [0.0]
    sent: list = []
    session = Session(engines["piper"], Playout.for_session, sent.append, Metrics(), clock=lambda: now[0])
    try:
        session.handle(Text("t", REPLY))
        session.handle(EndTurn("t"))
        async with asyncio.timeout(60):  # the whole turn synthesised, so frames never wait on it
            while not session.output._by_id["t"].ended:
                await asyncio.sleep(0.05)

        def frame():
            now[0] += FRAME_SECONDS
            return session.output.next_frame(due=now[0])

        heard = [frame() for _ in range(50)]  # 1 s
        session.handle(Pause())
        [paused] = [e for e in sent if e.type == "paused"]
        heard.append(frame())  # the 5 ms fade-out
        quiet = [frame() for _ in range(100)]  # 2 s
        assert not any(f.any() for f in quiet)  # no audio leaks during the pause
        heard += quiet
        session.handle(Resume())
        for _ in range(1500):
            heard.append(frame())
            if any(e.type == "turn_done" for e in sent):
                break
        done = [e for e in sent if e.type == "turn_done"][0]
        assert not done.interrupted
    finally:
        await session.close()
    words = [e for e in sent if e.type == "word"]
    cut = [w.word for w in words if w.start_ms == paused.resume_ms]
    assert len(cut) == 2  # the cut word's event, before the pause and again after it
    audio = np.concatenate(heard).astype(np.float32) / 32768
    segments, _ = whisper.transcribe(soxr.resample(audio, SAMPLE_RATE, 16_000), beam_size=1, language="en",
                                     vad_filter=False)
    text = _words(" ".join(s.text for s in segments))
    reply = _words(REPLY)
    assert jiwer.wer(" ".join(reply), " ".join(text)) <= 0.1, (text, cut)
    cut_word = _words(cut[0])[0]
    assert text.count(cut_word) == reply.count(cut_word), (text, cut_word)  # heard once, whole
