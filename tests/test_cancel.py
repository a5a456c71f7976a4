"""``cancel {turn_id}``: one turn dropped, queued or playing, the others played whole, on both
outputs (paced frames and unpaced PCM) and on the WebSocket (tone engine; loopback only)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from inprocess import ToneEngine, ToneStream, paced_session
from myna.bench.soak import serve_in_process
from myna.server.app import Worker

WORD_MS = 120.0


class SlowStream(ToneStream):
    """The tone engine's words, one every 50 ms (synthesis that takes time)."""

    def __init__(self, engine):
        super().__init__(engine)
        self._loop = asyncio.get_running_loop()
        self._at = 0.0

    def _later(self, callback, *args) -> None:
        self._at = max(self._at, self._loop.time()) + 0.05
        self._loop.call_at(self._at, lambda: None if self.cancelled else callback(*args))

    def _on_words(self, words):
        for word in words:
            self._later(super()._on_words, [word])

    def _on_end_input(self):
        self._later(self._finish)


class SlowTone(ToneEngine):
    def stream(self, voice=None, group=None):
        return SlowStream(self)


def speak(session, turn_id: str, text: str) -> None:
    session.receive(json.dumps({"type": "text", "turn_id": turn_id, "text": text}))
    session.receive(json.dumps({"type": "end_turn", "turn_id": turn_id}))


def done(sent: list, turn_id: str) -> dict:
    [event] = [e for e in sent if e["type"] == "turn_done" and e["turn_id"] == turn_id]
    return event


async def test_paced_cancel_of_a_queued_turn_and_of_the_playing_one():
    sent = []
    session = paced_session(ToneEngine(), sent)
    for turn_id, text in (("a", "one two three "), ("b", "four five "), ("c", "six seven ")):
        speak(session, turn_id, text)
    await asyncio.sleep(0.05)  # the tone engine has made every turn's audio
    session.receive(json.dumps({"type": "cancel", "turn_id": "b"}))  # queued behind a
    assert done(sent, "b") == {"type": "turn_done", "turn_id": "b", "audio_ms": 0.0, "underruns": 0,
                               "gap_ms": {"count": 0, "total": 0.0, "longest": 0.0}, "gaps": [], "interrupted": True}
    for _ in range(10):  # 200 ms of a: it is playing
        session.output.next_frame()
    session.receive(json.dumps({"type": "cancel", "turn_id": "a"}))
    assert done(sent, "a")["interrupted"] and 100 < done(sent, "a")["audio_ms"] < 3 * WORD_MS
    for _ in range(40):
        session.output.next_frame()
    c = done(sent, "c")
    assert c["audio_ms"] == 2 * WORD_MS and not c.get("interrupted")
    assert [e["word"] for e in sent if e["type"] == "word" and e["turn_id"] == "c"] == ["six", "seven"]
    assert not [e for e in sent if e["type"] == "word" and e["turn_id"] == "b"]
    # a cancel that crossed its turn_done is ignored; a turn never seen is an error; the session goes on
    session.receive(json.dumps({"type": "cancel", "turn_id": "c"}))
    session.receive(json.dumps({"type": "cancel", "turn_id": "zzz"}))
    session.receive(json.dumps({"type": "cancel"}))
    assert [(e["type"], e["code"]) for e in sent[-2:]] == [("error", "unknown_turn"), ("error", "bad_message")]
    session.receive(json.dumps({"type": "text", "turn_id": "b", "text": "late"}))  # a cancelled turn has ended
    assert sent[-1]["code"] == "turn_ended"
    await session.close()


async def ws_messages(ws, until_turn: str) -> list:
    out = []
    async with asyncio.timeout(20):
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                out.append(msg.data)
            else:
                event = json.loads(msg.data)
                out.append(event)
                if event["type"] == "turn_done" and event["turn_id"] == until_turn:
                    return out
    raise AssertionError(out)


def audio_by_turn(messages: list) -> dict[str, int]:
    """Bytes of audio between each turn's turn_started and turn_done."""
    out, turn = {}, None
    for m in messages:
        if isinstance(m, bytes):
            assert turn is not None, "audio outside a turn"
            out[turn] += len(m)
        elif m["type"] == "turn_started":
            turn = m["turn_id"]
            out[turn] = 0
        elif m["type"] == "turn_done":
            turn = None
    return out


@pytest.mark.network
async def test_websocket_cancel_of_the_second_of_three_queued_turns():
    async with serve_in_process(Worker(engines={"tone": SlowTone()})) as url, aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
            assert (await ws.receive_json())["type"] == "ready"
            await ws.send_json({"type": "config", "sample_rate": 24_000})
            await ws.receive_json()
            for turn_id, text in (("1", "one two three"), ("2", "four five six"), ("3", "seven eight")):
                await ws.send_json({"type": "text", "turn_id": turn_id, "text": text})
                await ws.send_json({"type": "end_turn", "turn_id": turn_id})
            await ws.send_json({"type": "cancel", "turn_id": "2"})
            messages = await ws_messages(ws, "3")
            # the playing turn, cancelled: a new turn plays whole after it
            await ws.send_json({"type": "text", "turn_id": "4", "text": " ".join(["word"] * 100)})
            await ws.send_json({"type": "cancel", "turn_id": "4"})
            await ws.send_json({"type": "text", "turn_id": "5", "text": "last one"})
            await ws.send_json({"type": "end_turn", "turn_id": "5"})
            later = await ws_messages(ws, "5")
    sizes = audio_by_turn(messages)
    per_word = 2 * 24 * int(WORD_MS)
    assert sizes == {"1": 3 * per_word, "2": 0, "3": 2 * per_word}
    events = [m for m in messages if isinstance(m, dict)]
    assert [(e["type"], e["turn_id"]) for e in events if e["type"] in ("turn_started", "turn_done")] == [
        ("turn_started", "1"), ("turn_done", "1"), ("turn_started", "2"), ("turn_done", "2"),
        ("turn_started", "3"), ("turn_done", "3")]
    assert done(events, "2")["interrupted"] and not done(events, "1").get("interrupted")
    later_events = [m for m in later if isinstance(m, dict)]
    assert done(later_events, "4")["interrupted"] and audio_by_turn(later)["4"] < 10 * per_word
    assert audio_by_turn(later)["5"] == 2 * per_word and not done(later_events, "5").get("interrupted")
