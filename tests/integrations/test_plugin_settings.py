"""Voice and speed changed mid-session on both plug-ins, through the frameworks' own
settings calls: Pipecat's ``TTSUpdateSettingsFrame`` and LiveKit Agents' ``update_options``.

A change applies from the next turn (reply / segment) without reconnecting; a bad value is a
clear error and the session goes on. The second voice is the bundled model under another name
with its config's ``length_scale`` at 1.6 (a slower reader), so which voice spoke shows in the
length of the audio: speed 1.5 makes a turn 0.6-0.75 of its length at 1.0, the slow voice makes
it 1.2 times longer or more.

Both modes: in-process engine and a worker on loopback started with ``--piper-voice``
(``network``: run in the namespace).
"""

from __future__ import annotations

import asyncio
import re

import pytest
import pytest_asyncio

pytest.importorskip("pipecat")
pytest.importorskip("livekit.agents")

from pipecat.frames.frames import (  # noqa: E402
    ErrorFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.worker import PipelineParams  # noqa: E402
from pipecat.tests.utils import run_test  # noqa: E402

from myna.engines.piper import PiperEngine  # noqa: E402
from myna.integrations import livekit as myna_livekit  # noqa: E402
from myna.integrations.pipecat import MynaTTSService  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

RATE = 24_000
SLOW = "en_GB-slow-medium"
TEXT = "Your table for four is booked for Friday evening at seven."



@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def two_voice_engine(slow_voice):
    e = PiperEngine(workers=1, seed=0, more_voices=[slow_voice])
    await e.start()
    yield e
    await e.close()


@pytest.fixture(scope="module")
def two_voice_worker(start_worker, slow_voice):
    return start_worker("--piper-seed", "0", "--piper-voice", slow_voice, "--offer-rate", "0",
                        "--max-sessions-per-client", "0", "--max-sessions", "32", "--peer-timeout", "3")


@pytest.fixture(params=["local", pytest.param("remote", marks=pytest.mark.network)])
def kwargs(request, two_voice_engine):
    if request.param == "local":
        return {"engine": two_voice_engine}
    return {"url": request.getfixturevalue("two_voice_worker").url}


# -- Pipecat -----------------------------------------------------------------------------------
def llm_reply(text: str) -> list:
    return [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in re.findall(r"\S+\s*", text)),
            LLMFullResponseEndFrame()]


def settings(**fields) -> TTSUpdateSettingsFrame:
    return TTSUpdateSettingsFrame(delta=MynaTTSService.Settings(**fields))


async def pipecat_lengths(service, frames) -> tuple[list[float], list[str]]:
    """Seconds of audio per context, in order, and the error frames' messages."""
    down, up = await run_test(service, frames_to_send=frames, expected_up_frames=None,
                              pipeline_params=PipelineParams(audio_out_sample_rate=RATE), start_timeout=15.0)
    by_context: dict[str, int] = {}
    for f in down:
        if isinstance(f, TTSAudioRawFrame):
            by_context[f.context_id] = by_context.get(f.context_id, 0) + len(f.audio) // 2
    return [n / RATE for n in by_context.values()], [f.error for f in up if isinstance(f, ErrorFrame)]


@pytest.mark.slow
async def test_pipecat_settings_frame_changes_speed_then_voice_from_the_next_reply(kwargs):
    frames = [*llm_reply(TEXT), settings(speed=1.5), *llm_reply(TEXT), settings(voice=SLOW, speed=1.0),
              *llm_reply(TEXT)]
    lengths, errors = await pipecat_lengths(MynaTTSService(**kwargs), frames)
    assert errors == [] and len(lengths) == 3, (lengths, errors)
    plain, fast, slow = lengths
    print(f"pipecat: 1.0 {plain:.2f} s, 1.5 {fast:.2f} s, {SLOW} {slow:.2f} s")
    assert 0.6 < fast / plain < 0.75
    assert slow / plain > 1.2


async def test_pipecat_bad_settings_are_error_frames_and_the_next_reply_keeps_the_old_ones(kwargs):
    frames = [settings(speed=1.5), *llm_reply(TEXT), settings(speed=9), *llm_reply(TEXT),
              settings(voice="no-such-voice"), *llm_reply(TEXT), settings(speed=1.0), *llm_reply(TEXT)]
    lengths, errors = await pipecat_lengths(MynaTTSService(**kwargs), frames)
    assert len(errors) == 2, errors
    assert "speed" in errors[0] and "bad_speed" in errors[0] and "0.5" in errors[0]
    assert "unknown_voice" in errors[1] and "no-such-voice" in errors[1]
    assert len(lengths) == 4, lengths
    first, after_bad_speed, after_bad_voice, plain = lengths
    assert abs(after_bad_speed / first - 1) < 0.1 and abs(after_bad_voice / first - 1) < 0.1  # still 1.5, default voice
    assert 0.6 < first / plain < 0.75


async def test_pipecat_legacy_settings_dict_and_constructor_speed(kwargs):
    frames = [*llm_reply(TEXT), TTSUpdateSettingsFrame(settings={"speed": 1.0}), *llm_reply(TEXT)]
    lengths, errors = await pipecat_lengths(MynaTTSService(speed=1.5, **kwargs), frames)
    assert errors == [] and len(lengths) == 2
    assert 0.6 < lengths[0] / lengths[1] < 0.75
    with pytest.raises(Exception, match="bad_speed"):
        MynaTTSService(speed=3, **kwargs)


# -- LiveKit Agents ----------------------------------------------------------------------------
async def livekit_segment(tts, text: str = TEXT) -> float:
    """Seconds of audio of one streamed segment."""
    async with tts.stream() as stream:
        for t in re.findall(r"\S+\s*", text):
            stream.push_text(t)
        stream.end_input()
        async with asyncio.timeout(60):
            samples = sum([len(ev.frame.data) // 2 async for ev in stream])
    return samples / tts.sample_rate


@pytest.mark.slow
async def test_livekit_update_options_changes_speed_then_voice_from_the_next_segment(kwargs):
    tts = myna_livekit.TTS(**kwargs)
    try:
        plain = await livekit_segment(tts)
        tts.update_options(speed=1.5)
        fast = await livekit_segment(tts)
        tts.update_options(voice=SLOW, speed=1.0)
        slow = await livekit_segment(tts)
    finally:
        await tts.aclose()
    print(f"livekit: 1.0 {plain:.2f} s, 1.5 {fast:.2f} s, {SLOW} {slow:.2f} s")
    assert 0.6 < fast / plain < 0.75
    assert slow / plain > 1.2


@pytest.mark.slow
async def test_livekit_bad_options_raise_and_the_tts_keeps_speaking_with_the_old_ones(kwargs):
    tts = myna_livekit.TTS(**kwargs, speed=1.5)
    try:
        fast = await livekit_segment(tts)  # (a remote TTS has met its worker and knows its voices now)
        with pytest.raises(ValueError, match=r"bad_speed.*0\.5"):
            tts.update_options(speed=0.1)
        with pytest.raises(ValueError, match="unknown_voice.*no-such-voice"):
            tts.update_options(voice="no-such-voice")
        still_fast = await livekit_segment(tts)
        tts.update_options(speed=1.0)
        plain = await livekit_segment(tts)
    finally:
        await tts.aclose()
    assert abs(still_fast / fast - 1) < 0.1
    assert 0.6 < fast / plain < 0.75


async def test_pipecat_language_is_checked_against_the_voice_and_goes_with_the_turn(kwargs):
    from pipecat.transcriptions.language import Language

    frames = [settings(language="fr"), *llm_reply(TEXT), settings(language=Language.EN_GB), *llm_reply(TEXT)]
    lengths, errors = await pipecat_lengths(MynaTTSService(**kwargs), frames)
    assert len(errors) == 1 and "wrong_language" in errors[0] and "en_US" in errors[0], errors
    assert len(lengths) == 2 and all(n > 1.0 for n in lengths)  # both replies spoken (en_US speaks en-GB)


async def test_livekit_language_is_checked_against_the_voice(kwargs):
    tts = myna_livekit.TTS(**kwargs)
    try:
        await livekit_segment(tts)  # (a remote TTS has met its worker and knows its voices now)
        with pytest.raises(ValueError, match="wrong_language.*en_US"):
            tts.update_options(language="fr")
        with pytest.raises(ValueError, match="bad_language"):
            tts.update_options(language="not a tag")
        tts.update_options(language="en-GB")
        assert await livekit_segment(tts) > 1.0
    finally:
        await tts.aclose()
