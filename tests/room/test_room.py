"""Myna in a LiveKit room, against a real livekit-server (one node): the room contract.

A Python participant (myna.room.client.RoomClient) streams text to Myna (a RoomAgent on this
test's event loop) and listens to its track, the way an agent framework or a front-end would.
Non-publishing participants are announced to others in LiveKit's 3 s batches, so waits here
are generous; nothing asserts speed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import jiwer
import numpy as np
import pytest
from livekit import api, rtc

from myna.audio.onset import first_audible_sample
from myna.room.client import RoomClient
from myna.bench.livekit_server import DEV_KEY, DEV_SECRET
from tests.e2e.test_serve import SENTENCES, _words, transcribe
from tests.room.support import ARTIFACTS, myna_in_room, room_name, token

pytestmark = [pytest.mark.network, pytest.mark.asyncio(loop_scope="module")]


async def eventually(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def audible_until(frames: list[tuple[float, np.ndarray]], after: float) -> float | None:
    """Arrival time of the last received 10 ms block with audible sound, among blocks after ``after``."""
    last = None
    for arrival, pcm in frames:
        if arrival > after and first_audible_sample(pcm, 48_000) is not None:
            last = arrival
    return last


async def test_a_reply_streamed_at_30_tokens_per_s_is_heard_with_events_and_captions(livekit_node, engine, whisper):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            assert client.ready == {"type": "ready", "engines": ["piper"], "engine": "piper", "sample_rate": 48000}
            results = [await client.speak(s, tokens_per_s=30) for s in SENTENCES]
            await eventually(lambda: all(client.caption(r.turn_id) and client.caption(r.turn_id).final
                                         for r in results))
            track_sid = agent.publication.sid
    hypotheses = []
    for sentence, result in zip(SENTENCES, results):
        kinds = result.event_types()
        assert kinds[0] == "turn_started" and kinds[1] == "first_audio" and kinds[-1] == "turn_done", kinds
        done = result.events[-1]
        assert done["turn_id"] == result.turn_id and not done.get("interrupted") and done["audio_ms"] > 1000
        words = [e["word"] for e in result.events if e["type"] == "word"]
        assert [w.lower() for w in words] == _words(sentence).split()
        assert result.perceived_ttfa_ms is not None and result.perceived_ttfa_ms > result.server_ttfa_ms
        segment = client.caption(result.turn_id)  # lk.transcription: segment = turn, words as heard
        assert segment.track_id == track_sid and segment.final
        assert segment.text.split() == words
        hypotheses.append(_words(transcribe(whisper, result.pcm)))
    wer = jiwer.wer([_words(s) for s in SENTENCES], hypotheses)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "room-wer.json").write_text(json.dumps({"wer": wer, "hypotheses": hypotheses}, indent=2))
    assert wer <= 0.15, (wer, hypotheses)


async def test_interrupt_by_rpc_mid_turn_silences_the_turn_then_the_next_turn_speaks(livekit_node, engine, whisper):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine):
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            turn_id, _, sender = await client.start_turn(" ".join(SENTENCES), tokens_per_s=None)
            await client.next_event("first_audio")
            await asyncio.sleep(0.8)
            answer = await client.interrupt()
            returned = time.monotonic()
            done = await client.next_event("turn_done")
            await sender
            await asyncio.sleep(0.6)
            assert answer == {"interrupted": [turn_id]}
            assert done["turn_id"] == turn_id and done["interrupted"] is True
            last = audible_until(client.frames, returned - 1.0)
            # The turn had ~15 s left: it stopped (how fast is the bench's figure, not a test's).
            assert last is not None and last - returned < 1.0, last - returned
            after = await client.speak(SENTENCES[1], tokens_per_s=60)
    assert after.events[-1]["type"] == "turn_done" and not after.events[-1].get("interrupted")
    assert jiwer.wer(_words(SENTENCES[1]), _words(transcribe(whisper, after.pcm))) <= 0.15


async def test_contract_messages_as_data_packets_speak_and_interrupt(livekit_node, engine):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine):
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            for chunk in ["Thank you for", " calling, your order", " will arrive on Friday."]:
                await client.send({"type": "text", "turn_id": 7, "text": chunk})
            await client.send({"type": "end_turn", "turn_id": 7})
            events = await client.turn_events("7")
            assert [e["type"] for e in events][:2] == ["turn_started", "first_audio"]
            assert events[-1]["type"] == "turn_done" and events[-1]["audio_ms"] > 1000
            await client.send({"type": "text", "turn_id": "long", "text": " ".join(SENTENCES)})
            await client.next_event("first_audio")
            await client.send({"type": "interrupt"})
            done = await client.next_event("turn_done")
            assert done["turn_id"] == "long" and done["interrupted"] is True


async def test_a_text_streams_attributes_are_its_turns_options(livekit_node, engine):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine):
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            plain = await client.speak(SENTENCES[1], tokens_per_s=None)
            fast = await client.speak(SENTENCES[1], tokens_per_s=None, attributes={"speed": "1.5"})
            ratio = fast.events[-1]["audio_ms"] / plain.events[-1]["audio_ms"]
            assert 0.6 <= ratio <= 0.72, ratio  # speed 1.5: 30–40 % shorter
            refused, _, sender = await client.start_turn("Too fast.", tokens_per_s=None, attributes={"speed": "fast"})
            error = await client.next_event("error")
            assert (error["code"], error["turn_id"]) == ("bad_speed", refused), error
            await sender
            unknown, _, sender = await client.start_turn("Who?", tokens_per_s=None, attributes={"voice": "nobody"})
            error = await client.next_event("error")
            assert (error["code"], error["turn_id"]) == ("unknown_voice", unknown), error
            await sender
            spoken = await client.speak("Still here.", tokens_per_s=None, attributes={"language": "en-GB"})
            assert spoken.events[-1]["type"] == "turn_done" and spoken.events[-1]["audio_ms"] > 300
            assert not [e for e in client.history if e.get("turn_id") in (refused, unknown) and e["type"] != "error"]


async def test_two_participants_with_the_same_turn_id_keep_their_own_turns(livekit_node, engine):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as alice, \
                RoomClient(livekit_node.url, token(room, "bob")) as bob:
            await alice.send({"type": "text", "turn_id": "1", "text": "Our train leaves at seven,"})
            await bob.send({"type": "text", "turn_id": "1", "text": "She painted the old fence green."})
            await alice.send({"type": "end_turn", "turn_id": "1"})
            await bob.send({"type": "end_turn", "turn_id": "1"})
            a = await alice.turn_events("1")
            b = await bob.turn_events("1")
    words = lambda events: [e["word"] for e in events if e["type"] == "word"]  # noqa: E731
    assert words(a) == ["Our", "train", "leaves", "at", "seven"]
    assert words(b) == ["She", "painted", "the", "old", "fence", "green"]
    assert not any(e["type"] == "error" for e in a + b)


async def test_a_sender_leaving_mid_turn_cancels_its_synthesis(livekit_node, engine):
    room = room_name()
    async with myna_in_room(livekit_node, room, engine) as agent:
        async with RoomClient(livekit_node.url, token(room, "bob")) as bob:
            await bob.start_turn(" ".join(SENTENCES * 3), tokens_per_s=None)
            await bob.next_event("first_audio")
            assert agent.router.speaking()
        await eventually(lambda: not agent.router.speaking(), timeout=10)  # LiveKit announces leaves in ≤ 3 s
        assert agent.output.idle
        async with RoomClient(livekit_node.url, token(room, "carol")) as carol:
            result = await carol.speak(SENTENCES[2], tokens_per_s=None)
    assert result.perceived_ttfa_ms is not None and not result.events[-1].get("interrupted")


async def test_bad_packets_get_error_events_or_log_lines_and_the_room_keeps_working(livekit_node, engine, caplog):
    caplog.set_level(logging.DEBUG, logger="myna.room")
    room = room_name()
    async with myna_in_room(livekit_node, room, engine, speak_for=frozenset({"alice"})):
        async with RoomClient(livekit_node.url, token(room, "alice")) as alice, \
                RoomClient(livekit_node.url, token(room, "mallory")) as mallory:
            expected = [
                (b"\xff\xfe not utf-8", "bad_encoding"),
                (b"{not json", "bad_json"),
                (json.dumps({"type": "text", "turn_id": "x", "text": "a" * 15_000}) + " " * 1_500, "message_too_large"),
                (json.dumps([1, 2]), "bad_message"),
                (json.dumps({"type": "dance"}), "unknown_type"),
                (json.dumps({"type": "text", "turn_id": {"no": 1}, "text": "hi"}), "bad_message"),
                (json.dumps({"type": "text", "turn_id": "t", "text": 42}), "bad_message"),
            ]
            for payload, code in expected:
                await alice.send(payload)
                event = await alice.next_event("error")
                assert event["code"] == code, (payload[:40], event)
            await alice.send("{}", topic="myna.nope")  # a Myna topic that does not exist
            assert (await alice.next_event("error"))["code"] == "unknown_topic"
            await alice.send("hello", topic="chat")  # another application's topic: a log line only
            await eventually(lambda: "ignored a data packet on topic 'chat'" in caplog.text)
            # Not allowed to speak: a stream, a packet and the RPC are refused.
            await mallory.start_turn("Let me talk.", tokens_per_s=None, turn_id="m1")
            assert (await mallory.next_event("error")) == {"type": "error", "code": "not_allowed", "turn_id": "m1",
                                                          "message": "'mallory' may not speak through Myna"}
            await mallory.send({"type": "text", "turn_id": "m2", "text": "Me too."})
            assert (await mallory.next_event("error"))["code"] == "not_allowed"
            with pytest.raises(rtc.RpcError):
                await mallory.interrupt()
            assert "not allowed to speak through Myna" in caplog.text
            result = await alice.speak(SENTENCES[4], tokens_per_s=None)
    assert not [e for e in mallory.history if e["type"] not in ("ready", "error")]
    assert result.events[-1]["type"] == "turn_done" and result.perceived_ttfa_ms is not None


async def test_the_room_closing_mid_turn_ends_the_session_cleanly(livekit_node, engine):
    room = room_name()
    threads = _python_threads()
    async with myna_in_room(livekit_node, room, engine) as agent:
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            await client.start_turn(" ".join(SENTENCES), tokens_per_s=None)
            await client.next_event("first_audio")
            async with api.LiveKitAPI(livekit_node.http_url, DEV_KEY, DEV_SECRET) as lk:
                await lk.room.delete_room(api.DeleteRoomRequest(room=room))
            await eventually(lambda: agent._done.is_set(), timeout=10)
            await client.close()
    assert rtc.DisconnectReason.Name(agent.disconnect_reason) == "ROOM_DELETED"
    _assert_released(agent, threads)


async def test_a_token_that_expires_in_the_room_keeps_myna_there_and_an_expired_one_is_refused(livekit_node, engine):
    """LiveKit checks a token at join; a joined participant gets fresh tokens from the server."""
    room = room_name()
    async with myna_in_room(livekit_node, room, engine, ttl_s=3):
        await asyncio.sleep(5)
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            result = await client.speak(SENTENCES[0], tokens_per_s=None)
    assert result.perceived_ttfa_ms is not None
    with pytest.raises(rtc.ConnectError):
        await rtc.Room().connect(livekit_node.url, token(room, "late", ttl_s=-60), rtc.RoomOptions(connect_timeout=5))


async def test_the_server_dying_mid_turn_ends_the_session_cleanly(engine, tmp_path):
    from myna.bench.livekit_server import LiveKitServer, media_address

    node = LiveKitServer(node_ip=media_address(), log_dir=tmp_path).start()
    room = room_name()
    threads = _python_threads()
    try:
        async with myna_in_room(node, room, engine) as agent:
            async with RoomClient(node.url, token(room, "alice")) as client:
                await client.start_turn(" ".join(SENTENCES), tokens_per_s=None)
                await client.next_event("first_audio")
                node.kill()
                await eventually(lambda: agent._done.is_set(), timeout=60)
                await client.close()
    finally:
        node.stop()
    _assert_released(agent, threads)


def _python_threads() -> int:
    """Threads started from Python (the SDK's native callback threads show up as process-wide
    ``DummyThread``s the first time they call into Python; they are not a session's)."""
    return sum(1 for t in threading.enumerate() if not isinstance(t, threading._DummyThread))


def _assert_released(agent, threads_before: int) -> None:
    """Nothing of the session is left: turns, pacer, readers, the track, the room connection."""
    assert agent._closed and not agent.room.isconnected()
    assert agent.output._task.done() and not agent._readers and agent._outbox._task.done()
    assert not agent.router.session._turns
    assert agent.sessions.metrics.registry.get_sample_value("myna_active_sessions") == 0
    assert _python_threads() <= threads_before, [t.name for t in threading.enumerate()]
    leftovers = [t for t in asyncio.all_tasks() if "myna" in (t.get_name() or "") and not t.done()]
    assert not leftovers, leftovers
