"""The codec the peer asked for: an offer that allows only G.711 is answered
with G.711 and gets G.711 audio (a real aiortc peer decodes a 440 Hz tone, not noise); an offer
with no codec the worker can send is refused naming the ones it can (tone engine, loopback)."""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest

from inprocess import ToneEngine
from myna.bench.soak import serve_in_process
from myna.limits import Limits
from myna.rtc.client import MynaClient
from myna.server.app import Worker

pytestmark = pytest.mark.network


def tone_share(pcm: np.ndarray, rate: int, hz: float = 440.0) -> float:
    """Share of the signal's energy within 10 % of ``hz``."""
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64))) ** 2
    freqs = np.fft.rfftfreq(len(pcm), 1 / rate)
    band = (freqs > 0.9 * hz) & (freqs < 1.1 * hz)
    return float(spectrum[band].sum() / max(spectrum[1:].sum(), 1e-9))


def worker() -> Worker:
    return Worker(engines={"tone": ToneEngine()}, limits=Limits.off())


@pytest.mark.parametrize("codec", ["audio/PCMU", "audio/PCMA", "audio/opus"])
async def test_the_peer_gets_the_codec_it_offered_encoded_as_that_codec(codec):
    async with serve_in_process(worker()) as url:
        async with MynaClient(url, codecs=[codec]) as client:
            answer = client.pc.remoteDescription.sdp
            audio_line = next(line for line in answer.splitlines() if line.startswith("m=audio"))
            first_pt = audio_line.split()[3]
            assert f"a=rtpmap:{first_pt} {codec.split('/')[1]}/" in answer, answer
            result = await client.speak("one two three four five", tokens_per_s=None)
            assert result.event_types()[-1] == "turn_done"
            rate = 8_000 if codec != "audio/opus" else 48_000
            pcm = np.concatenate([frame for _, frame in client.frames]).astype(np.float32)
            loud = pcm[np.abs(pcm) > 500]
            assert len(loud) > rate * 0.2, "the tone was heard"
            assert tone_share(pcm, rate) > 0.8, "a 440 Hz tone, not noise"


async def test_an_offer_with_no_codec_the_worker_sends_is_refused_naming_the_ones_it_does():
    async with serve_in_process(worker()) as url, aiohttp.ClientSession() as http:
        from aiortc import RTCPeerConnection

        pc = RTCPeerConnection()
        pc.createDataChannel("myna")
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        lines = sdp.split("\r\n")
        m = next(i for i, line in enumerate(lines) if line.startswith("m=audio"))
        lines[m] = " ".join(lines[m].split()[:3] + ["9"])
        lines = [line for line in lines if not line.startswith(("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:"))]
        lines.insert(m + 1, "a=rtpmap:9 G722/8000")
        g722 = "\r\n".join(lines)
        async with http.post(f"{url}/api/offer", json={"sdp": g722, "type": "offer"}) as resp:
            body = await resp.json()
        assert resp.status == 415 and body["error"]["code"] == "unsupported_codec", body
        for name in ("opus", "PCMU", "PCMA"):
            assert name in body["error"]["message"]
