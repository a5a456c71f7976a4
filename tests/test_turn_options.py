"""Per-turn options: ``voice`` and ``speed`` on a turn's first ``text``, the session's
defaults, and bad values refused with an ``error`` while the session goes on (an engine without
an honest way to change its pace refuses any speed but 1.0)."""

from __future__ import annotations

import asyncio
import json

import pytest

from myna.engines import EngineError
from myna.messages import BadMessage, Text, TurnDefaults, parse_message
from myna.metrics import Metrics
from myna.session import Session

from inprocess import ToneEngine, ToneStream


class VoicedEngine(ToneEngine):
    """A tone engine with two voices that records the voice each turn was opened with."""

    def __init__(self):
        super().__init__()
        self.opened: list[str | None] = []

    @property
    def voices(self):
        return ["a", "b"]

    def stream(self, voice=None, group=None) -> ToneStream:
        if voice not in (None, "a", "b"):
            raise EngineError("unknown_voice", f"no voice {voice!r}")
        self.opened.append(voice)
        return ToneStream(self)


def session(sent: list, engine=None, **defaults) -> Session:
    from myna.audio.unpaced import UnpacedOutput

    class Sink:
        def put_audio(self, turn_id, pcm):
            pass

        def drop_audio(self):
            pass

    return Session(engine or VoicedEngine(), lambda s: UnpacedOutput.for_session(s, Sink(), 24_000),
                   lambda e: sent.append(e.to_dict()), Metrics(), defaults=TurnDefaults(**defaults))


@pytest.mark.parametrize("speed", [0.49, 2.01, "fast", True, []])
def test_a_bad_speed_is_refused_naming_its_turn(speed):
    raw = json.dumps({"type": "text", "turn_id": "t", "text": "hi", "speed": speed})
    with pytest.raises(BadMessage) as caught:
        parse_message(raw)
    assert caught.value.code == "bad_speed" and caught.value.turn_id == "t" and "0.5 to 2" in caught.value.message


def test_speed_and_voice_are_read_from_text_and_config():
    assert parse_message('{"type": "text", "turn_id": 1, "text": "hi", "speed": 1.5, "voice": "b"}') == Text("1", "hi", voice="b", speed=1.5)
    assert parse_message('{"type": "config", "speed": 0.75}', config=True).speed == 0.75
    with pytest.raises(BadMessage, match="bad_speed|0.5"):
        parse_message('{"type": "config", "speed": 3}', config=True)


async def test_an_engine_that_cannot_change_its_pace_refuses_the_turn_once_and_the_session_goes_on():
    sent: list = []
    s = session(sent)
    s.receive(json.dumps({"type": "text", "turn_id": "fast", "text": "one two ", "speed": 1.5}))
    s.receive(json.dumps({"type": "text", "turn_id": "fast", "text": "three "}))  # the rest of it: dropped
    s.receive(json.dumps({"type": "end_turn", "turn_id": "fast"}))
    s.receive(json.dumps({"type": "text", "turn_id": "next", "text": "four ", "speed": 1}))
    s.receive(json.dumps({"type": "end_turn", "turn_id": "next"}))
    await asyncio.sleep(0.05)
    errors = [(e["code"], e["turn_id"]) for e in sent if e["type"] == "error"]
    assert errors == [("unsupported_speed", "fast")]
    assert [e["turn_id"] for e in sent if e["type"] == "turn_done"] == ["next"]
    assert [e["word"] for e in sent if e["type"] == "word"] == ["four"]
    await s.close()


async def test_a_turn_may_name_another_voice_and_the_session_voice_is_the_default():
    sent: list = []
    engine = VoicedEngine()
    s = session(sent, engine, voice="a")
    for turn_id, voice in (("1", None), ("2", "b"), ("3", "nobody"), ("4", None)):
        message = {"type": "text", "turn_id": turn_id, "text": "word "}
        if voice:
            message["voice"] = voice
        s.receive(json.dumps(message))
        s.receive(json.dumps({"type": "end_turn", "turn_id": turn_id}))
    await asyncio.sleep(0.05)
    assert engine.opened == ["a", "b", "a"]
    assert [(e["code"], e["turn_id"]) for e in sent if e["type"] == "error"] == [("unknown_voice", "3")]
    assert [e["turn_id"] for e in sent if e["type"] == "turn_done"] == ["1", "2", "4"]
    await s.close()


def test_a_session_speed_out_of_range_is_an_error():
    with pytest.raises(EngineError, match="0.5 to 2"):
        session([], speed=4.0)


# -- the normaliser, per session ---------------------------------------------------


async def _turn_of(**options) -> tuple[list[str], float]:
    """The word events and audio_ms of one turn on the tone engine (a tone per spoken word)."""
    sent: list = []
    s = session(sent, engine=ToneEngine(), **options)
    s.handle(parse_message(json.dumps({"type": "text", "turn_id": "t", "text": "Call 555-0199 at 5pm."})))
    s.handle(parse_message(json.dumps({"type": "end_turn", "turn_id": "t"})))
    for _ in range(200):
        if any(e["type"] == "turn_done" for e in sent):
            break
        await asyncio.sleep(0.01)
    await s.close()
    done = next(e for e in sent if e["type"] == "turn_done")
    return [e["word"] for e in sent if e["type"] == "word"], done["audio_ms"]


async def test_a_session_normalises_by_default_and_may_turn_it_off():
    words, normalised_ms = await _turn_of()
    plain_words, plain_ms = await _turn_of(normalise=False)
    assert words == plain_words == ["Call", "555-0199", "at", "5pm."]  # captions: as written
    # said: "Call five five five, zero one nine nine at five PM." (11 words) or as written (4)
    assert normalised_ms == pytest.approx(11 * 120, abs=30) and plain_ms == pytest.approx(4 * 120, abs=30)


@pytest.mark.parametrize(("value", "ok"), [(True, True), (False, True), (None, True), ("no", False), (0, False)])
def test_config_normalise_is_true_or_false(value, ok):
    raw = json.dumps({"type": "config", "normalise": value})
    if ok:
        assert parse_message(raw, config=True).normalise == value
    else:
        with pytest.raises(BadMessage) as caught:
            parse_message(raw, config=True)
        assert caught.value.code == "bad_config" and "normalise" in caught.value.message


@pytest.mark.parametrize(("value", "ok"), [(True, True), (False, True), (None, True), ("false", False), (1, False)])
def test_phrase_cache_is_true_or_false_in_config_and_request_data(value, ok):
    from myna.messages import parse_turn_defaults

    raw = json.dumps({"type": "config", "phrase_cache": value})
    if ok:
        assert parse_message(raw, config=True).phrase_cache == value
        assert parse_turn_defaults({"phrase_cache": value}).phrase_cache is (value is not False)
    else:
        for parse in (lambda: parse_message(raw, config=True), lambda: parse_turn_defaults({"phrase_cache": value})):
            with pytest.raises(BadMessage) as caught:
                parse()
            assert caught.value.code == "bad_config" and "phrase_cache" in caught.value.message


async def test_a_session_without_the_phrase_cache_opens_every_turn_without_it():
    opened: list = []

    class Recording(ToneEngine):
        def stream(self, voice=None, group=None) -> ToneStream:
            stream = ToneStream(self)
            opened.append(stream)
            return stream

    for defaults, expected in (({}, True), ({"phrase_cache": False}, False)):
        opened.clear()
        s = session([], engine=Recording(), **defaults)
        s.handle(parse_message(json.dumps({"type": "text", "turn_id": "t", "text": "Hi."})))
        await s.close()
        assert [stream.phrase_cache_on for stream in opened] == [expected]


def test_a_text_streams_attributes_are_read_as_a_text_messages_options():
    from myna.messages import stream_turn_options

    assert stream_turn_options({"speed": "1.5", "voice": "v", "lk.segment_id": "x"}, "t") == {
        "voice": "v", "speed": 1.5, "language": None}
    assert stream_turn_options({}, "t") == {"voice": None, "speed": None, "language": None}
    for attributes, code in [({"speed": "fast"}, "bad_speed"), ({"speed": "9"}, "bad_speed"),
                             ({"speed": "nan"}, "bad_speed"), ({"language": "not a tag!"}, "bad_language")]:
        with pytest.raises(BadMessage) as caught:
            stream_turn_options(attributes, "t")
        assert (caught.value.code, caught.value.turn_id) == (code, "t"), attributes
