"""Turn control in the shared core: ``prepare``/``commit`` and ``pause``/``resume`` on the paced
output (a virtual clock: every frame is taken at its deadline) and the unpaced one."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp
import numpy as np
import pytest

from inprocess import ToneEngine, paced_session
from myna.bench.soak import serve_in_process
from myna.server.app import Worker
from test_cancel import SlowTone, audio_by_turn, done, ws_messages
from myna.audio.playout import FRAME_SAMPLES, FRAME_SECONDS, SAMPLE_RATE
from myna.audio.unpaced import UnpacedOutput
from myna.limits import Limits
from myna.metrics import Metrics
from myna.session import Session

WORD_MS = 120.0
WORDS = "one two three four five six".split()
PER_WORD = 2 * 24 * int(WORD_MS)  # bytes of s16 audio per word at 24 kHz


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def send(session, **message) -> None:
    session.receive(json.dumps(message))


def frame(session, clock: Clock) -> np.ndarray:
    """The next frame, taken at its deadline (the clock moves one frame first)."""
    clock.now += FRAME_SECONDS
    return session.output.next_frame(due=clock.now)


def of(sent: list, kind: str, turn_id: str | None = None) -> list[dict]:
    return [e for e in sent if e["type"] == kind and (turn_id is None or e.get("turn_id") == turn_id)]


async def test_prepared_turn_is_silent_until_commit_then_starts_at_the_next_frame():
    clock, sent = Clock(), []
    session = paced_session(ToneEngine(), sent, clock=clock)
    send(session, type="prepare", turn_id="a", text="one two three ")
    send(session, type="end_turn", turn_id="a")
    await asyncio.sleep(0.02)  # the tone engine has made the whole turn
    assert session.audio_runs_out_at() >= clock.now + 3 * WORD_MS / 1000 - 1e-6  # it counts toward the horizon
    for _ in range(100):  # 2 s: nothing of it goes out
        assert not frame(session, clock).any()
    assert not of(sent, "first_audio") and not of(sent, "word")
    held = session.output._by_id["a"]
    assert held.ended and held.buffered == 3 * WORD_MS / 1000 * SAMPLE_RATE  # all of it ready before the commit
    send(session, type="commit", turn_id="a")
    commit_at = clock.now
    first = frame(session, clock)  # the first frame deadline after the commit
    assert first.any()
    [fa] = of(sent, "first_audio", "a")
    assert fa["server_ttfa_ms"] <= 1000 * FRAME_SECONDS + 0.1 and clock.now - commit_at <= 0.030
    assert fa["pre_roll_ms"] <= 1000 * FRAME_SECONDS + 0.1
    for _ in range(30):
        frame(session, clock)
    [done] = of(sent, "turn_done", "a")
    assert done["audio_ms"] == 3 * WORD_MS and not done.get("interrupted")
    assert [e["word"] for e in of(sent, "word", "a")] == ["one", "two", "three"]
    send(session, type="commit", turn_id="a")  # a commit that crossed turn_done: ignored
    send(session, type="commit", turn_id="nope")
    assert sent[-1]["code"] == "unknown_turn"
    await session.close()


async def test_prepared_turn_holds_its_place_cancel_drops_it_and_it_expires():
    clock, sent = Clock(), []
    session = paced_session(ToneEngine(), sent, clock=clock, limits=dataclasses.replace(Limits.off(), max_queued_turns=2))
    send(session, type="prepare", turn_id="p", text="one ")
    send(session, type="text", turn_id="b", text="two ")  # ends p's input, queues behind it
    send(session, type="end_turn", turn_id="b")
    send(session, type="text", turn_id="c", text="three ")  # a prepared turn counts toward the limit
    assert sent[-1]["code"] == "too_many_turns"
    await asyncio.sleep(0.02)
    assert not any(frame(session, clock).any() for _ in range(20))  # b waits behind the prepared turn
    send(session, type="cancel", turn_id="p")
    [done] = of(sent, "turn_done", "p")
    assert done["interrupted"] and done["audio_ms"] == 0.0
    assert any(frame(session, clock).any() for _ in range(3))  # then b plays
    for _ in range(10):
        frame(session, clock)
    assert of(sent, "turn_done", "b")[0]["audio_ms"] == WORD_MS
    session.prepare_timeout_s = 0.05
    send(session, type="prepare", turn_id="q", text="four ")
    await asyncio.sleep(0.1)
    assert [e["code"] for e in of(sent, "error", "q")] == ["prepare_expired"]
    assert of(sent, "turn_done", "q")[0]["interrupted"]
    await session.close()


async def test_prepared_turn_on_the_unpaced_output_hands_out_nothing_until_commit():
    pieces, sent = [], []

    class Sink:
        def put_audio(self, turn_id, pcm):
            pieces.append((turn_id, pcm))

        def drop_audio(self, turn_id=None):
            pass

    session = Session(ToneEngine(), lambda s: UnpacedOutput.for_session(s, Sink(), 24_000),
                      lambda e: sent.append(e.to_dict()), Metrics())
    send(session, type="prepare", turn_id="a", text="one two ")
    send(session, type="end_turn", turn_id="a")
    await asyncio.sleep(0.02)
    assert not pieces and not of(sent, "first_audio")
    send(session, type="commit", turn_id="a")
    assert sum(len(p) for _, p in pieces) == 2 * 2 * 24_000 * WORD_MS / 1000
    assert of(sent, "turn_done", "a") and [e["word"] for e in of(sent, "word")] == ["one", "two"]
    await session.close()


async def play_whole(session, clock, turn_id: str, sent: list, limit: int = 200) -> np.ndarray:
    out = []
    for _ in range(limit):
        out.append(frame(session, clock))
        if of(sent, "turn_done", turn_id):
            break
    return np.concatenate(out)


async def test_pause_stops_within_a_packet_and_resume_repeats_the_cut_word_whole():
    # reference: the same turn, not paused
    ref_clock, ref_sent = Clock(), []
    ref_session = paced_session(ToneEngine(), ref_sent, clock=ref_clock)
    send(ref_session, type="text", turn_id="t", text=" ".join(WORDS))
    send(ref_session, type="end_turn", turn_id="t")
    await asyncio.sleep(0.02)
    ref = await play_whole(ref_session, ref_clock, "t", ref_sent)
    start = int(np.flatnonzero(ref)[0]) // FRAME_SAMPLES * FRAME_SAMPLES  # the turn's first frame
    ref = ref[start:]
    await ref_session.close()

    clock, sent = Clock(), []
    session = paced_session(ToneEngine(), sent, clock=clock)
    send(session, type="text", turn_id="t", text=" ".join(WORDS))
    send(session, type="end_turn", turn_id="t")
    await asyncio.sleep(0.02)
    before = []
    while len(before) < 13 or not before[0].any():
        f = frame(session, clock)
        if before or f.any():
            before.append(f)
    before = np.concatenate(before)  # 260 ms of the turn: "three" (240-360 ms) is cut
    assert np.array_equal(before, ref[: len(before)])
    send(session, type="pause")
    [paused] = of(sent, "paused", "t")
    assert paused["at_ms"] == 265.0 and paused["resume_ms"] == 2 * WORD_MS
    tail = frame(session, clock)
    assert tail[:240].any() and not tail[240:].any()  # within one packet: 5 ms faded, then silence
    assert abs(int(tail[0]) - int(ref[len(before)])) <= 1  # the tail continues the audio: no click
    assert not any(frame(session, clock).any() for _ in range(100))  # 2 s paused: no audio leaks
    words_before = [e["word"] for e in of(sent, "word", "t")]
    assert words_before == ["one", "two", "three"]
    send(session, type="resume")
    [resumed] = of(sent, "resumed", "t")
    assert resumed["from_ms"] == 2 * WORD_MS
    after = await play_whole(session, clock, "t", sent)
    cut = int(2 * WORD_MS / 1000 * SAMPLE_RATE)
    # from the start of "three" to the end, with a 5 ms fade-in: the cut word heard again whole
    assert np.array_equal(after[240 : len(ref) - cut], ref[cut + 240 :])
    assert not after[len(ref) - cut :].any()
    assert [e["word"] for e in of(sent, "word", "t")] == ["one", "two", "three", "three", "four", "five", "six"]
    three = [e["start_ms"] for e in of(sent, "word", "t") if e["word"] == "three"]
    assert three == [240.0, 240.0]  # the caption of the repeated word points at the same place
    [done] = of(sent, "turn_done", "t")
    assert done["audio_ms"] == len(WORDS) * WORD_MS and not done.get("interrupted")
    await session.close()


async def test_pause_timeout_ends_the_turn_and_the_next_plays():
    clock, sent = Clock(), []
    session = paced_session(ToneEngine(), sent, clock=clock)
    send(session, type="pause")
    assert sent[-1]["code"] == "nothing_playing"
    send(session, type="resume")  # nothing paused: ignored
    assert len(sent) == 1
    for turn_id in ("a", "b"):
        send(session, type="text", turn_id=turn_id, text="one two ")
        send(session, type="end_turn", turn_id=turn_id)
    await asyncio.sleep(0.02)
    for _ in range(8):
        frame(session, clock)
    session.pause_timeout_s = 0.05
    send(session, type="pause")
    send(session, type="pause")  # a second pause: ignored
    assert len(of(sent, "paused")) == 1
    await asyncio.sleep(0.1)
    assert [e["code"] for e in of(sent, "error", "a")] == ["pause_expired"]
    assert of(sent, "turn_done", "a")[0]["interrupted"]
    await play_whole(session, clock, "b", sent)
    assert of(sent, "turn_done", "b")[0]["audio_ms"] == 2 * WORD_MS
    send(session, type="resume")  # crossed the timeout: ignored
    assert not of(sent, "resumed")
    await session.close()


@pytest.mark.network
async def test_websocket_prepare_commit_and_pause_resume():
    """The WebSocket door: a prepared turn sends nothing until commit, then all of it; a paused
    turn sends nothing until resume, then the rest; every byte inside its turn."""
    async with serve_in_process(Worker(engines={"tone": SlowTone()})) as url, aiohttp.ClientSession() as http:
        async with http.ws_connect(url.replace("http", "ws", 1) + "/v1/tts/stream") as ws:
            assert (await ws.receive_json())["type"] == "ready"
            await ws.send_json({"type": "config", "sample_rate": 24_000})
            await ws.receive_json()
            await ws.send_json({"type": "prepare", "turn_id": "p", "text": "one two"})
            await ws.send_json({"type": "end_turn", "turn_id": "p"})
            early = []
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.4):  # synthesis (2 × 50 ms) is over: still nothing but turn_started
                    async for msg in ws:
                        early.append(msg.data if msg.type == aiohttp.WSMsgType.BINARY else json.loads(msg.data))
            assert [m["type"] for m in early] == ["turn_started"]
            await ws.send_json({"type": "commit", "turn_id": "p"})
            messages = early + await ws_messages(ws, "p")
            assert audio_by_turn(messages) == {"p": 2 * PER_WORD}
            await ws.send_json({"type": "text", "turn_id": "q", "text": "three four five six"})
            await ws.send_json({"type": "end_turn", "turn_id": "q"})
            first = []
            async with asyncio.timeout(5):
                async for msg in ws:  # until the first audio of q
                    first.append(msg.data if msg.type == aiohttp.WSMsgType.BINARY else json.loads(msg.data))
                    if isinstance(first[-1], bytes):
                        break
            await ws.send_json({"type": "pause"})
            paused = []
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):  # the rest is synthesised meanwhile, and held
                    async for msg in ws:
                        paused.append(msg.data if msg.type == aiohttp.WSMsgType.BINARY else json.loads(msg.data))
            # no audio while paused (the word of the piece sent before the pause may follow it)
            assert not [m for m in paused if isinstance(m, bytes)]
            assert [m["type"] for m in paused][-1] == "paused" and len(paused) <= 2
            await ws.send_json({"type": "resume"})
            rest = await ws_messages(ws, "q")
    q = first + paused + rest
    assert audio_by_turn(q) == {"q": 4 * PER_WORD}
    events = [m for m in q if isinstance(m, dict)]
    assert [e["type"] for e in events if e["type"] in ("paused", "resumed")] == ["paused", "resumed"]
    assert not done(events, "q").get("interrupted")
