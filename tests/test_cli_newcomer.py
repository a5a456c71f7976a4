"""What a newcomer meets first on the command line: ``myna --version`` (the installed package's
metadata, pyproject's ``version``), one line about a short (development) secret instead of
PyJWT's two-line warning in every process, and ``myna talk``'s refusals of bad input before it
reaches for any server."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def myna(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "myna.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_the_version_is_pyprojects():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    done = myna("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"myna {version}"


def test_a_short_secret_is_one_line_of_ours_and_none_of_pyjwts():
    done = myna("token", "--identity", "me", "--api-key", "devkey", "--api-secret", "secret")
    assert done.returncode == 0 and done.stdout.count(".") == 2  # a JWT
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "is 6 bytes, under the 32 that HS256 wants" in lines[0], done.stderr
    assert "InsecureKeyLengthWarning" not in done.stderr


def test_a_long_secret_says_nothing():
    done = myna("token", "--identity", "me", "--api-key", "k", "--api-secret", "s" * 32)
    assert done.returncode == 0 and done.stderr == ""


@pytest.mark.parametrize("args, expected", [
    (["..."], "nothing to speak in '...'"),
    (["Hello.", "-o", "/nonexistent-folder/talk.wav"], "cannot write /nonexistent-folder/talk.wav"),
])
def test_myna_talk_refuses_bad_input_before_joining(args, expected, tmp_path):
    pytest.importorskip("livekit.rtc")
    # Port 1: nothing listens there; bad input must be refused before any connection is tried.
    done = myna("talk", "--url", "ws://127.0.0.1:1", "--room", "r", *args,
                env={"LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "secret"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"myna talk: {expected}"), done.stderr


@pytest.mark.parametrize("args, expected", [
    (["--wait", "nan", "Hello."], "--wait must be a number of seconds, 0 or more"),
    (["--wait", "-1", "Hello."], "--wait must be a number of seconds, 0 or more"),
    (["--token-rate", "-5", "Hello."], "--token-rate must be a number of tokens per second, 0 or more"),
    (["--token-rate", "inf", "Hello."], "--token-rate must be a number of tokens per second, 0 or more"),
    (["--identity", "myna", "Hello."], "--identity 'myna' is Myna's identity in the room"),
    (["--identity", "bot", "--myna", "bot", "Hello."], "--identity 'bot' is Myna's identity in the room"),
    (["--room", "", "Hello."], "error: argument --room: must name a room (it is empty)"),
    (["--room", "  ", "Hello."], "error: argument --room: must name a room (it is empty)"),
])
def test_myna_talk_refuses_bad_options_before_joining(args, expected):
    done = myna("talk", "--url", "ws://127.0.0.1:1", "--room", "r", *args,
                env={"LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "secret"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"myna talk: {expected}"), done.stderr


def test_myna_talk_without_keys_names_talk():
    pytest.importorskip("livekit.rtc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")}
    done = subprocess.run([sys.executable, "-m", "myna.cli", "talk", "--url", "ws://127.0.0.1:1", "--room", "r",
                           "Hello."], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "pass --token to `myna talk`" in done.stderr, done.stderr


def test_myna_talk_hides_tokens_and_counts_repeated_errors():
    pytest.importorskip("livekit.rtc")
    from myna.room.cli import _error_lines, _short_tokens

    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJuYW1lIjoidGFsayJ9.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
    said = _short_tokens(f"401 Unauthorized - invalid token: {jwt}, error: go-jose")
    assert jwt not in said and "invalid token: eyJhbGciOiJI..., error: go-jose" in said
    events = [{"type": "error", "code": "rate", "message": "slow down"}] * 3 + [
        {"type": "word"}, {"type": "error", "code": "other", "message": "x"}]
    assert _error_lines(2, events) == ["myna talk: turn 2: error rate: slow down (3 times)",
                                       "myna talk: turn 2: error other: x"]


@pytest.fixture
def silent_server():
    """A port that accepts TCP connections and never answers (a wedged server)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"ws://127.0.0.1:{s.getsockname()[1]}"


def talk_process(url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "myna.cli", "talk", "--url", url, "--room", "r", *args, "Hello."],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "secret"})


def test_myna_talk_wait_bounds_the_join(silent_server):
    pytest.importorskip("livekit.rtc")
    import time

    t0 = time.monotonic()
    proc = talk_process(silent_server, "--wait", "2")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and time.monotonic() - t0 < 15, err
    assert "could not join room 'r'" in err and "no answer in 2 s" in err and "Traceback" not in err, err
    assert " livekit:" not in err, err  # the SDK's INFO/WARNING lines are off


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_myna_talk_interrupted_is_one_line(silent_server, sig, code):
    pytest.importorskip("livekit.rtc")
    import signal
    import time

    proc = talk_process(silent_server, "--wait", "30")
    time.sleep(4)
    assert proc.poll() is None
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == "myna talk: interrupted" and "Traceback" not in err, err
