"""``cancel`` of the second of three queued turns on the WebSocket of a running ``myna serve``
(the embedded voice): turns 1 and 3 are heard whole (Whisper tiny.en), turn 2 not at all."""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import jiwer
import numpy as np
import pytest
import soxr

pytestmark = pytest.mark.network

TURNS = {
    "1": "The weather today is sunny with a light breeze from the west.",
    "2": "Elephants dance quietly beneath purple umbrellas.",
    "3": "Thank you for calling, your order will arrive on Friday.",
}


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def heard(whisper, pcm: bytes, rate: int) -> str:
    audio = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768
    segments, _ = whisper.transcribe(soxr.resample(audio, rate, 16_000), beam_size=1, language="en", vad_filter=False)
    return _words(" ".join(s.text for s in segments))


async def test_cancel_of_the_second_of_three_queued_turns_is_not_heard(worker, whisper):
    audio: dict[str, bytearray] = {}
    done: dict[str, dict] = {}
    async with aiohttp.ClientSession() as http, http.ws_connect(worker.url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
        rate = (await ws.receive_json())["sample_rate"]
        for turn_id, text in TURNS.items():
            await ws.send_json({"type": "text", "turn_id": turn_id, "text": text})
            await ws.send_json({"type": "end_turn", "turn_id": turn_id})
        await ws.send_json({"type": "cancel", "turn_id": "2"})
        current = None
        async with asyncio.timeout(90):
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    audio[current] += msg.data
                    continue
                event = json.loads(msg.data)
                assert event["type"] != "error", event
                if event["type"] == "turn_started":
                    current = event["turn_id"]
                    audio[current] = bytearray()
                elif event["type"] == "turn_done":
                    done[event["turn_id"]] = event
                    current = None
                    if event["turn_id"] == "3":
                        break
    assert list(done) == ["1", "2", "3"] and done["2"]["interrupted"] and done["2"]["audio_ms"] == 0
    assert not done["1"].get("interrupted") and not done["3"].get("interrupted")
    assert len(audio["2"]) == 0
    for turn_id in ("1", "3"):
        assert jiwer.wer(_words(TURNS[turn_id]), heard(whisper, bytes(audio[turn_id]), rate)) <= 0.1, turn_id
