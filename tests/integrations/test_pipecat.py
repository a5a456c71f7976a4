"""The Pipecat plug-in in a real Pipecat pipeline (``pipecat.tests.utils.run_test``).

Both modes: in-process engine and a worker on loopback (``network``: run in the namespace).
"""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

pytest.importorskip("pipecat")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData  # noqa: E402
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineParams, PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.tests.utils import run_test  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from myna.audio.onset import first_audible_sample  # noqa: E402
from myna.integrations.pipecat import MynaTTSService  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the engine fixture's loop

RATE = 24_000
REPLY = "Sure, I can help with that. Your order ships on Friday."
SECOND = "Thanks for waiting."


def llm_reply(text: str) -> list:
    """An LLM reply as Pipecat streams it: start, token-sized text frames, end."""
    tokens = re.findall(r"\S+\s*", text)
    return [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in tokens), LLMFullResponseEndFrame()]


def words_of(text: str) -> list[str]:
    return re.sub(r"[^a-z ]", "", text.lower()).split()


def pcm_of(frames) -> np.ndarray:
    return np.frombuffer(b"".join(f.audio for f in frames), dtype="<i2")


async def run(service, frames):
    params = PipelineParams(audio_out_sample_rate=RATE, enable_metrics=True)
    down, _ = await run_test(service, frames_to_send=frames, pipeline_params=params, start_timeout=15.0)
    return down


@pytest.mark.slow
async def test_a_streamed_reply_gives_start_audio_words_stop_in_order(myna_kwargs):
    down = await run(MynaTTSService(**myna_kwargs), llm_reply(REPLY))
    tts = [f for f in down if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame))]
    assert isinstance(tts[0], TTSStartedFrame) and isinstance(tts[-1], TTSStoppedFrame)
    audio = [f for f in tts if isinstance(f, TTSAudioRawFrame)]
    assert len(audio) == len(tts) - 2
    assert {f.sample_rate for f in audio} == {RATE} and {f.num_channels for f in audio} == {1}
    assert {f.context_id for f in audio} == {tts[0].context_id}
    pcm = pcm_of(audio)
    assert 1.5 < len(pcm) / RATE < 8 and first_audible_sample(pcm, RATE) is not None
    words = [f for f in down if isinstance(f, TTSTextFrame)]
    assert [w.text.strip().lower().strip(".,") for w in words] == words_of(REPLY)
    pts = [w.pts for w in words]
    assert all(p is not None for p in pts) and pts == sorted(pts) and pts[-1] > pts[0]
    # (Pipecat reports a zero TTFB at pipeline start; the turn's is the first non-zero one.)
    ttfb = [d for f in down if isinstance(f, MetricsFrame) for d in f.data if isinstance(d, TTFBMetricsData) and d.value]
    assert len(ttfb) == 1 and 0 < ttfb[0].value < 10
    print(f"pipecat TTFB ({'remote' if 'url' in myna_kwargs else 'in-process'}): {ttfb[0].value * 1000:.0f} ms")


#: A reply whose first clause (~20 words) takes Piper a while to synthesise.
SLOW_START = ("Well let me look at the details of your order and the shipping options that we have "
              "available for you today, " + " ".join([REPLY] * 10))  # ~45 s of speech


class Recorder(FrameProcessor):
    """Pipeline sink: records downstream frames, flags the first TTS start and audio."""

    def __init__(self):
        super().__init__(enable_direct_mode=True)
        self.frames: list = []
        self.started = asyncio.Event()
        self.audio = asyncio.Event()
        self.first_audio_at: float | None = None  # event-loop time of the first audio frame

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.frames.append(frame)
            if isinstance(frame, TTSStartedFrame):
                self.started.set()
            elif isinstance(frame, TTSAudioRawFrame):
                self.audio.set()
                if self.first_audio_at is None:
                    self.first_audio_at = asyncio.get_running_loop().time()
        await self.push_frame(frame, direction)


@pytest.mark.parametrize("when", ["before_first_audio", "mid_audio"])
async def test_no_audio_of_the_old_context_after_an_interruption(myna_kwargs, when):
    """Barge-in once the reply's context is open (before any audio) or once audio flows."""
    recorder = Recorder()
    worker = PipelineWorker(Pipeline([MynaTTSService(**myna_kwargs), recorder]), cancel_on_idle_timeout=False,
                            params=PipelineParams(audio_out_sample_rate=RATE))
    running = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        running.set()

    async def drive():
        await asyncio.wait_for(running.wait(), 15)
        for frame in llm_reply(SLOW_START):
            await worker.queue_frame(frame)
        await asyncio.wait_for((recorder.started if when == "before_first_audio" else recorder.audio).wait(), 30)
        await worker.queue_frame(InterruptionFrame())
        await asyncio.sleep(0.5)
        for frame in llm_reply(SECOND):
            await worker.queue_frame(frame)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 120)

    down = recorder.frames
    cut = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    starts = [f for f in down if isinstance(f, TTSStartedFrame)]
    assert len(starts) == 2 and down.index(starts[0]) < cut < down.index(starts[1])
    old, new = starts[0].context_id, starts[1].context_id
    after = [f for f in down[cut:] if isinstance(f, TTSAudioRawFrame)]
    assert after and all(f.context_id == new for f in after)
    assert 0.5 < len(pcm_of(after)) / RATE < 4  # the second reply, whole
    before = [f for f in down[:cut] if isinstance(f, TTSAudioRawFrame)]
    assert all(f.context_id == old for f in before)
    if when == "before_first_audio":
        assert not before
    else:
        assert before and len(pcm_of(before)) / RATE < 30  # cut short (audio is not paced here)


async def test_a_speak_frame_is_spoken_as_its_own_context(myna_kwargs):
    from pipecat.frames.frames import TTSSpeakFrame

    down = await run(MynaTTSService(**myna_kwargs), [TTSSpeakFrame(SECOND)])
    kinds = [type(f) for f in down if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame))]
    assert kinds[0] is TTSStartedFrame and kinds[-1] is TTSStoppedFrame and TTSAudioRawFrame in kinds
    words = [f.text.strip().lower().strip(".") for f in down if isinstance(f, TTSTextFrame)]
    assert words == words_of(SECOND)


# -- replies as an LLM really writes them ---------------------------------------------

from pipecat.frames.frames import ErrorFrame  # noqa: E402
from pipecat.tests.utils import SleepFrame  # noqa: E402


def errors_in(up) -> list[str]:
    return [f.error for f in up if isinstance(f, ErrorFrame)]


@pytest.mark.parametrize("nothing", ["👍", "...", ":)", "**", "<break time='1s'/>"])
async def test_replies_with_nothing_to_say_are_no_ops_and_the_next_reply_is_spoken(myna_kwargs, nothing):
    service = MynaTTSService(**myna_kwargs)
    frames = []
    for _ in range(3):  # three in a row made Pipecat give the service up
        frames += [*llm_reply(nothing), SleepFrame(0.3)]
    frames += llm_reply(SECOND)
    params = PipelineParams(audio_out_sample_rate=RATE, enable_metrics=True)
    down, up = await run_test(service, frames_to_send=frames, pipeline_params=params, start_timeout=15.0)
    assert errors_in(up) == []
    assert service.is_usable
    starts = [f for f in down if isinstance(f, TTSStartedFrame)]
    assert len(starts) == 1  # only the real reply opened a context
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert audio and {f.context_id for f in audio} == {starts[0].context_id}
    assert [f.text.strip().lower().strip(".") for f in down if isinstance(f, TTSTextFrame)] == words_of(SECOND)


@pytest.mark.slow
async def test_a_reply_that_pauses_after_a_sentence_speaks_the_sentence_at_once(myna_kwargs):
    """A 4.5 s pause inside one reply: the first sentence is heard before the pause ends."""
    recorder = Recorder()
    worker = PipelineWorker(Pipeline([MynaTTSService(**myna_kwargs), recorder]), cancel_on_idle_timeout=False,
                            params=PipelineParams(audio_out_sample_rate=RATE))
    running = asyncio.Event()
    errors: list = []

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        running.set()

    @worker.event_handler("on_pipeline_error")
    async def _error(worker, frame):
        errors.append(frame.error)

    first, second = "Let me check that for you.", "Your order ships on Friday."
    resumed_at = None

    async def drive():
        nonlocal resumed_at
        await asyncio.wait_for(running.wait(), 15)
        await worker.queue_frame(LLMFullResponseStartFrame())
        for token in re.findall(r"\S+\s*|\s+", first):
            await worker.queue_frame(LLMTextFrame(token))
        await asyncio.sleep(4.5)
        resumed_at = asyncio.get_running_loop().time()
        for token in re.findall(r"\s*\S+", " " + second):
            await worker.queue_frame(LLMTextFrame(token))
        await worker.queue_frame(LLMFullResponseEndFrame())
        await asyncio.sleep(3.0)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 60)

    assert recorder.first_audio_at is not None and recorder.first_audio_at < resumed_at - 3.0
    assert not [e for e in errors if "no audio" in str(e)], errors
    spoken = [f.text.strip().lower().strip(".") for f in recorder.frames if isinstance(f, TTSTextFrame)]
    assert spoken == words_of(first) + words_of(second)
    starts = [f for f in recorder.frames if isinstance(f, TTSStartedFrame)]
    assert all(any(isinstance(f, TTSAudioRawFrame) and f.context_id == s.context_id for f in recorder.frames)
               for s in starts)  # no empty started/stopped pair


async def test_a_reply_in_a_script_the_voice_cannot_read_is_reported_not_spoken(myna_kwargs):
    service = MynaTTSService(**myna_kwargs)
    frames = [*llm_reply("Привет, как дела?"), SleepFrame(0.3), *llm_reply("Hello Привет, how are you?"), SleepFrame(0.5)]
    params = PipelineParams(audio_out_sample_rate=RATE)
    down, up = await run_test(service, frames_to_send=frames, pipeline_params=params, start_timeout=15.0)
    errors = errors_in(up)
    assert len(errors) == 2 and all("unsupported_language" in e and "Cyrillic" in e for e in errors)
    assert service.is_usable
    assert len([f for f in down if isinstance(f, TTSStartedFrame)]) == 1
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert 0.5 < len(pcm_of(audio)) / RATE < 3  # "Hello, how are you?" only


FAST_REPLY = ("Your order of three blue shirts ships on Friday from our warehouse in Leeds, and it should "
              "arrive by Tuesday next week. ") * 11  # 242 words


@pytest.mark.slow
@pytest.mark.network
async def test_a_fast_llm_reply_of_1200_tokens_loses_no_word_remotely(worker):
    """The worker's message rate (200/s, burst 400) once dropped most of such a
    reply; the plug-in now coalesces tokens, and the worker never cuts an accepted turn."""
    size = len(FAST_REPLY) / 1200
    tokens = [FAST_REPLY[round(i * size):round((i + 1) * size)] for i in range(1200)]
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in tokens), LLMFullResponseEndFrame()]
    down = await run(MynaTTSService(url=worker.url), frames)
    words = [f.text.strip().lower().strip(".,") for f in down if isinstance(f, TTSTextFrame)]
    assert words == words_of(FAST_REPLY)
    pcm = pcm_of([f for f in down if isinstance(f, TTSAudioRawFrame)])
    assert len(pcm) / RATE > 60  # ~80 s of speech


class UpstreamErrors(FrameProcessor):
    """Pipeline head: records the ErrorFrames pushed upstream, with their event-loop time."""

    def __init__(self):
        super().__init__(enable_direct_mode=True)
        self.errors: list[tuple[float, object]] = []
        self.got = asyncio.Event()

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        from pipecat.frames.frames import ErrorFrame

        if direction == FrameDirection.UPSTREAM and isinstance(frame, ErrorFrame):
            self.errors.append((asyncio.get_running_loop().time(), frame))
            self.got.set()
        await self.push_frame(frame, direction)


@pytest.mark.slow
@pytest.mark.network
async def test_a_frozen_worker_is_an_error_frame_within_the_heartbeat_and_the_next_reply_speaks(start_worker, monkeypatch):
    """A worker frozen mid-turn (SIGSTOP) once hung the plug-in for good."""
    import signal

    from myna.integrations import backend as backend_module

    monkeypatch.setattr(backend_module, "HEARTBEAT_S", 1.0)
    server = start_worker("--peer-timeout", "3", "--max-sessions", "8", "--ws-heartbeat", "1")
    head, recorder = UpstreamErrors(), Recorder()
    worker = PipelineWorker(Pipeline([head, MynaTTSService(url=server.url), recorder]), cancel_on_idle_timeout=False,
                            params=PipelineParams(audio_out_sample_rate=RATE))
    running = asyncio.Event()
    stopped_at: list[float] = []

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        running.set()

    async def drive():
        await asyncio.wait_for(running.wait(), 15)
        for frame in llm_reply(SLOW_START):
            await worker.queue_frame(frame)
        await asyncio.wait_for(recorder.audio.wait(), 30)
        server.proc.send_signal(signal.SIGSTOP)
        stopped_at.append(asyncio.get_running_loop().time())
        await asyncio.wait_for(head.got.wait(), 10)
        server.proc.send_signal(signal.SIGCONT)
        recorder.audio.clear()
        mark = len(recorder.frames)
        for frame in llm_reply(SECOND):
            await worker.queue_frame(frame)
        while not any(isinstance(f, TTSStoppedFrame) for f in recorder.frames[mark:]):
            await asyncio.sleep(0.05)
        await worker.queue_frame(EndFrame())
        return mark

    runner = WorkerRunner()
    await runner.add_workers(worker)
    try:
        _, mark = await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 120)
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.stop()
    at, error = head.errors[0]
    assert "heartbeat_timeout" in error.error and at - stopped_at[0] < 1.0 + 0.5 + 1.5
    second = [f for f in recorder.frames[mark:] if isinstance(f, TTSAudioRawFrame)]
    assert second and len(pcm_of(second)) / RATE > 0.5  # the next reply, on a new connection


# -- each context is its own Myna turn; an interruption cancels the interruptible ones --

KEPT = "Please hold on while I check that for you. It should only take a moment. Thank you for your patience."


async def test_an_interruption_cancels_the_replys_turn_and_an_uninterruptible_context_in_flight_plays_whole(
        myna_kwargs):
    """Two contexts in flight at once, each its own Myna turn: an uninterruptible
    ``TTSSpeakFrame`` (``interruptible = False``; playing) and an LLM reply behind it (synthesising). ``InterruptionFrame``
    cancels the reply's turn (Pipecat drops its context), and the spoken one plays to its last word."""
    from pipecat.frames.frames import TTSSpeakFrame

    recorder = Recorder()
    service = MynaTTSService(**myna_kwargs)
    worker = PipelineWorker(Pipeline([service, recorder]), cancel_on_idle_timeout=False,
                            params=PipelineParams(audio_out_sample_rate=RATE))
    running = asyncio.Event()
    in_flight: dict[str, object] = {}

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        running.set()

    async def drive():
        await asyncio.wait_for(running.wait(), 15)
        speak = TTSSpeakFrame(KEPT)
        speak.interruptible = False  # (a field, not an argument)
        await worker.queue_frame(speak)
        await asyncio.wait_for(recorder.audio.wait(), 30)
        for frame in llm_reply(SLOW_START):
            await worker.queue_frame(frame)
        for _ in range(200):  # the reply's turn is open beside the spoken one's
            if len(service._turns) == 2:
                break
            await asyncio.sleep(0.01)
        in_flight.update(service._turns)
        await worker.queue_frame(InterruptionFrame())
        await asyncio.sleep(3)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.wait_for(asyncio.gather(runner.run(), drive()), 60)

    assert len(in_flight) == 2
    down = recorder.frames
    cut = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    starts = [f for f in down if isinstance(f, TTSStartedFrame)]
    kept = starts[0].context_id
    reply = next(c for c in in_flight if c != kept)
    reply_turn = in_flight[reply]
    assert reply_turn._cancelled and reply_turn._done  # its Myna turn was cancelled, and ended
    assert not [f for f in down[cut:] if getattr(f, "context_id", None) == reply and isinstance(f, TTSAudioRawFrame)]
    kept_audio = [f for f in down if isinstance(f, TTSAudioRawFrame) and f.context_id == kept]
    assert [f for f in kept_audio if down.index(f) > cut]  # it went on after the interruption
    kept_words = [f.text.strip().lower().strip(".,") for f in down
                  if isinstance(f, TTSTextFrame) and f.context_id == kept]
    assert kept_words == words_of(KEPT)  # to its last word
    assert any(isinstance(f, TTSStoppedFrame) and f.context_id == kept for f in down)
