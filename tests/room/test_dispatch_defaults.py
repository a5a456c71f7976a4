"""A dispatch's metadata → the room's turn defaults (:func:`myna.room.worker.dispatch_defaults`);
the worker itself is driven against a real server in tests/room/test_room_cli.py."""

from __future__ import annotations

import json

import pytest

from myna.messages import BadMessage, TurnDefaults
from myna.room.worker import dispatch_defaults

BASE = TurnDefaults(voice="joe")
VOICES = ["joe", "alan"]


def test_no_metadata_keeps_the_workers_defaults():
    assert dispatch_defaults("", BASE, VOICES) is BASE
    assert dispatch_defaults("  ", BASE, VOICES) is BASE


def test_the_metadata_sets_voice_speed_lexicon_and_normalise_and_ignores_other_keys():
    got = dispatch_defaults(json.dumps({"voice": "alan", "speed": 0.75, "normalise": False, "app": {"x": 1},
                                        "lexicon": {"Zyntrix": "zin tricks"}}), BASE, VOICES)
    assert (got.voice, got.speed, got.normalise) == ("alan", 0.75, False)
    assert [e.say for e in got.lexicon.entries] == ["zin tricks"]
    assert dispatch_defaults(json.dumps({"speed": 1.25}), BASE, VOICES) == TurnDefaults(voice="joe", speed=1.25)


@pytest.mark.parametrize("metadata, code", [
    ("not json", "bad_config"),
    ("[1, 2]", "bad_config"),
    (json.dumps({"voice": "nobody"}), "unknown_voice"),
    (json.dumps({"voice": 7}), "bad_config"),
    (json.dumps({"speed": 0.1}), "bad_speed"),
    (json.dumps({"normalise": 1}), "bad_config"),
    (json.dumps({"lexicon": [{"word": "x"}]}), "bad_lexicon"),
])
def test_unusable_metadata_is_a_clear_error(metadata, code):
    with pytest.raises(BadMessage) as caught:
        dispatch_defaults(metadata, BASE, VOICES)
    assert caught.value.code == code and caught.value.message
