"""Tokens a user could really send: correctly signed tokens with claims of
the wrong shape, clocks that disagree, tokens with many attributes. Each is answered on the offer
and on the WebSocket in the contract's JSON (401, 403 or 431, never 500), and the clients' advice
follows the reason (a worker in this process, tone engine, loopback only)."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import json
import logging
import os
import sys
import time

import aiohttp
import jwt
import pytest

from inprocess import ToneEngine
from myna.access import AccessRefused, Credentials
from myna.bench.soak import serve_in_process
from myna.integrations.backend import MynaError, RemoteBackend
from myna.limits import Limits
from myna.rtc.client import MynaClient
from myna.server.app import Worker
from myna.server.auth import CLOCK_SKEW_S, MAX_TOKEN_BYTES, Authenticator, AuthError, mint_token

pytestmark = pytest.mark.network

KEY, SECRET = "myna-test-key", "a-test-secret-that-is-long-enough-for-hs256"
HOUR = datetime.timedelta(hours=1)
OFFER = {"sdp": "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", "type": "offer", "request_data": {}}


DROP = object()  # a claim left out


def signed(**claims) -> str:
    """A token signed with the worker's key: a good one, with ``claims`` replacing its own."""
    now = int(time.time())
    base = {"iss": KEY, "sub": "alice", "nbf": now, "exp": now + 3600, "inference": {"perform": True}}
    return sign_raw(json.dumps({k: v for k, v in {**base, **claims}.items() if v is not DROP}).encode())


def sign_raw(payload: bytes) -> str:
    """An HS256 JWT of ``payload`` (any JSON, which PyJWT's encoder would refuse) with the worker's secret."""
    header = jwt.utils.base64url_encode(b'{"alg":"HS256","typ":"JWT"}')
    body = jwt.utils.base64url_encode(payload)
    sig = hmac.new(SECRET.encode(), header + b"." + body, hashlib.sha256).digest()
    return (header + b"." + body + b"." + jwt.utils.base64url_encode(sig)).decode()


def secured_worker() -> Worker:
    w = Worker(engines={"tone": ToneEngine()}, limits=Limits.off())
    w.auth = Authenticator(KEY, SECRET)
    return w


async def refusals(url: str, token: str) -> tuple[tuple[int, str, str], tuple[int, str | None]]:
    """How the offer and the WebSocket handshake answer ``token``: (status, code, message) of the
    offer's JSON body, (status, ``Myna-Error`` header) of the WebSocket."""
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/offer", json=OFFER, headers={"Authorization": f"Bearer {token}"}) as resp:
            body = await resp.json()  # (fails unless the answer is JSON)
            offer = (resp.status, body["error"]["code"], body["error"]["message"])
        try:
            async with http.ws_connect(url.replace("http", "ws", 1) + "/v1/tts/stream",
                                       headers={"Authorization": f"Bearer {token}"}):
                ws = (101, None)
        except aiohttp.WSServerHandshakeError as exc:
            ws = (exc.status, exc.headers.get("Myna-Error"))
    return offer, ws


# -- case 5: malformed claims --------------------------------------------------------------
MALFORMED = {
    "inference null": ({"inference": None}, 403, "forbidden"),
    "inference a string": ({"inference": "yes"}, 401, "bad_token"),
    "perform a string": ({"inference": {"perform": "yes"}}, 401, "bad_token"),
    "attributes a list": ({"attributes": ["myna.engines", "tone"]}, 401, "bad_token"),
    "video a list": ({"video": ["roomJoin"]}, 401, "bad_token"),
    "sip a number": ({"sip": 3}, 401, "bad_token"),
    "engines a number": ({"attributes": {"myna.engines": 7}}, 401, "bad_token"),
    "max_sessions a word": ({"attributes": {"myna.max_sessions": "many"}}, 401, "bad_token"),
    "max_sessions zero": ({"attributes": {"myna.max_sessions": "0"}}, 401, "bad_token"),
    "sub a number": ({"sub": 42}, 401, "bad_token"),
    "sub missing": ({"sub": DROP}, 401, "bad_token"),
    "exp a string": ({"exp": "tomorrow"}, 401, "bad_token"),
    "nbf a list": ({"nbf": [1]}, 401, "bad_token"),
    "exp missing": ({"exp": DROP}, 401, "bad_token"),
    "exp null": ({"exp": None}, 401, "bad_token"),
    "exp true": ({"exp": True}, 401, "bad_token"),
    "nbf a string": ({"nbf": "now"}, 401, "bad_token"),
    "iat huge": ({"iat": 1e308 * 10}, 401, "bad_token"),
    "iss a list": ({"iss": [KEY]}, 401, "bad_token"),
    "claims not a dict": (None, 401, "bad_token"),
}


def malformed_token(claims: dict | None) -> str:
    if claims is None:  # a signed JWT whose payload is a JSON list
        return sign_raw(b'["not", "claims"]')
    return signed(**claims)


async def test_signed_tokens_with_malformed_claims_are_refused_in_json_on_both_doors_never_500(caplog):
    async with serve_in_process(secured_worker()) as url:
        for name, (claims, status, code) in MALFORMED.items():
            offer, ws = await refusals(url, malformed_token(claims))
            assert offer[:2] == (status, code), (name, offer)
            assert ws == (status, code), (name, ws)
    assert not [r for r in caplog.records if r.levelname == "ERROR" and _of_the_worker(r)], "no traceback is logged"


def _of_the_worker(record: logging.LogRecord) -> bool:
    """Logged by the worker (its loggers, aiohttp's, or asyncio's about a task running Myna's
    code), not by an earlier test's garbage collected now (an unclosed client's task)."""
    if record.name.split(".")[0] in ("myna", "aiohttp"):
        return True
    trace = logging.Formatter().formatException(record.exc_info) if record.exc_info else ""
    return "/myna/" in record.getMessage() + trace


def test_a_malformed_claim_is_named_in_the_refusal():
    auth = Authenticator(KEY, SECRET)
    with pytest.raises(AuthError, match="attributes claim is malformed"):
        auth.verify(signed(attributes=["x"]))
    with pytest.raises(AuthError, match="myna.max_sessions"):
        auth.verify(signed(attributes={"myna.max_sessions": "-3"}))
    assert auth.verify(signed(attributes={"myna.max_sessions": "2", "myna.engines": "tone"})).max_sessions == 2
    assert auth.verify(signed(exp=10**30)).identity == "alice"  # far future: fine
    with pytest.raises(AuthError, match="not valid yet"):
        auth.verify(signed(nbf=10**30))  # (a time no datetime can show is still named)


# -- case 6: clock skew --------------------------------------------------------------------
def minted_at(offset_s: float, ttl: datetime.timedelta = datetime.timedelta(minutes=10)) -> str:
    """A token minted by ``myna token``'s code on a machine whose clock is ``offset_s`` ahead."""
    from unittest import mock

    real = datetime.datetime

    class Skewed(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) + datetime.timedelta(seconds=offset_s)

        @classmethod
        def utcnow(cls):
            return real.utcnow() + datetime.timedelta(seconds=offset_s)

    with mock.patch("livekit.api.access_token.datetime.datetime", Skewed):
        return mint_token(KEY, SECRET, "alice", ttl)


def test_ordinary_skew_is_tolerated_and_beyond_it_the_refusal_says_which_and_the_workers_time():
    auth = Authenticator(KEY, SECRET)
    assert CLOCK_SKEW_S >= 120
    for offset in (120, -120, CLOCK_SKEW_S - 30):  # a minter 2 minutes ahead or behind: accepted
        assert auth.verify(minted_at(offset)).identity == "alice"
    with pytest.raises(AuthError) as ahead:
        auth.verify(minted_at(CLOCK_SKEW_S + 120))
    assert (ahead.value.status, ahead.value.code) == (401, "token_not_yet_valid")
    assert "worker's clock reads" in ahead.value.message and time.strftime("%Y-%m-%dT", time.gmtime()) in ahead.value.message
    with pytest.raises(AuthError) as behind:  # minted 10 min ago by the worker's clock, 10-minute ttl... plus the skew
        auth.verify(minted_at(-(600 + CLOCK_SKEW_S + 60)))
    assert behind.value.code == "token_expired" and "worker's clock reads" in behind.value.message


async def test_skew_refusals_reach_both_doors_and_every_client_advises_syncing_clocks_not_minting_again():
    ahead = minted_at(CLOCK_SKEW_S + 120)
    async with serve_in_process(secured_worker()) as url:
        offer, ws = await refusals(url, ahead)
        assert offer[:2] == (401, "token_not_yet_valid") and ws == (401, "token_not_yet_valid")
        with pytest.raises(AccessRefused) as webrtc:  # myna say --server, MynaClient
            await MynaClient(url, token=ahead).connect()
        backend = RemoteBackend(url, credentials=Credentials(ahead))  # the plug-ins' remote backend
        with pytest.raises(MynaError) as plugin:
            await backend.start()
        await backend.aclose()
    for advice in (str(webrtc.value), plugin.value.message):
        assert "clock" in advice and "NTP" in advice and "another key" not in advice, advice
    assert "worker's clock reads" in str(webrtc.value) and "worker's clock reads" in plugin.value.message
    assert plugin.value.code == "token_not_yet_valid"


# -- case 7: large tokens ------------------------------------------------------------------
def token_of_size(size: int) -> str:
    """A valid token of about ``size`` bytes (many attributes)."""
    attributes, n = {}, 0
    token = signed()
    while len(token) < size:
        attributes[f"note.{n}"] = "x" * 200
        n += 1
        token = signed(attributes=attributes)
    return token


async def test_a_9_kb_token_is_accepted_on_both_doors_and_an_oversized_one_gets_431_json():
    big = token_of_size(9 * 1024)
    assert len(big) > 8190
    too_big = token_of_size(MAX_TOKEN_BYTES + 1024)
    async with serve_in_process(secured_worker()) as url, aiohttp.ClientSession() as http:
        ws_url = url.replace("http", "ws", 1) + "/v1/tts/stream"
        for ws in (await http.ws_connect(ws_url, headers={"Authorization": f"Bearer {big}"}),
                   await http.ws_connect(f"{ws_url}?access_token={big}")):
            assert (await ws.receive_json())["type"] == "ready"
            await ws.close()
        async with MynaClient(url, token=big) as client:
            assert (await client.speak("one two", tokens_per_s=None)).event_types()[-1] == "turn_done"
        offer, ws = await refusals(url, too_big)
        assert offer[:2] == (431, "token_too_large") and str(MAX_TOKEN_BYTES) in offer[2]
        assert ws == (431, "token_too_large")
        with pytest.raises(aiohttp.WSServerHandshakeError) as query:
            await http.ws_connect(f"{ws_url}?access_token={too_big}")
        assert query.value.status == 431


async def test_myna_say_prints_one_line_for_an_oversized_token(tmp_path):
    too_big = token_of_size(MAX_TOKEN_BYTES + 1024)
    async with serve_in_process(secured_worker()) as url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MYNA_")}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "myna.cli", "say", "hello there", "--server", url, "--token", too_big,
            "-o", str(tmp_path / "out.wav"), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, lines
    assert f"at most {MAX_TOKEN_BYTES} bytes" in lines[0] and "fewer attributes" in lines[0]
