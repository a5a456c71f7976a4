"""The contract's events (myna.events): the JSON each type makes, to the byte."""

from __future__ import annotations

import json

import pytest

from myna.events import Error, Fallback, FirstAudio, Ready, TurnDone, TurnStarted, Word, decode_event, encode_event

GAPS = {"gap_ms": {"count": 1, "total": 40.0, "longest": 40.0}, "gaps": [[120.0, 40.0]]}


@pytest.mark.parametrize("event, text", [
    (Ready(engines=["piper", "dsm"], engine="piper", sample_rate=48000),
     '{"type": "ready", "engines": ["piper", "dsm"], "engine": "piper", "sample_rate": 48000}'),
    (Ready(engines=["piper"], engine="piper", voice=None, sample_rate=22050, scripts=["Latin"]),
     '{"type": "ready", "engines": ["piper"], "engine": "piper", "voice": null, "sample_rate": 22050, "scripts": ["Latin"]}'),
    (TurnStarted(turn_id="t1"), '{"type": "turn_started", "turn_id": "t1"}'),
    (FirstAudio(turn_id="t1", server_ttfa_ms=212.5, pre_roll_ms=0.0),
     '{"type": "first_audio", "turn_id": "t1", "server_ttfa_ms": 212.5, "pre_roll_ms": 0.0}'),
    (Word(turn_id="t1", word="$12.75", start_ms=480.0),
     '{"type": "word", "turn_id": "t1", "word": "$12.75", "start_ms": 480.0}'),
    (TurnDone(turn_id="t1", audio_ms=1500.0, underruns=0, **GAPS),
     '{"type": "turn_done", "turn_id": "t1", "audio_ms": 1500.0, "underruns": 0, '
     '"gap_ms": {"count": 1, "total": 40.0, "longest": 40.0}, "gaps": [[120.0, 40.0]]}'),
    (TurnDone(turn_id="t1", audio_ms=20.0, underruns=1, **GAPS, interrupted=True),
     '{"type": "turn_done", "turn_id": "t1", "audio_ms": 20.0, "underruns": 1, '
     '"gap_ms": {"count": 1, "total": 40.0, "longest": 40.0}, "gaps": [[120.0, 40.0]], "interrupted": true}'),
    (Fallback(turn_id="t1", from_engine="dsm", to_engine="piper", reason="stall", at_word=3),
     '{"type": "fallback", "turn_id": "t1", "from": "dsm", "to": "piper", "reason": "stall", "at_word": 3}'),
    (Error(code="bad_json", message="message is not valid JSON"),
     '{"type": "error", "code": "bad_json", "message": "message is not valid JSON"}'),
    (Error(code="unsupported_language", message="left out", turn_id="t1"),
     '{"type": "error", "code": "unsupported_language", "message": "left out", "turn_id": "t1"}'),
])
def test_each_event_is_the_json_the_contract_lists(event, text):
    assert encode_event(event) == text
    assert decode_event(json.loads(text)) == event  # and a client reads it back as the same event


def test_a_message_too_long_is_cut_and_other_fields_never_are():
    long = Error(code="bad_message", message="x" * 20_000, turn_id="t")
    text = encode_event(long, max_bytes=1000)
    assert len(text) <= 1000 and json.loads(text)["message"].endswith("…") and json.loads(text)["turn_id"] == "t"
    assert encode_event(Word(turn_id="t", word="y" * 2000, start_ms=0.0), max_bytes=1000) is None


def test_a_client_reads_events_of_a_newer_worker_and_skips_what_it_cannot_read():
    newer = {"type": "word", "turn_id": "t", "word": "hi", "start_ms": 1.0, "confidence": 0.9}
    assert decode_event(newer) == Word(turn_id="t", word="hi", start_ms=1.0)
    assert decode_event({"type": "brand_new", "turn_id": "t"}) is None
    assert decode_event({"type": ["a"]}) is None and decode_event(["not", "an", "event"]) is None
    older = decode_event({"type": "turn_done", "turn_id": "t", "audio_ms": 10.0, "underruns": 0})  # before gaps
    assert older == TurnDone(turn_id="t", audio_ms=10.0, underruns=0, gap_ms=None, gaps=None)
    assert decode_event({"type": "error", "code": "x"}) == Error(code="x", message=None)


def test_a_door_renames_a_turn_in_a_copy():
    done = TurnDone(turn_id="r7", audio_ms=1.0, underruns=0, **GAPS)
    assert done.with_turn_id("1") == TurnDone(turn_id="1", audio_ms=1.0, underruns=0, **GAPS) and done.turn_id == "r7"
    ready = Ready(engines=["piper"], engine="piper", sample_rate=48000)
    assert ready.with_turn_id("1") is ready  # an event of no turn stays as it is


def test_events_are_values():
    with pytest.raises(AttributeError):
        TurnStarted(turn_id="a").turn_id = "b"
    assert Word(turn_id="a", word="hi", start_ms=1.0) == Word(turn_id="a", word="hi", start_ms=1.0)
