"""Frameworks' own OpenAI TTS services, pointed at a running ``myna serve`` by ``base_url``,
speaking in a pipeline; heard by the bundled Whisper tiny.en. Loopback only.

Pipecat's ``OpenAITTSService`` (``pipecat.services.openai.tts``) accepts only OpenAI's voice
names and its default model ``gpt-4o-mini-tts``: both mean the worker's defaults.

LiveKit Agents' OpenAI plug-in (``livekit-plugins-openai``) speaks in a real ``AgentSession``
(no room, no LLM: ``session.say``), its audio output a recorder. It asks for
``stream_format: "sse"`` with every model but ``tts-1``/``tts-1-hd`` (its default is
``gpt-4o-mini-tts`` and mp3), and for the plain audio body with those two; both are driven.
"""

from __future__ import annotations

import asyncio
import re
import time

import jiwer
import numpy as np
import pytest
import soxr

pytest.importorskip("pipecat")
pytest.importorskip("livekit.plugins.openai")

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
from livekit import rtc  # noqa: E402
from livekit.agents import Agent, AgentSession  # noqa: E402
from livekit.agents.voice import io as lk_io  # noqa: E402
from livekit.plugins import openai as lk_openai  # noqa: E402

pytestmark = pytest.mark.network

RATE = 24_000  # OpenAI's pcm
REPLY = "Sure, I can help with that. Your order ships on Friday, and the tracking number comes by email."

OTHER = "Thanks for waiting. I found your booking, and the table for four is ready at seven tonight."


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def _heard(whisper, pcm: np.ndarray, rate: int) -> str:
    segments, _ = whisper.transcribe(soxr.resample(pcm, rate, 16_000), beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments)


@pytest.mark.slow
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
    assert jiwer.wer(_words(REPLY), _words(_heard(whisper, pcm, RATE))) <= 0.1


class RecordingOutput(lk_io.AudioOutput):
    """An ``AgentSession``'s audio output that keeps every frame and "plays" it at once."""

    def __init__(self):
        super().__init__(label="recorder", capabilities=lk_io.AudioOutputCapabilities(pause=False))
        self.frames: list[rtc.AudioFrame] = []
        self._pushed_s = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if not self._pushed_s:
            self.on_playback_started(created_at=time.time())
        self.frames.append(frame)
        self._pushed_s += frame.duration

    def flush(self) -> None:
        super().flush()
        self.on_playback_finished(playback_position=self._pushed_s, interrupted=False)

    def clear_buffer(self) -> None:
        pass


@pytest.mark.parametrize("model, fmt", [("gpt-4o-mini-tts", "mp3"), ("tts-1", "pcm")],
                         ids=["sse-mp3-default", "audio-pcm"])
async def test_livekit_openai_tts_plugin_speaks_in_an_agent_session_through_myna(worker, whisper, model, fmt):
    tts = lk_openai.TTS(base_url=worker.url + "/v1", api_key="no-key-needed", model=model, response_format=fmt)
    errors = []
    tts.on("error", errors.append)
    session = AgentSession(tts=tts)
    output = RecordingOutput()
    session.output.audio = output
    await session.start(Agent(instructions="Read replies aloud."), record=False)
    try:
        handle = session.say(REPLY)
        await asyncio.wait_for(handle.wait_for_playout(), 60)
        assert not handle.interrupted
    finally:
        await session.aclose()
        await tts.aclose()
    assert errors == []
    assert len(output.frames) > 2 and {f.sample_rate for f in output.frames} == {RATE}
    pcm = np.concatenate([np.frombuffer(f.data, np.int16) for f in output.frames]).astype(np.float32) / 32768
    assert 3 < len(pcm) / RATE < 12
    assert jiwer.wer(_words(REPLY), _words(_heard(whisper, pcm, RATE))) <= 0.1


@pytest.mark.slow
async def test_livekit_openai_tts_plugin_synthesize_streams_through_myna(worker, whisper):
    """The plug-in's public ``synthesize`` (what the session's stream adapter calls per
    sentence): audio frames arrive as the worker streams them, the first long before the last.
    (A text of its own: the worker's phrase cache would hand a text spoken before back at once.)"""
    tts = lk_openai.TTS(base_url=worker.url + "/v1", api_key="no-key-needed")
    arrivals, frames = [], []
    try:
        async with tts.synthesize(OTHER) as stream:
            async for event in stream:
                arrivals.append(time.monotonic())
                frames.append(event.frame)
    finally:
        await tts.aclose()
    pcm = np.concatenate([np.frombuffer(f.data, np.int16) for f in frames]).astype(np.float32) / 32768
    assert len(frames) > 2 and arrivals[-1] - arrivals[0] > 0.3, arrivals  # streamed, not one piece at the end
    assert jiwer.wer(_words(OTHER), _words(_heard(whisper, pcm, RATE))) <= 0.1


# -- replies with nothing to say: no error in either framework -----------------------------------
#: What an LLM's reply may end with, or be: each a request of its own to the speech endpoint.
NOTHING_TO_SAY = ["\U0001F44D", "\u2026"]


@pytest.mark.parametrize("reply", [*NOTHING_TO_SAY, "Sure, it's done. \U0001F44D"], ids=["thumbs-up", "ellipsis",
                                                                                       "sentence-then-emoji"])
async def test_pipecat_openai_tts_service_gets_no_error_for_a_reply_with_nothing_to_say(worker, reply):
    """Pipecat's own ``OpenAITTSService`` sends a trailing "👍" (or a lone "…") as a request of
    its own; the worker answers it with a moment of silence (200), not a 400 that Pipecat turns
    into an ``ErrorFrame`` for every such reply."""
    service = OpenAITTSService(api_key="no-key-needed", base_url=worker.url + "/v1", sample_rate=RATE)
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in re.findall(r"\S+\s*", reply)),
              LLMFullResponseEndFrame()]
    down, up = await run_test(service, frames_to_send=frames, pipeline_params=PipelineParams(audio_out_sample_rate=RATE),
                              start_timeout=15.0)
    assert not [f for f in [*down, *up] if isinstance(f, ErrorFrame)]
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    pcm = np.frombuffer(b"".join(f.audio for f in audio), dtype="<i2")
    if reply in NOTHING_TO_SAY:  # it was sent, and answered: 10 ms of silence
        assert len(pcm) == RATE // 100 and not pcm.any()
    else:  # the sentence, then the emoji's silence
        assert len(pcm) / RATE > 0.5 and not pcm[-RATE // 100:].any()


@pytest.mark.parametrize("model, fmt", [("gpt-4o-mini-tts", "mp3"), ("tts-1", "pcm")],
                         ids=["sse-mp3-default", "audio-pcm"])
@pytest.mark.parametrize("text", NOTHING_TO_SAY, ids=["thumbs-up", "ellipsis"])
async def test_livekit_openai_tts_plugin_gets_no_error_for_text_with_nothing_to_say(worker, model, fmt, text):
    """LiveKit's TTS raises ``APIError`` ("no audio frames were pushed") for a text that gets no
    audio at all: the worker's moment of silence is audio, so nothing is raised or retried."""
    tts = lk_openai.TTS(base_url=worker.url + "/v1", api_key="no-key-needed", model=model, response_format=fmt)
    errors = []
    tts.on("error", errors.append)
    try:
        async with tts.synthesize(text) as stream:
            frames = [event.frame async for event in stream]
    finally:
        await tts.aclose()
    assert errors == []
    pcm = np.concatenate([np.frombuffer(f.data, np.int16) for f in frames])
    assert 0 < len(pcm) / RATE <= 0.1 and np.abs(pcm).max() <= 1
