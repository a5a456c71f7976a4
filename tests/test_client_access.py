"""The clients of a worker with keys (``myna.access``): ``MynaClient``, ``myna say --server`` and
``examples/client.py`` send the token the worker wants, and a missing or wrong one gives the user
one clear line naming the fix (a worker in this process, tone engine, loopback only)."""

from __future__ import annotations

import asyncio
import datetime
import os
import sys
from pathlib import Path

import jwt
import pytest

from inprocess import ToneEngine
from myna.access import AccessRefused, Credentials
from myna.bench.soak import serve_in_process
from myna.rtc.client import MynaClient
from myna.server.app import Worker
from myna.server.auth import AuthError, Authenticator, mint_token
from myna.limits import Limits

KEY, SECRET = "myna-test-key", "a-test-secret-that-is-long-enough-for-hs256"
OTHER_SECRET = "another-secret-of-the-same-length-as-the-key!"
HOUR = datetime.timedelta(hours=1)
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "client.py"
ACCESS_ENV = ("MYNA_TOKEN", "MYNA_API_KEY", "MYNA_API_SECRET")


@pytest.fixture(autouse=True)
def no_access_env(monkeypatch):
    """Tests start with no token or key pair in the environment (they set what they need)."""
    for name in ACCESS_ENV:
        monkeypatch.delenv(name, raising=False)


def secured_worker() -> Worker:
    w = Worker(engines={"tone": ToneEngine(), "tone2": ToneEngine("tone2")}, limits=Limits.off())
    w.auth = Authenticator(KEY, SECRET)
    return w


# -- where the token comes from ----------------------------------------------------------------
def test_a_given_token_beats_the_environment_and_the_environment_beats_nothing(monkeypatch):
    assert Credentials().token() is None and Credentials().headers() == {}
    monkeypatch.setenv("MYNA_TOKEN", "from-env")
    assert Credentials().token() == "from-env"
    assert Credentials("given").headers() == {"Authorization": "Bearer given"}
    monkeypatch.setenv("MYNA_API_KEY", KEY)
    monkeypatch.setenv("MYNA_API_SECRET", SECRET)
    assert Credentials().token() == "from-env"  # a token is used as it is, not replaced by a minted one


def test_a_token_with_a_line_end_is_sent_without_it_and_garbage_is_refused_by_name(monkeypatch):
    """A token read from an env file ends with "\\n" or "\\r\\n": the header carries the token
    alone (a line end in a header was refused by aiohttp as "header injection"); a token with
    spaces or control characters inside is no token, and the error says where it came from."""
    monkeypatch.setenv("MYNA_TOKEN", "from-env\r\n")
    assert Credentials().headers() == {"Authorization": "Bearer from-env"}
    assert Credentials(" given\n").token() == "given"
    monkeypatch.setenv("MYNA_TOKEN", "  ")
    assert Credentials().headers() == {}  # blank: no token, as when unset
    monkeypatch.setenv("MYNA_TOKEN", "two\nlines")
    with pytest.raises(ValueError, match="MYNA_TOKEN is not an access token"):
        Credentials()
    with pytest.raises(ValueError, match="the token given is not an access token"):
        Credentials("a b")


def test_a_key_pair_mints_a_fresh_token_the_worker_accepts_for_each_connection(monkeypatch):
    monkeypatch.setenv("MYNA_API_KEY", KEY)
    monkeypatch.setenv("MYNA_API_SECRET", SECRET)
    credentials = Credentials(identity="agent-7")
    first = credentials.token()
    grant = Authenticator(KEY, SECRET).verify(first)
    assert grant.identity == "agent-7"
    claims = jwt.decode(first, SECRET, algorithms=["HS256"], options={"verify_aud": False})
    assert 0 < claims["exp"] - datetime.datetime.now(datetime.timezone.utc).timestamp() <= 600
    monkeypatch.setenv("MYNA_TOKEN", "from-env")
    given = Credentials(api_key=KEY, api_secret=OTHER_SECRET)  # given keys beat the environment's token and keys
    assert given.token() != "from-env"
    with pytest.raises(AuthError, match="another secret"):
        Authenticator(KEY, SECRET).verify(given.token())
    assert Credentials().identity != Credentials().identity  # separate clients, separate session caps


def test_a_refusal_names_the_fix_for_each_code():
    assert "MYNA_TOKEN" in str(AccessRefused(401, "token_required")) and "myna token" in str(AccessRefused(401, "token_required"))
    assert "another key" in str(AccessRefused.from_status(401, token_sent=True))
    assert AccessRefused.from_status(401, token_sent=False).code == "token_required"
    assert AccessRefused.from_status(403, token_sent=True).code == "forbidden"


# -- MynaClient (WebRTC) ---------------------------------------------------------------------
@pytest.mark.network
async def test_the_webrtc_client_sends_its_token_and_a_refusal_names_the_fix(monkeypatch):
    good = mint_token(KEY, SECRET, "alice", HOUR)
    wrong = mint_token(KEY, OTHER_SECRET, "alice", HOUR)
    async with serve_in_process(secured_worker()) as url:
        for token, code, fix in ((None, "token_required", "MYNA_TOKEN"), (wrong, "bad_token", "myna token")):
            with pytest.raises(AccessRefused) as refused:
                await MynaClient(url, token=token).connect()
            assert (refused.value.status, refused.value.code) == (401, code)
            assert fix in str(refused.value)
        async with MynaClient(url, token=good) as client:
            result = await client.speak("one two", tokens_per_s=None)
            assert result.event_types()[-1] == "turn_done" and result.perceived_ttfa_ms is not None
        monkeypatch.setenv("MYNA_API_KEY", KEY)  # no token given: one minted from the environment's keys
        monkeypatch.setenv("MYNA_API_SECRET", SECRET)
        async with MynaClient(url) as client:
            assert client.ready["type"] == "ready"


# -- the command line and the example ---------------------------------------------------------
async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run a client process (``python argv...``) while this loop serves the worker; its exit
    status and stderr."""
    base = {k: v for k, v in os.environ.items() if k not in ACCESS_ENV}
    proc = await asyncio.create_subprocess_exec(sys.executable, *argv, env={**base, **(env or {})},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, stderr.decode()


def say(url: str, out: Path, *extra: str) -> tuple[str, ...]:
    return ("-m", "myna.cli", "say", "--server", url, "--engine", "tone", "--token-rate", "0", "one two three",
            "-o", str(out), *extra)


def example(url: str, out: Path, *extra: str) -> tuple[str, ...]:
    return (str(EXAMPLE), "--server", url, "--token-rate", "0", "one two three", "-o", str(out), *extra)


@pytest.mark.network
@pytest.mark.parametrize("client, prefix", [(say, "myna say: "), (example, "client.py: ")])
async def test_a_command_line_client_with_no_or_a_wrong_token_exits_1_in_one_line(tmp_path, client, prefix):
    wrong = mint_token(KEY, OTHER_SECRET, "carol", HOUR)
    async with serve_in_process(secured_worker()) as url:
        for argv, env, fix in ((client(url, tmp_path / "a.wav"), None, "MYNA_TOKEN"),
                               (client(url, tmp_path / "b.wav", "--token", wrong), None, "myna token"),
                               (client(url, tmp_path / "c.wav"), {"MYNA_TOKEN": wrong}, "another secret")):
            status, stderr = await run(*argv, env=env)
            lines = stderr.strip().splitlines()
            assert status == 1 and len(lines) == 1 and "Traceback" not in stderr, stderr
            assert lines[0].startswith(prefix) and fix in lines[0], lines[0]
        assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.network
@pytest.mark.parametrize("client", [say, example])
async def test_a_command_line_client_with_the_right_token_speaks(tmp_path, client):
    good = mint_token(KEY, SECRET, "dave", HOUR)
    async with serve_in_process(secured_worker()) as url:
        status, stderr = await run(*client(url, tmp_path / "flag.wav", "--token", good))
        assert status == 0, stderr
        status, stderr = await run(*client(url, tmp_path / "env.wav"), env={"MYNA_TOKEN": good})
        assert status == 0, stderr
    assert (tmp_path / "flag.wav").stat().st_size > 10_000 and (tmp_path / "env.wav").stat().st_size > 10_000
