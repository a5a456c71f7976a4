"""The plug-ins against a worker with keys: the right token speaks; no token or a wrong one is an
error the framework understands, naming the fix, and nothing crashes (a worker in this process,
tone engine, loopback only)."""

from __future__ import annotations

import asyncio
import datetime
import re
import time

import pytest

from inprocess import ToneEngine
from myna.access import Credentials
from myna.bench.soak import serve_in_process
from myna.integrations.backend import Audio, MynaError, RemoteBackend
from myna.server.app import Worker
from myna.server.auth import Authenticator, mint_token
from myna.limits import Limits

pytestmark = pytest.mark.network

KEY, SECRET = "myna-test-key", "a-test-secret-that-is-long-enough-for-hs256"
HOUR = datetime.timedelta(hours=1)
GOOD = mint_token(KEY, SECRET, "agent", HOUR)
WRONG = mint_token(KEY, "another-secret-of-the-same-length-as-the-key!", "agent", HOUR)
TONE2_ONLY = mint_token(KEY, SECRET, "agent", HOUR, engines=["tone2"])
REPLY = "Sure, your order ships on Friday."
#: (token, contract code, words the message must hold to name the fix)
REFUSALS = [(None, "token_required", "MYNA_TOKEN"), (WRONG, "bad_token", "myna token")]


@pytest.fixture(autouse=True)
def no_access_env(monkeypatch):
    for name in ("MYNA_TOKEN", "MYNA_API_KEY", "MYNA_API_SECRET"):
        monkeypatch.delenv(name, raising=False)


def secured_worker() -> Worker:
    w = Worker(engines={"tone": ToneEngine(), "tone2": ToneEngine("tone2")}, limits=Limits.off())
    w.auth = Authenticator(KEY, SECRET)
    return w


# -- the shared remote backend ---------------------------------------------------------------
async def test_the_remote_backend_sends_its_token_and_a_refusal_is_a_coded_error():
    async with serve_in_process(secured_worker()) as url:
        for token, code, fix in [*REFUSALS, (TONE2_ONLY, "forbidden", "tone")]:
            backend = RemoteBackend(url, engine_name="tone", credentials=Credentials(token))
            with pytest.raises(MynaError) as refused:
                await backend.start()
            assert refused.value.code == code and fix in refused.value.message, refused.value
            await backend.aclose()
        backend = RemoteBackend(url, credentials=Credentials(GOOD))
        await backend.start()
        try:
            turn = await backend.open_turn()
            await turn.push_text("one two")
            await turn.end_input()
            assert b"".join([i.pcm async for i in turn if isinstance(i, Audio)])
        finally:
            await backend.aclose()


# -- Pipecat ---------------------------------------------------------------------------------
async def _pipecat_reply(url: str, **kwargs):
    pytest.importorskip("pipecat")
    from pipecat.frames.frames import LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.tests.utils import run_test

    from myna.integrations.pipecat import MynaTTSService

    service = MynaTTSService(url=url, **kwargs)
    frames = [LLMFullResponseStartFrame(), *(LLMTextFrame(t) for t in re.findall(r"\S+\s*", REPLY)),
              LLMFullResponseEndFrame()]
    params = PipelineParams(audio_out_sample_rate=24_000)
    down, up = await run_test(service, frames_to_send=frames, pipeline_params=params, start_timeout=15.0)
    return service, down, up


async def test_pipecat_with_no_or_a_wrong_token_gets_one_auth_error_frame_and_the_pipeline_ends_cleanly():
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame
    from pipecat.utils.errors import ErrorCategory

    async with serve_in_process(secured_worker()) as url:
        for token, code, fix in REFUSALS:
            started = time.monotonic()
            service, down, up = await _pipecat_reply(url, token=token)
            # The reply's audio context is closed at once: Pipecat does not wait 20-30 s for it.
            assert time.monotonic() - started < 10, time.monotonic() - started
            errors = [f for f in up if isinstance(f, ErrorFrame)]
            assert len(errors) == 1, [f.error for f in errors]
            assert code in errors[0].error and fix in errors[0].error, errors[0].error
            assert errors[0].category is ErrorCategory.AUTHENTICATION and not errors[0].fatal
            assert not service.is_usable and not [f for f in down if isinstance(f, TTSAudioRawFrame)]


async def test_pipecat_with_the_right_token_speaks(monkeypatch):
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame

    async with serve_in_process(secured_worker()) as url:
        for kwargs, env in (({"token": GOOD}, {}), ({}, {"MYNA_TOKEN": GOOD}),
                            ({}, {"MYNA_API_KEY": KEY, "MYNA_API_SECRET": SECRET})):
            for name, value in env.items():
                monkeypatch.setenv(name, value)
            service, down, up = await _pipecat_reply(url, **kwargs)
            assert not [f for f in up if isinstance(f, ErrorFrame)] and service.is_usable, (kwargs, env)
            assert [f for f in down if isinstance(f, TTSAudioRawFrame)], (kwargs, env)
            for name in env:
                monkeypatch.delenv(name)


# -- LiveKit Agents --------------------------------------------------------------------------
async def _livekit_reply(tts) -> list:
    async with tts.stream() as stream:
        for t in re.findall(r"\S+\s*", REPLY):
            stream.push_text(t)
        stream.end_input()
        async with asyncio.timeout(60):
            return [ev async for ev in stream]


async def test_livekit_with_no_or_a_wrong_token_raises_a_401_that_is_not_retried():
    pytest.importorskip("livekit.agents")
    from livekit.agents import APIStatusError

    from myna.integrations import livekit as myna_livekit

    async with serve_in_process(secured_worker()) as url:
        for token, code, fix in REFUSALS:
            tts = myna_livekit.TTS(url=url, token=token)
            errors = []
            tts.on("error", errors.append)
            try:
                with pytest.raises(APIStatusError) as refused:
                    await _livekit_reply(tts)
                assert refused.value.status_code == 401 and not refused.value.retryable
                assert refused.value.body["code"] == code and fix in refused.value.message, refused.value
                assert len(errors) == 1 and not errors[0].recoverable  # reported once: no retries
            finally:
                await tts.aclose()


async def test_livekit_with_the_right_token_speaks():
    pytest.importorskip("livekit.agents")
    from myna.integrations import livekit as myna_livekit

    async with serve_in_process(secured_worker()) as url:
        tts = myna_livekit.TTS(url=url, token=GOOD)
        try:
            events = await _livekit_reply(tts)
        finally:
            await tts.aclose()
    assert events and sum(len(ev.frame.data) for ev in events) > 0
