"""Faults that used to stop a session's audio or keep it alive too long, over real WebRTC.

Each runs a worker in this process (tone engine) and an aiortc client on loopback.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from inprocess import ToneEngine, tone
from myna.audio.onset import first_audible_sample
from myna.bench.soak import serve_in_process
from myna.rtc.client import MynaClient
from myna.rtc.ice import rtc_configuration
from myna.server.app import Worker

pytestmark = pytest.mark.network


def audible(client: MynaClient, since: int) -> bool:
    frames = [f for _, f in client.frames[since:]]
    return bool(frames) and first_audible_sample(np.concatenate(frames), 48_000) is not None


async def test_a_48_khz_stereo_engine_is_heard_in_mono_and_audio_keeps_flowing():
    stereo = ToneEngine(sample_rate=48_000, pcm=lambda ms: np.stack([tone(ms, 48_000)] * 2, axis=1))  # [n, 2]
    async with serve_in_process(Worker(engines={"stereo": stereo})) as url, MynaClient(url) as client:
        first = await client.speak("one two three", tokens_per_s=None)
        assert first.event_types()[-1] == "turn_done" and "error" not in first.event_types()
        assert first.events[-1]["audio_ms"] == pytest.approx(3 * 120, abs=20)
        assert first_audible_sample(first.pcm, 48_000) is not None
        frames = len(client.frames)
        second = await client.speak("four five", tokens_per_s=None)
        assert second.event_types()[-1] == "turn_done" and audible(client, frames)


async def test_an_unusable_chunk_is_dropped_with_an_error_and_the_next_turn_speaks():
    calls = []

    def pcm(ms):  # the first chunk is 3-D (no audio layout), the rest are fine
        calls.append(ms)
        return np.zeros((2, 2, 2), np.float32) if len(calls) == 1 else tone(ms)

    async with serve_in_process(Worker(engines={"odd": ToneEngine(pcm=pcm)})) as url, MynaClient(url) as client:
        result = await client.speak("one two", tokens_per_s=None)
        errors = [e for e in result.events if e["type"] == "error"]
        assert [e["code"] for e in errors] == ["bad_audio"] and result.event_types()[-1] == "turn_done"
        assert result.events[-1]["audio_ms"] == pytest.approx(120, abs=20)  # the second word only
        frames = len(client.frames)
        assert (await client.speak("three", tokens_per_s=None)).event_types()[-1] == "turn_done"
        assert audible(client, frames)


async def offer_with_max_message_size(url: str, size: int) -> tuple[RTCPeerConnection, object, asyncio.Queue, list]:
    """A raw aiortc client whose offer says ``a=max-message-size:size``."""
    import aiohttp

    pc = RTCPeerConnection(rtc_configuration())
    channel = pc.createDataChannel("myna")
    events: asyncio.Queue = asyncio.Queue()
    channel.on("message", lambda m: events.put_nowait(json.loads(m)))
    pc.addTransceiver("audio", direction="recvonly")
    frames: list = []

    @pc.on("track")
    def on_track(track):
        async def record():
            while True:
                frames.append((await track.recv()).to_ndarray()[0])
        asyncio.ensure_future(record())

    await pc.setLocalDescription(await pc.createOffer())
    sdp = re.sub(r"a=max-message-size:\d+", f"a=max-message-size:{size}", pc.localDescription.sdp)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/offer", json={"sdp": sdp, "type": "offer"}) as resp:
            answer = await resp.json()
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    return pc, channel, events, frames


async def test_events_too_large_for_the_peer_are_dropped_reported_and_audio_keeps_flowing():
    worker = Worker(engines={"tone": ToneEngine()})
    async with serve_in_process(worker) as url:
        pc, channel, events, frames = await offer_with_max_message_size(url, 150)
        try:
            assert (await asyncio.wait_for(events.get(), 10))["type"] == "ready"
            long_id = "t" * 100  # first_audio for it is 184 bytes
            channel.send(json.dumps({"type": "text", "turn_id": long_id, "text": "one two three"}))
            channel.send(json.dumps({"type": "end_turn", "turn_id": long_id}))
            got = []
            while not any(e.get("code") == "event_too_large" for e in got):
                got.append(await asyncio.wait_for(events.get(), 10))
            await asyncio.sleep(0.6)  # the long turn plays out
            before = len(frames)
            channel.send(json.dumps({"type": "text", "turn_id": "b", "text": "four five"}))
            channel.send(json.dumps({"type": "end_turn", "turn_id": "b"}))
            while not (got and got[-1]["type"] == "turn_done" and got[-1]["turn_id"] == "b"):
                got.append(await asyncio.wait_for(events.get(), 10))
            kinds = [(e["type"], e.get("turn_id") == "b") for e in got]
            assert ("first_audio", True) in kinds and ("turn_done", True) in kinds
            await asyncio.sleep(0.2)
            assert first_audible_sample(np.concatenate(frames[before:]), 48_000) is not None  # audio still flows
            peer = next(iter(worker.webrtc.peers.values()))
            assert peer.max_event_bytes == 150 and peer.track.errors == 0
            await worker.webrtc.close_peer(peer.pc_id)  # closing does not raise either
        finally:
            await pc.close()


async def test_closed_peer_connections_are_released_at_close():
    worker = Worker(engines={"tone": ToneEngine()}, connect_timeout=30.0)
    async with serve_in_process(worker) as url:
        for _ in range(4):
            async with MynaClient(url) as client:
                await client.speak("hi", tokens_per_s=None)
            del client
        for _ in range(100):
            if not worker.webrtc.peers:
                break
            await asyncio.sleep(0.05)
        assert not worker.webrtc.peers
        gc.collect()
        # Well inside the 30 s connect timeout: nothing may still hold a closed connection.
        assert sum(isinstance(o, RTCPeerConnection) for o in gc.get_objects()) == 0
