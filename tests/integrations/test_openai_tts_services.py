"""Frameworks' own OpenAI TTS services, pointed at a running ``myna serve`` by ``base_url``,
speaking in a pipeline; heard by the bundled Whisper tiny.en. Loopback only.

Pipecat's ``OpenAITTSService`` (``pipecat.services.openai.tts``) accepts only OpenAI's voice
names and its default model ``gpt-4o-mini-tts``: both mean the worker's defaults. LiveKit Agents'
OpenAI plug-in (``livekit-plugins-openai``) is not installed here, so it is not driven.
"""

from __future__ import annotations

import re

import jiwer
import numpy as np
import pytest
import soxr

pytest.importorskip("pipecat")

from pipecat.frames.frames import (  # noqa: E402
    ErrorFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.worker import PipelineParams  # noqa: E402
from pipecat.services.openai.tts import OpenAITTSService  # noqa: E402
from pipecat.tests.utils import run_test  # noqa: E402

pytestmark = pytest.mark.network

RATE = 24_000  # OpenAI's pcm
REPLY = "Sure, I can help with that. Your order ships on Friday, and the tracking number comes by email."


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


async def test_pipecat_openai_tts_service_speaks_through_myna(worker, whisper):
    service = OpenAITTSService(api_key="no-key-needed", base_url=worker.url + "/v1", sample_rate=RATE)
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in re.findall(r"\S+\s*", REPLY)),
              LLMFullResponseEndFrame()]
    down, _ = await run_test(service, frames_to_send=frames, pipeline_params=PipelineParams(audio_out_sample_rate=RATE),
                             start_timeout=15.0)
    assert not [f for f in down if isinstance(f, ErrorFrame)]
    assert any(isinstance(f, TTSStartedFrame) for f in down) and any(isinstance(f, TTSStoppedFrame) for f in down)
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert {f.sample_rate for f in audio} == {RATE} and len(audio) > 2
    pcm = np.frombuffer(b"".join(f.audio for f in audio), dtype="<i2").astype(np.float32) / 32768
    assert 3 < len(pcm) / RATE < 12
    segments, _ = whisper.transcribe(soxr.resample(pcm, RATE, 16_000), beam_size=1, language="en", vad_filter=False)
    assert jiwer.wer(_words(REPLY), _words(" ".join(s.text for s in segments))) <= 0.1
