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
