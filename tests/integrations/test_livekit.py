"""The LiveKit Agents plug-in through the framework's own stream API (``livekit-agents``).

Both modes: in-process engine and a worker on loopback (``network``: run in the namespace).
"""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

pytest.importorskip("livekit.agents")

from livekit.agents.metrics import TTSMetrics  # noqa: E402

from myna.audio.onset import first_audible_sample  # noqa: E402
from myna.integrations import livekit as myna_livekit  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the engine fixture's loop

FIRST = "Sure, I can help with that."
SECOND = "Your order ships on Friday."


def tokens(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


def pcm_of(events) -> np.ndarray:
    return np.concatenate([np.frombuffer(ev.frame.data, dtype=np.int16) for ev in events])


@pytest.mark.slow
async def test_stream_segments_audio_rate_and_metrics(myna_kwargs):
    tts = myna_livekit.TTS(**myna_kwargs, sample_rate=24_000)
    assert tts.capabilities.streaming and tts.sample_rate == 24_000 and tts.num_channels == 1
    metrics: list[TTSMetrics] = []
    tts.on("metrics_collected", metrics.append)
    events = []
    try:
        async with tts.stream() as stream:
            for t in tokens(FIRST):
                stream.push_text(t)
            stream.flush()
            stream.end_input()
            async with asyncio.timeout(60):
                async for ev in stream:
                    events.append(ev)
        await asyncio.sleep(0)  # let the metrics task publish
    finally:
        await tts.aclose()
    assert events and {ev.frame.sample_rate for ev in events} == {24_000}
    assert {ev.frame.num_channels for ev in events} == {1}
    segment_ids = {ev.segment_id for ev in events}
    assert len(segment_ids) == 1 and "" not in segment_ids
    assert [ev.is_final for ev in events].count(True) == 1 and events[-1].is_final
    pcm = pcm_of(events)
    assert 0.8 < len(pcm) / 24_000 < 5 and first_audible_sample(pcm, 24_000) is not None
    assert len(metrics) == 1 and 0 < metrics[0].ttfb < 10 and metrics[0].segment_id in segment_ids
    mode = "remote" if "url" in myna_kwargs else "in-process"
    print(f"livekit TTFB ({mode}): {metrics[0].ttfb * 1000:.0f} ms")


async def test_two_streams_give_two_segments(myna_kwargs):
    """One stream per segment (the framework's current rule); each gets its own segment id."""
    tts = myna_livekit.TTS(**myna_kwargs)
    seen = []
    try:
        for text in (FIRST, SECOND):
            async with tts.stream() as stream:
                for t in tokens(text):
                    stream.push_text(t)
                stream.end_input()
                seen.append([ev async for ev in stream])
    finally:
        await tts.aclose()
    ids = [{ev.segment_id for ev in events} for events in seen]
    assert all(len(i) == 1 for i in ids) and ids[0] != ids[1]
    rate = 24_000 if "url" in myna_kwargs else 22_050  # remote default / Piper's native rate
    assert {ev.frame.sample_rate for events in seen for ev in events} == {rate}


async def test_synthesize_returns_the_whole_utterance(myna_kwargs):
    tts = myna_livekit.TTS(**myna_kwargs, sample_rate=16_000)
    try:
        frame = await asyncio.wait_for(tts.synthesize(SECOND).collect(), 60)
    finally:
        await tts.aclose()
    assert frame.sample_rate == 16_000 and frame.num_channels == 1
    assert 0.8 < frame.duration < 5
    assert first_audible_sample(np.frombuffer(frame.data, dtype=np.int16), 16_000) is not None


async def test_closing_a_stream_mid_speech_cancels_the_turn_and_the_tts_keeps_working(myna_kwargs):
    tts = myna_livekit.TTS(**myna_kwargs)
    try:
        stream = tts.stream()
        for t in tokens(" ".join([FIRST, SECOND] * 8)):
            stream.push_text(t)
        stream.end_input()
        async with asyncio.timeout(60):
            first = await stream.__anext__()
        assert first.frame.samples_per_channel > 0
        await stream.aclose()  # barge-in: the framework closes the stream
        frame = await asyncio.wait_for(tts.synthesize(FIRST).collect(), 60)
        assert frame.duration > 0.8
    finally:
        await tts.aclose()


# -- segments with nothing to say -----------------------------------------------------


@pytest.mark.parametrize("nothing", ["...", ":)", "**", "👍", "<break time='1s'/>"])
async def test_a_segment_with_nothing_to_say_is_no_error_and_no_retry(myna_kwargs, nothing):
    tts = myna_livekit.TTS(**myna_kwargs)
    errors = []
    tts.on("error", errors.append)
    try:
        for _ in range(4):  # more than LiveKit's limit of unrecoverable errors per session
            async with tts.stream() as stream:
                stream.push_text(nothing)
                stream.end_input()
                async with asyncio.timeout(5):  # a retry would take seconds
                    events = [ev async for ev in stream]
            assert events and events[-1].is_final
            pcm = pcm_of(events)
            assert first_audible_sample(pcm, tts.sample_rate) is None  # nothing spoken
        async with tts.stream() as stream:
            for t in tokens(SECOND):
                stream.push_text(t)
            stream.end_input()
            async with asyncio.timeout(60):
                pcm = pcm_of([ev async for ev in stream])
        assert len(pcm) / tts.sample_rate > 0.8 and first_audible_sample(pcm, tts.sample_rate) is not None
    finally:
        await tts.aclose()
    assert errors == []


async def test_synthesize_of_nothing_to_say_is_no_error(myna_kwargs):
    tts = myna_livekit.TTS(**myna_kwargs)
    try:
        async with asyncio.timeout(5):
            frame = await tts.synthesize(":)").collect()
    finally:
        await tts.aclose()
    assert first_audible_sample(np.frombuffer(frame.data, dtype=np.int16), tts.sample_rate) is None


async def test_a_segment_in_another_script_is_no_error_and_the_rest_is_spoken(myna_kwargs, caplog):
    tts = myna_livekit.TTS(**myna_kwargs)
    errors = []
    tts.on("error", errors.append)
    try:
        for text, audible in (("Привет", False), ("Hello Привет, how are you?", True)):
            async with tts.stream() as stream:
                stream.push_text(text)
                stream.end_input()
                async with asyncio.timeout(30):
                    pcm = pcm_of([ev async for ev in stream])
            assert (first_audible_sample(pcm, tts.sample_rate) is not None) == audible
    finally:
        await tts.aclose()
    assert errors == []
    assert sum("unsupported_language" in r.getMessage() and "Cyrillic" in r.getMessage() for r in caplog.records) == 2


# -- a closed stream cancels its own turn only ----------------------------------------

LONG = " ".join([FIRST, SECOND] * 8)
OTHER = "Thanks for waiting, I found your booking and the table is ready."


@pytest.mark.parametrize("closed", ["stream", "chunked"])
async def test_closing_one_stream_cancels_its_turn_only_and_the_other_in_flight_plays_whole(myna_kwargs, closed):
    """How the framework throws away a reply (an interruption, a preemptive generation whose
    user went on): ``aclose()`` on its ``SynthesizeStream`` or ``ChunkedStream``. Another stream
    of the same TTS, in flight at the same time, is heard whole; the closed one stops."""
    tts = myna_livekit.TTS(**myna_kwargs)
    try:
        reference = await asyncio.wait_for(tts.synthesize(OTHER).collect(), 60)

        if closed == "stream":
            doomed = tts.stream()
            for t in tokens(LONG):
                doomed.push_text(t)
            doomed.end_input()
        else:
            doomed = tts.synthesize(LONG)
        kept = tts.stream()
        for t in tokens(OTHER):
            kept.push_text(t)
        kept.end_input()
        async with asyncio.timeout(60):
            first_doomed = await doomed.__anext__()
            kept_events = [await kept.__anext__()]  # both in flight
        assert first_doomed.frame.samples_per_channel > 0
        await doomed.aclose()
        async with asyncio.timeout(60):
            kept_events += [ev async for ev in kept]
        await kept.aclose()
        with pytest.raises(StopAsyncIteration):  # nothing more of the closed one
            await doomed.__anext__()
        again = await asyncio.wait_for(tts.synthesize(FIRST).collect(), 60)  # the TTS keeps working
    finally:
        await tts.aclose()
    kept_s = len(pcm_of(kept_events)) / tts.sample_rate
    assert kept_s > 0.9 * reference.duration, (kept_s, reference.duration)
    assert again.duration > 0.8
