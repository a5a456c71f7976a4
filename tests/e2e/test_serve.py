"""End to end: an aiortc client against a running ``myna serve`` on loopback.

Runs in the loopback-only namespace of ``scripts/test.sh``. The audio is checked the way a
listener would: decoded from Opus, transcribed by the bundled Whisper model.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
import urllib.error
import urllib.request

import jiwer
import numpy as np
import pytest
import soxr

from myna.audio.onset import first_audible_sample
from myna.rtc.client import MynaClient

pytestmark = pytest.mark.network

SENTENCES = [
    "The weather today is sunny with a light breeze from the west.",
    "Please remember to bring your notebook to the meeting tomorrow morning.",
    "Our train leaves at seven, so we should pack tonight.",
    "She painted the old fence green and planted roses along it.",
    "Thank you for calling, your order will arrive on Friday.",
]


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def transcribe(model, pcm48: np.ndarray) -> str:
    audio = soxr.resample(pcm48.astype(np.float32) / 32768.0, 48_000, 16_000)
    segments, _ = model.transcribe(audio, beam_size=1, language="en", vad_filter=False)
    return " ".join(s.text for s in segments)


def audible(pcm: np.ndarray) -> bool:
    return first_audible_sample(pcm, 48_000) is not None


def http(url: str, body: bytes | None = None, method: str = "GET") -> tuple[int, dict | str]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, raw = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


@pytest.mark.serial  # no underrun and a pre-roll within the start rule's 100 ms
async def test_five_sentences_streamed_are_heard_and_transcribed(worker, whisper):
    async with MynaClient(worker.url) as client:
        assert client.ready["sample_rate"] == 48000 and "piper" in client.ready["engines"]
        results = [await client.speak(s, tokens_per_s=60) for s in SENTENCES]
    hypotheses = []
    for sentence, result in zip(SENTENCES, results):
        kinds = result.event_types()
        assert kinds[0] == "turn_started" and kinds[-1] == "turn_done", kinds
        assert kinds.count("turn_done") == 1 and "error" not in kinds
        first = kinds.index("first_audio")
        assert all(k == "word" for k in kinds[first + 1 : -1]), kinds
        words = [e for e in result.events if e["type"] == "word"]
        assert [w["word"].lower() for w in words] == _words(sentence).split()
        starts = [w["start_ms"] for w in words]
        assert starts == sorted(starts)
        done = result.events[-1]
        assert done["audio_ms"] > 1000 and done["underruns"] == 0  # Piper pauses between words, never cuts one
        assert done["gap_ms"]["count"] == len(done["gaps"]) and done["gap_ms"]["total"] >= 0
        assert result.events[first]["pre_roll_ms"] <= 100.0  # the start rule's budget
        assert result.perceived_ttfa_ms is not None and result.server_ttfa_ms is not None
        assert result.perceived_ttfa_ms >= result.server_ttfa_ms
        hypotheses.append(_words(transcribe(whisper, result.pcm)))
    wer = jiwer.wer([_words(s) for s in SENTENCES], hypotheses)
    assert wer <= 0.15, (wer, hypotheses)


async def test_interrupt_mid_turn_stops_audio_and_next_turn_speaks(worker, whisper):
    long_text = " ".join(SENTENCES)
    async with MynaClient(worker.url) as client:
        sender = asyncio.ensure_future(client.speak(long_text, tokens_per_s=None, turn_id="long"))
        while not any(e["type"] == "first_audio" for e in client.history):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        frames_before = len(client.frames)
        t_interrupt = time.monotonic()
        client.send({"type": "interrupt"})
        result = await asyncio.wait_for(sender, 10)
        done = result.events[-1]
        assert done["type"] == "turn_done" and done.get("interrupted") is True
        heard_before = [f for _, f in client.frames[max(0, frames_before - 25) : frames_before]]
        assert heard_before and audible(np.concatenate(heard_before))
        await asyncio.sleep(1.0)
        # One 20 ms frame on the server, plus loopback transport and the receive jitter buffer.
        late = [f for arrival, f in client.frames[frames_before:] if arrival > t_interrupt + 0.12]
        assert len(late) > 30 and not audible(np.concatenate(late))
        after = await client.speak(SENTENCES[1], tokens_per_s=None)
    assert "first_audio" in after.event_types()
    assert jiwer.wer(_words(SENTENCES[1]), _words(transcribe(whisper, after.pcm))) <= 0.15


async def test_interrupt_before_first_audio_emits_nothing(worker):
    async with MynaClient(worker.url) as client:
        start = len(client.frames)
        client.send({"type": "text", "turn_id": "early", "text": SENTENCES[0]})
        await asyncio.sleep(0.010)
        client.send({"type": "interrupt"})
        await asyncio.sleep(1.5)
        events = []
        while not client.events.empty():
            events.append(client.events.get_nowait())
        kinds = [e["type"] for e in events if e.get("turn_id") == "early"]
        assert kinds == ["turn_started", "turn_done"], events
        assert events[-1]["interrupted"] is True
        assert not audible(np.concatenate([f for _, f in client.frames[start:]]))
        # A late chunk of the interrupted turn is never spoken.
        client.send({"type": "text", "turn_id": "early", "text": " more words."})
        client.send({"type": "end_turn", "turn_id": "early"})
        after = await client.speak("Still here.", tokens_per_s=None)
        assert "first_audio" in after.event_types()


@pytest.mark.parametrize("chunks", [[], [""], ["   \n\t "], ["...", " !?", " —"], ["**", "_", " ##"]])
async def test_turns_without_speech_end_once_without_audio(worker, chunks):
    async with MynaClient(worker.url) as client:
        start = len(client.frames)
        for chunk in chunks:
            client.send({"type": "text", "turn_id": "t", "text": chunk})
        client.send({"type": "end_turn", "turn_id": "t"})
        await asyncio.sleep(1.0)
        events = []
        while not client.events.empty():
            events.append(client.events.get_nowait())
        assert [e["type"] for e in events] == ["turn_started", "turn_done"], events
        assert events[-1]["audio_ms"] == 0
        assert not audible(np.concatenate([f for _, f in client.frames[start:]]))


async def _speak_chunks(client: MynaClient, chunks: list[str], turn_id: str):
    start = len(client.frames)
    for chunk in chunks:
        client.send({"type": "text", "turn_id": turn_id, "text": chunk})
    client.send({"type": "end_turn", "turn_id": turn_id})
    events = []
    while True:
        event = await asyncio.wait_for(client._next_event(), 30)
        events.append(event)
        if event["type"] == "turn_done":
            break
    await asyncio.sleep(0.1)
    pcm = np.concatenate([f for _, f in client.frames[start:]])
    return events, [e["word"] for e in events if e["type"] == "word"], pcm


async def test_text_kinds_over_the_data_channel(worker, whisper):
    async with MynaClient(worker.url) as client:
        # Markdown: markers gone, words kept.
        _, words, _ = await _speak_chunks(client, ["**Bold", "** move: [click", " here](https://example.com/a)", " now."], "md")
        assert words == ["Bold", "move", "click", "here", "now"]
        # Emoji, also a ZWJ family split at the joiner across chunks.
        events, words, pcm = await _speak_chunks(client, ["Good news 🎉 for the fam", "ily 👨\u200d", "👩\u200d👧 today."], "emoji")
        assert words == ["Good", "news", "for", "the", "family", "today"]
        assert "error" not in [e["type"] for e in events]
        # A word split across chunks is spoken whole.
        _, words, pcm = await _speak_chunks(client, ["Check the ref", "erence manual."], "split")
        assert words == ["Check", "the", "reference", "manual"]
        assert "reference" in _words(transcribe(whisper, pcm))
        # No final punctuation: still spoken in full at end_turn.
        _, words, pcm = await _speak_chunks(client, ["The last words are ", "green apples"], "nopunct")
        assert words[-2:] == ["green", "apples"]
        assert _words(transcribe(whisper, pcm)).endswith("green apples")


async def _sessions(worker) -> int:
    return http(f"{worker.url}/healthz")[1]["sessions"]


async def test_sessions_are_released_on_close_and_on_a_dead_peer(worker):
    base = await _sessions(worker)
    client = MynaClient(worker.url)
    await client.connect()
    assert await _sessions(worker) == base + 1
    await client.close()
    for _ in range(50):
        if await _sessions(worker) == base:
            break
        await asyncio.sleep(0.1)
    assert await _sessions(worker) == base

    # A peer that vanishes without a goodbye: kill a client process outright.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        "import asyncio, sys; from myna.rtc.client import MynaClient\n"
        "async def main():\n"
        f"    c = MynaClient({worker.url!r}); await c.connect(); print('up', flush=True); await asyncio.sleep(60)\n"
        "asyncio.run(main())",
        stdout=asyncio.subprocess.PIPE,
    )
    assert (await asyncio.wait_for(proc.stdout.readline(), 20)).strip() == b"up"
    assert await _sessions(worker) == base + 1
    proc.kill()
    await proc.wait()
    t0 = time.monotonic()
    while await _sessions(worker) != base:
        assert time.monotonic() - t0 < 8.0, "dead peer not released within the peer timeout (3 s, +20 % jitter)"
        await asyncio.sleep(0.2)


async def test_events_follow_the_channel_the_client_speaks_on(worker):
    async with MynaClient(worker.url) as client:
        second = client.pc.createDataChannel("second")
        got: list[dict] = []
        second.on("message", lambda m: got.append(json.loads(m)))
        await asyncio.sleep(0.5)
        second.close()
        await asyncio.sleep(0.3)
        result = await client.speak("Hello again.", tokens_per_s=None)
        assert result.event_types()[-1] == "turn_done"


async def test_one_clients_queued_turns_do_not_starve_another_session(worker):
    async with MynaClient(worker.url) as a, MynaClient(worker.url) as b:
        alone = (await b.speak("Hello there, friend.", tokens_per_s=None)).server_ttfa_ms
        for i in range(12):  # about 24 sentence-long clauses, over 10 s of synthesis here
            a.send({"type": "text", "turn_id": f"a{i}", "text": SENTENCES[i % 5] + " " + SENTENCES[(i + 1) % 5]})
        a.send({"type": "end_turn", "turn_id": "a11"})
        await asyncio.sleep(0.2)
        queued = (await b.speak("Hello there, friend.", tokens_per_s=None)).server_ttfa_ms
        a.send({"type": "interrupt"})
    # Fair scheduling: B waits for the clause already being synthesised for A, not A's queue.
    assert queued is not None and queued < alone + 4000, (alone, queued)
