"""A WebRTC session's turn defaults from the offer's ``request_data``: ``lexicon`` and
``normalise`` as on the WebSocket's ``config``, checked by the same rules
(:func:`myna.messages.parse_turn_defaults`); served in this process on loopback with the tone
engine (tests/inprocess.py: one 120 ms tone per spoken word, so a turn's ``audio_ms`` counts
the words the engine was given)."""

from __future__ import annotations

import json

import pytest

from inprocess import ToneEngine, app_client
from myna.bench.soak import serve_in_process
from myna.rtc.client import MynaClient
from myna.server.app import Worker

pytestmark = pytest.mark.network

TEXT = "Call Zyntrix at 555-0199"
LEXICON = {"Zyntrix": "zin tricks"}


async def _audio_ms(url: str, turn_defaults: dict | None) -> tuple[float, list[str]]:
    async with MynaClient(url, turn_defaults=turn_defaults) as client:
        result = await client.speak(TEXT, tokens_per_s=None)
    done = result.events[-1]
    assert done["type"] == "turn_done", result.events
    return done["audio_ms"], [e["word"] for e in result.events if e["type"] == "word"]


async def test_the_offer_sets_the_sessions_lexicon_and_normaliser_and_other_sessions_keep_theirs():
    async with serve_in_process(Worker(engines={"tone": ToneEngine()})) as url:
        own_ms, own_words = await _audio_ms(url, {"lexicon": LEXICON, "normalise": False})
        plain_ms, plain_words = await _audio_ms(url, None)
    # own: Call, zin tricks (the lexicon), at, 555-0199 as written: 5 tones
    # plain: Call, Zyntrix, at, five five five zero one nine nine: 10 tones
    assert own_ms == pytest.approx(5 * 120, abs=30) and plain_ms == pytest.approx(10 * 120, abs=30)
    assert own_words == plain_words == ["Call", "Zyntrix", "at", "555-0199"]  # captions: as written


@pytest.mark.parametrize("request_data, code, says", [
    ({"speed": 3}, "bad_speed", "0.5 to 2"),
    ({"speed": "fast"}, "bad_speed", "number"),
    ({"lexicon": [{"regex": "(", "say": "x"}]}, "bad_lexicon", "lexicon entry 1"),
    ({"lexicon": "Zyntrix"}, "bad_lexicon", "lexicon"),
    ({"lexicon": [{"regex": "a{99999999999}", "say": "x"}]}, "bad_lexicon", "does not compile"),  # (was a 500)
    ({"lexicon": [{"word": "hello", "ipa": "/"}]}, "bad_lexicon", "empty"),  # (was a silent word)
    ({"normalise": "no"}, "bad_request", "normalise"),
    ({"voice": 3}, "bad_request", "voice"),
])
async def test_bad_turn_defaults_in_the_offer_are_400s_that_name_the_field(request_data, code, says):
    async with app_client() as client:
        body = json.dumps({"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer",
                           "request_data": request_data})
        async with client.post("/api/offer", data=body, headers={"Content-Type": "application/json"}) as resp:
            answer = await resp.json()
        assert resp.status == 400 and answer["error"]["code"] == code, answer
        assert says in answer["error"]["message"] and answer["error"]["message"].startswith("request_data")
        async with client.get("/healthz") as resp:  # the process goes on
            assert resp.status == 200


@pytest.mark.parametrize("request_data", [[], 0, False, "", "engine=piper"])
async def test_request_data_that_is_not_an_object_is_a_400_even_when_falsy(request_data):
    async with app_client() as client:
        body = json.dumps({"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer",
                           "request_data": request_data})
        async with client.post("/api/offer", data=body, headers={"Content-Type": "application/json"}) as resp:
            answer = await resp.json()
        assert resp.status == 400 and answer["error"]["code"] == "bad_request", answer
        assert "must be an object" in answer["error"]["message"]
