"""The official ``openai`` client against a running ``myna serve`` (the embedded voice), heard by
the bundled Whisper tiny.en; G.711 from the speech endpoint and the WebSocket, decoded by the
textbook decoders (not FFmpeg's), heard the same way. Loopback only.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time

import aiohttp
import av
import jiwer
import numpy as np
import openai
import pytest
import soxr

from g711 import alaw_to_s16, ulaw_to_s16

pytestmark = pytest.mark.network

REPLY = ("The weather today is sunny with a light breeze from the west. "
         "Please remember to bring your notebook to the meeting tomorrow morning. "
         "Our train leaves at seven, so we should pack tonight.")
SENTENCE = "Thank you for calling, your order will arrive on Friday."


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def wer(whisper, reference: str, pcm: np.ndarray, rate: int) -> float:
    """Whisper's word error rate on int16 (or float) mono ``pcm`` at ``rate`` Hz."""
    audio = pcm.astype(np.float32) / (32768.0 if pcm.dtype == np.int16 else 1.0)
    segments, _ = whisper.transcribe(soxr.resample(audio, rate, 16_000), beam_size=1, language="en", vad_filter=False)
    heard = " ".join(s.text for s in segments)
    return jiwer.wer(_words(reference), _words(heard))


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """An encoded file as float32 mono and its rate (PyAV)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
        scale = 32768.0 if pcm.dtype == np.int16 else 1.0
        return pcm.astype(np.float32) / scale, stream.rate


def openai_client(worker) -> openai.OpenAI:
    return openai.OpenAI(base_url=worker.url + "/v1", api_key="no-key-needed", max_retries=0, timeout=120)


@pytest.mark.parametrize("fmt", ["mp3", "wav"])
def test_openai_client_speech_create_is_heard(worker, whisper, fmt):
    speech = openai_client(worker).audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE,
                                                       response_format=fmt)
    pcm, rate = decode(speech.content)
    assert rate == 24_000
    assert wer(whisper, SENTENCE, pcm, rate) <= 0.1


def test_openai_streaming_response_is_heard_and_starts_before_synthesis_ends(worker, whisper):
    """Three sentences, sent whole: the first chunk comes long before the last (the reply is
    streamed as it is synthesised, not made whole first), and the whole is heard."""
    arrivals, chunks = [], []
    t0 = time.monotonic()
    with openai_client(worker).audio.speech.with_streaming_response.create(
            model="piper", voice="alloy", input=REPLY, response_format="pcm") as response:
        assert response.headers["Transfer-Encoding"] == "chunked"
        for chunk in response.iter_bytes():
            arrivals.append(time.monotonic() - t0)
            chunks.append(chunk)
    pcm = np.frombuffer(b"".join(chunks), dtype=np.int16)
    audio_s = len(pcm) / 24_000
    first_s, last_s = arrivals[0], arrivals[-1]
    assert audio_s > 6 and len(chunks) > 3
    # The first audio byte is out before synthesis of the reply has ended (the last byte goes
    # out when its synthesis ends: the output is unpaced), with most of the reply still to come.
    assert first_s < 0.5 * last_s, (first_s, last_s)
    before_last = sum(len(c) for c, t in zip(chunks, arrivals) if t <= first_s + 0.05)
    assert before_last < 0.5 * len(pcm) * 2
    assert wer(whisper, REPLY, pcm, 24_000) <= 0.1


@pytest.mark.parametrize("fmt, decoder", [("pcm_mulaw", ulaw_to_s16), ("pcm_alaw", alaw_to_s16)])
def test_g711_from_the_speech_endpoint_is_heard(worker, whisper, fmt, decoder):
    speech = openai_client(worker).audio.speech.create(model="piper", voice="alloy", input=SENTENCE,
                                                       response_format=fmt)
    assert speech.response.headers["Content-Type"] in ("audio/basic", "audio/x-alaw-basic")
    assert wer(whisper, SENTENCE, decoder(speech.content), 8000) <= 0.15


@pytest.mark.parametrize("fmt, decoder", [("pcm_mulaw", ulaw_to_s16), ("pcm_alaw", alaw_to_s16)])
async def test_g711_on_the_websocket_is_heard(worker, whisper, fmt, decoder):
    async with aiohttp.ClientSession() as http, http.ws_connect(worker.url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
        assert (await ws.receive_json())["type"] == "ready"
        await ws.send_json({"type": "config", "format": fmt})
        ready = await ws.receive_json()
        assert (ready["format"], ready["sample_rate"]) == (fmt, 8000)
        for token in re.findall(r"\S+\s*", SENTENCE):  # as an LLM writes
            await ws.send_json({"type": "text", "turn_id": "t", "text": token})
        await ws.send_json({"type": "end_turn", "turn_id": "t"})
        audio = bytearray()
        async with asyncio.timeout(60):
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio += msg.data
                elif json.loads(msg.data)["type"] == "turn_done":
                    break
    assert wer(whisper, SENTENCE, decoder(bytes(audio)), 8000) <= 0.15


def test_openai_speed_changes_the_pace_heard_and_out_of_range_is_unsupported_speed(worker, whisper):
    """``speed``: 1.5 is 0.6-0.75 of the length at 1.0 and 0.75 is longer, both still
    heard; 3.0 (OpenAI's range, not Myna's) is 400 ``unsupported_speed`` naming 0.5 to 2."""
    client = openai_client(worker)
    lengths, wers = {}, {}
    for speed in (1.0, 1.5, 0.75):
        speech = client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, response_format="pcm",
                                            speed=speed)
        pcm = np.frombuffer(speech.content, dtype="<i2")
        lengths[speed], wers[speed] = len(pcm) / 24_000, wer(whisper, SENTENCE, pcm, 24_000)
    print(f"speech endpoint: seconds {lengths}, WER {wers}")
    assert 0.6 < lengths[1.5] / lengths[1.0] < 0.75 and lengths[0.75] / lengths[1.0] > 1.2
    assert max(wers.values()) <= 0.1
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.speech.create(model="tts-1", voice="alloy", input=SENTENCE, speed=3.0)
    error = refused.value.body
    assert (error["code"], error["param"]) == ("unsupported_speed", "speed") and "0.5 to 2" in error["message"]
