"""The room's Router without a server: many participants' turns through one session."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import numpy as np
import pytest

from myna.audio.turns import Gaps
from myna.engines import AudioChunk, Engine, SynthesisStream, WordEvent
from myna.events import TurnDone, TurnStarted, Word
from myna.messages import EndTurn, Text
from myna.metrics import Metrics
from myna.room import routing
from myna.room.routing import Router
from myna.session import Session
from myna.text import said


class EchoStream(SynthesisStream):
    """Each whole word comes back as a WordEvent (as written, like the real engines') and 100 ms of tone."""

    reads_marked_words = True

    def _on_words(self, words):
        for word in words:
            self._emit(WordEvent(said.text_of(word), 0.0))
            self._emit(AudioChunk(np.full(2205, 0.1, np.float32), 22050))

    def _on_end_input(self):
        self._finish()


class Echo(Engine):
    name = "echo"
    sample_rate = 22050

    def __init__(self):
        self.streams: list[EchoStream] = []

    def stream(self, voice=None, group=None):
        self.streams.append(EchoStream())
        return self.streams[-1]


class RecordingOutput:
    """A TurnOutput that plays a turn the moment its input ends (events only, no audio); a turn
    whose id is in ``hold`` keeps playing until :meth:`release`."""

    hold: set[str] = set()

    def __init__(self, sink):
        self.sink, self.turns, self.words = sink, [], {}
        self.held: set[str] = set()

    def begin_turn(self, turn_id, text_at):
        self.turns.append(turn_id)
        self.words[turn_id] = []
        self.sink(TurnStarted(turn_id=turn_id))

    def push_audio(self, turn_id, pcm, sample_rate):
        pass

    def push_word(self, turn_id, word, start_ms):
        if turn_id in self.words:
            self.words[turn_id].append(word)
            self.sink(Word(turn_id=turn_id, word=word, start_ms=start_ms))

    def end_turn(self, turn_id):
        if turn_id in self.turns and turn_id in self.hold:
            self.held.add(turn_id)
        elif turn_id in self.turns:
            self.turns.remove(turn_id)
            self.sink(TurnDone(turn_id=turn_id, audio_ms=0.0, underruns=0, **Gaps().fields()))

    def release(self, turn_id):
        self.hold = set()
        self.end_turn(turn_id)

    def interrupt(self):
        dropped = [TurnDone(turn_id=t, audio_ms=0.0, underruns=0, **Gaps().fields(), interrupted=True) for t in self.turns]
        self.turns.clear()
        return dropped

    def reset(self):
        self.turns.clear()

    def audio_runs_out_at(self):
        return time.monotonic()


@pytest.fixture
def room():
    """A router over a real Session with the echo engine; ``delivered`` records (identity, event)."""
    delivered: list[tuple[str, dict]] = []
    engine = Echo()
    outputs = []
    router = Router(lambda send: Session(engine, lambda s: outputs.append(RecordingOutput(s.on_output_event)) or outputs[-1],
                                         send, Metrics()),
                    lambda identity, event: delivered.append((identity, json.loads(json.dumps(event.to_dict())))))
    router.output = outputs[0]
    return router, delivered, engine


def events_of(delivered, identity):
    return [(e["type"], e.get("turn_id")) for who, e in delivered if who == identity]


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


async def test_each_participant_sees_its_own_turn_ids_and_its_text_stays_in_its_turn(room):
    router, delivered, _ = room
    router.message("alice", Text("1", "good morning"))
    router.message("bob", Text("1", "bonjour"))
    router.message("alice", EndTurn("1"))
    router.message("bob", EndTurn("1"))
    await settle()
    words = lambda who: [e["word"] for w, e in delivered if w == who and e["type"] == "word"]  # noqa: E731
    assert words("alice") == ["good", "morning"] and words("bob") == ["bonjour"]
    assert events_of(delivered, "alice")[0] == ("turn_started", "1") and events_of(delivered, "alice")[-1] == ("turn_done", "1")
    assert events_of(delivered, "bob")[0] == ("turn_started", "1") and events_of(delivered, "bob")[-1] == ("turn_done", "1")


async def test_a_late_chunk_for_an_ended_turn_is_refused_to_its_sender_only(room):
    router, delivered, _ = room
    router.message("alice", EndTurn("a"))
    await settle()
    router.message("alice", Text("a", "too late"))
    assert delivered[-1] == ("alice", {"type": "error", "code": "turn_ended", "turn_id": "a",
                                       "message": "this turn has ended; use a new turn_id"})
    assert all(who == "alice" for who, _ in delivered)


async def test_bad_packets_get_errors_and_unparseable_turn_ids_never_reach_the_session(room):
    router, delivered, engine = room
    for raw, code in [(b"\xff", "bad_encoding"), (b"[", "bad_json"), (b"[]", "bad_message"),
                      (json.dumps({"type": "text", "turn_id": "x" * 200, "text": "hi"}), "bad_message"),
                      (json.dumps({"type": "text", "turn_id": True, "text": "hi"}), "bad_message"),
                      (json.dumps({"type": "nope"}), "unknown_type")]:
        router.packet("alice", raw)
        assert delivered[-1][0] == "alice" and delivered[-1][1]["code"] == code, raw
    assert not engine.streams


async def test_who_may_speak(room, caplog):
    router, delivered, engine = room
    router.speak_for = frozenset({"alice"})
    caplog.set_level(logging.WARNING, logger="myna.room")
    router.message("mallory", Text("m", "hello"))
    assert delivered == [("mallory", {"type": "error", "code": "not_allowed", "turn_id": "m",
                                      "message": "'mallory' may not speak through Myna"})]
    assert "not allowed to speak" in caplog.text and not engine.streams
    with pytest.raises(PermissionError):
        router.interrupt("mallory")
    router.message("alice", Text("a", "hi"))
    assert engine.streams


async def test_interrupt_returns_the_callers_dropped_turns_and_tells_every_owner(room):
    router, delivered, _ = room
    router.message("alice", Text("a1", "one"))
    router.message("bob", Text("b1", "two"))
    assert router.speaking()
    assert router.interrupt("alice") == ["a1"]
    assert ("alice", {"type": "turn_done", "turn_id": "a1", "audio_ms": 0.0, "underruns": 0, **Gaps().fields(),
                                  "interrupted": True}) in delivered
    assert ("bob", {"type": "turn_done", "turn_id": "b1", "audio_ms": 0.0, "underruns": 0, **Gaps().fields(),
                                  "interrupted": True}) in delivered
    assert not router.speaking()


async def test_a_participant_leaving_mid_turn_cancels_its_synthesis(room):
    router, delivered, engine = room
    router.message("bob", Text("b", "a long reply"))
    router.participant_left("alice")  # owns nothing: nothing happens
    assert router.speaking() and not engine.streams[0].cancelled
    router.participant_left("bob")
    assert engine.streams[0].cancelled and not router.speaking()
    router.message("bob", Text("b", "back again"))  # a new session of bob's
    assert router.speaking() and len(engine.streams) == 2


async def test_long_stream_chunks_are_cut_into_contract_sized_pieces(room):
    router, delivered, engine = room
    router.text("alice", "s1", "word " * 3000)  # 15,000 characters in one chunk
    router.message("alice", EndTurn("s1"))
    await settle()
    assert not [e for _, e in delivered if e["type"] == "error"]
    assert sum(1 for _, e in delivered if e["type"] == "word") == 3000


async def test_ended_turn_ids_are_forgotten_beyond_the_limit_but_live_ones_never(room, monkeypatch):
    monkeypatch.setattr(routing, "REMEMBERED_PAIRS", 3)
    router, delivered, _ = room
    router.output.hold = {"r1"}  # the first turn keeps playing
    router.message("alice", Text("live", "x"))
    for i in range(10):
        router.message("alice", EndTurn(f"t{i}"))
        await settle()
    assert list(router._ids) == [("alice", "live"), ("alice", "t7"), ("alice", "t8"), ("alice", "t9")]
    router.output.release("r1")
    assert delivered[-1] == ("alice", {"type": "turn_done", "turn_id": "live", "audio_ms": 0.0, "underruns": 0,
                                          **Gaps().fields()})


async def test_a_stream_id_no_turn_id_can_be_is_refused_to_its_sender_and_counted(room):
    router, delivered, engine = room
    router.speak_for = frozenset({"alice"})
    router.text("alice", "x" * 200, "hello")  # a sender may choose its stream ids
    router.end_turn("alice", "x" * 200)
    router.text("mallory", "y" * 200, "hello")
    assert [(who, e["code"]) for who, e in delivered] == [("alice", "bad_message"), ("alice", "bad_message"),
                                                         ("mallory", "not_allowed")]
    assert not engine.streams
    errors = router.session.metrics.registry.get_sample_value
    assert errors("myna_errors_total", {"code": "bad_message"}) == 2.0
    assert errors("myna_errors_total", {"code": "not_allowed"}) == 1.0


async def test_data_packets_pass_each_senders_message_rate(room):
    from myna.limits import MessageRate

    router, delivered, _ = room
    router._message_rate = lambda: MessageRate(1.0, 2)
    for _ in range(5):  # messages that begin nothing (bad JSON) count, and draw one rate_limited
        router.packet("alice", "not json")
    router.packet("bob", "not json")
    codes = [(who, e["code"]) for who, e in delivered if e["type"] == "error"]
    assert [c for c in codes if c[1] == "rate_limited"] == [("alice", "rate_limited")]
    assert len([c for c in codes if c[0] == "alice"]) == 3 and len([c for c in codes if c[0] == "bob"]) == 1


async def test_over_the_rate_an_accepted_turn_keeps_every_chunk_and_a_new_turn_is_refused_whole(room):
    from myna.limits import MessageRate

    router, delivered, engine = room
    router._message_rate = lambda: MessageRate(1.0, 2)
    words = [f"w{i}" for i in range(30)]
    for word in words:  # 30 chunks in an instant against a burst of 2: the turn was accepted, none is lost
        router.packet("alice", json.dumps({"type": "text", "turn_id": "a", "text": word + " "}))
    router.packet("alice", json.dumps({"type": "end_turn", "turn_id": "a"}))  # (never dropped: the turn stays open otherwise)
    for word in ("never", "heard"):  # a new turn over the rate: refused whole, its later chunks with it
        router.packet("alice", json.dumps({"type": "text", "turn_id": "b", "text": word + " "}))
    router.packet("alice", json.dumps({"type": "end_turn", "turn_id": "b"}))
    await settle()
    router.packet("alice", json.dumps({"type": "interrupt"}))  # barge-in is never dropped either (no error)
    said = [e["word"] for who, e in delivered if e["type"] == "word" and e["turn_id"] == "a"]
    assert said == words
    errors = [(e["code"], e.get("turn_id")) for who, e in delivered if e["type"] == "error"]
    assert errors == [("rate_limited", "b")]
    assert not [e for who, e in delivered if e.get("turn_id") == "b" and e["type"] != "error"]


async def test_prepare_commit_and_pause_resume_through_the_room_keep_the_senders_ids():
    """A room participant's own turn ids work for commit, and paused/resumed reach the turn's owner."""
    from myna.audio.playout import FRAME_SECONDS, Playout

    delivered: list[tuple[str, dict]] = []
    now = [0.0]
    router = Router(lambda send: Session(Echo(), Playout.for_session, send, Metrics(), clock=lambda: now[0]),
                    lambda identity, event: delivered.append((identity, json.loads(json.dumps(event.to_dict())))))
    router.packet("alice", json.dumps({"type": "prepare", "turn_id": "1", "text": "hello there"}))
    router.packet("alice", json.dumps({"type": "end_turn", "turn_id": "1"}))
    await settle()

    def frames(n):
        out = []
        for _ in range(n):
            now[0] += FRAME_SECONDS
            out.append(router.session.output.next_frame(due=now[0]))
        return out

    assert not any(f.any() for f in frames(20))  # prepared: silent
    router.packet("alice", json.dumps({"type": "commit", "turn_id": "1"}))
    assert frames(1)[0].any()
    router.packet("bob", json.dumps({"type": "pause"}))
    assert not any(f.any() for f in frames(10)[1:])
    router.packet("bob", json.dumps({"type": "resume"}))
    frames(20)
    alice = events_of(delivered, "alice")
    assert ("paused", "1") in alice and ("resumed", "1") in alice and alice[-1] == ("turn_done", "1")
