"""docs/livekit-quickstart.md, walked: the commands a newcomer runs, as they are written there.

A development server (``scripts/livekit-dev.yaml``: ws://127.0.0.1:7880, keys devkey / secret; the
binary the test set-up built), ``myna room`` in a room and ``myna talk`` speaking through it,
then ``myna worker`` and ``myna talk --dispatch myna``. Each ``myna`` command is the venv's own
``myna`` script with the page's arguments, run from a scratch folder; Myna's speech must arrive
through ``myna talk`` (its WAV file, heard by Whisper). Also checked: the development keys' warning
comes once per process in our words (PyJWT's own two lines never), ``myna room`` says once that
the room is empty and exits 0 when LiveKit closes it, the worker stops cleanly.

The server's ports are its fixed development ones: the test runs in the suite's own network
namespace (scripts/test.sh), where nothing else listens on them.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
import wave
from pathlib import Path

import jiwer
import numpy as np
import pytest

from myna.bench.livekit_server import find_livekit_server, isolated_namespace, media_address, missing_livekit_server
from myna.bench.processes import terminate
from tests.e2e.test_serve import _words, transcribe
from tests.room.support import ARTIFACTS

pytestmark = [pytest.mark.network]

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "livekit-quickstart.md"
URL = "ws://127.0.0.1:7880"
KEYS = "export LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret"
SERVER = ".lk/bin/livekit-server --config scripts/livekit-dev.yaml"
ROOM = ".venv/bin/myna room --url ws://127.0.0.1:7880 --room demo"
TALK = '.venv/bin/myna talk --url ws://127.0.0.1:7880 --room demo "Hello from a LiveKit room."'
WORKER = ".venv/bin/myna worker --url ws://127.0.0.1:7880"
DISPATCH = ('.venv/bin/myna talk --url ws://127.0.0.1:7880 --room demo-worker --dispatch myna '
            '"Hello from a dispatched worker."')
NOTICE = "LIVEKIT_API_SECRET is 6 bytes, under the 32 that HS256 wants"


class Command:
    """One of the page's commands as a process, its output in test-artifacts/."""

    def __init__(self, line: str, cwd: Path, name: str):
        argv = shlex.split(line)
        if argv[0] == ".lk/bin/livekit-server":
            argv[0] = str(find_livekit_server())
            argv = [str(ROOT / a) if a.startswith("scripts/") else a for a in argv]
        elif argv[0] == ".venv/bin/myna":
            argv[0] = str(Path(sys.executable).parent / "myna")
        self.log_path = ARTIFACTS / f"quickstart-{name}-{time.monotonic_ns()}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LIVEKIT_API_KEY": "devkey", "LIVEKIT_API_SECRET": "secret"}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {text!r}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} in:\n{self.output()[-3000:]}"
            time.sleep(0.1)

    def exit_code(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running after {timeout:g} s:\n{self.output()[-3000:]}")

    def stop(self) -> int:
        return terminate(self.proc, 40)


def speech(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels()) == (48_000, 1)
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


def heard(whisper, path: Path, said: str) -> float:
    pcm = speech(path)
    assert len(pcm) > 48_000 and np.abs(pcm.astype(np.float32)).max() > 1000  # a second or more, audible
    words = _words(transcribe(whisper, pcm)).replace("live kit", "livekit")  # (Whisper's spelling varies)
    return jiwer.wer(_words(said), words)


@pytest.fixture
def dev_server(tmp_path):
    """The development LiveKit server as the page starts it, ready."""
    if find_livekit_server() is None:
        pytest.skip(missing_livekit_server())
    if not isolated_namespace():
        pytest.fail("LiveKit tests must run in a loopback-only namespace: use `bash scripts/test.sh`")
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", 7880)) == 0:
            pytest.fail("something listens on 127.0.0.1:7880 in this namespace already (another development livekit-server?)")
    media_address()  # the veth pair media needs in this namespace (myna.bench.livekit_server)
    ARTIFACTS.mkdir(exist_ok=True)
    server = Command(SERVER, tmp_path, "server")
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:7880/", timeout=1) as answer:
                if answer.status == 200:
                    break
        except OSError:
            assert server.proc.poll() is None and time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.1)
    yield server
    server.stop()


@pytest.mark.serial  # Whisper hears every word: a starved worker underruns
def test_the_quickstart_commands_speak_through_a_room_and_a_dispatched_worker(dev_server, tmp_path, whisper):
    page = PAGE.read_text()
    for line in (SERVER, KEYS, ROOM, TALK, WORKER, DISPATCH):
        assert line in page, f"docs/livekit-quickstart.md no longer says: {line}"
    room = Command(ROOM, tmp_path, "room")
    worker = None
    try:
        room.wait_for("myna: in room 'demo' as 'myna'")
        talk = Command(TALK, tmp_path, "talk")
        assert talk.exit_code(timeout=90) == 0, talk.output()
        assert "turn 1:" in talk.output() and "perceived TTFA" in talk.output() and "wrote talk.wav" in talk.output()
        assert heard(whisper, tmp_path / "talk.wav", "Hello from a LiveKit room.") <= 0.3, talk.output()
        talk_left = time.monotonic()

        # The worker starts while the room's 20 s of departure run.
        worker = Command(WORKER, tmp_path, "worker")
        worker.wait_for("registered as agent 'myna'")
        (tmp_path / "talk.wav").unlink()
        dispatch = Command(DISPATCH, tmp_path, "dispatch")
        assert dispatch.exit_code(timeout=90) == 0, dispatch.output()
        assert "dispatched agent 'myna' to room 'demo-worker'" in dispatch.output()
        assert "Myna is 'agent-" in dispatch.output()  # the worker's Myna, not `myna room`'s
        assert heard(whisper, tmp_path / "talk.wav", "Hello from a dispatched worker.") <= 0.3, dispatch.output()
        worker.wait_for("room 'demo-worker' has no one left to speak to; leaving in 20 s", timeout=30)

        # `myna room`: one line when the room empties, then LiveKit closes it ~20 s after the leave.
        assert room.exit_code(timeout=max(1.0, talk_left + 45 - time.monotonic())) == 0, room.output()
        assert time.monotonic() - talk_left >= 15, room.output()
        said = room.output()
        assert said.count("room 'demo' has no one left to speak to; LiveKit closes it 20 s after") == 1, said
        assert "myna: left room 'demo' (ROOM_CLOSED)" in said
        assert worker.stop() == 0, worker.output()
        for command in (room, talk, worker, dispatch):
            out = command.output()
            assert out.count(NOTICE) == 1 and "InsecureKeyLengthWarning" not in out, out[-3000:]
            assert "Traceback" not in out, out[-3000:]
    finally:
        room.stop()
        if worker is not None:
            worker.stop()


def test_the_development_config_keeps_to_this_machine():
    """What `livekit-server --dev` does not: no public STUN server handed to clients, no query for
    a public address, signalling on loopback only, no ICE/TCP listener on every interface."""
    import yaml

    config = yaml.safe_load((ROOT / "scripts" / "livekit-dev.yaml").read_text())
    rtc = config["rtc"]
    assert config["bind_addresses"] == ["127.0.0.1"] and config["port"] == 7880
    assert rtc["use_external_ip"] is False and rtc["tcp_port"] == 0 and rtc["udp_port"] == 7882
    assert rtc["stun_servers"] and all(server.startswith("127.") for server in rtc["stun_servers"])
    assert config["keys"] == {"devkey": "secret"}


def test_myna_talk_when_myna_leaves_and_the_file_fails(dev_server, tmp_path):
    """No Myna in the room (a server that did answer the join): told so, exit 1. Myna killed after
    the first of two turns: the second fails at once with one line, the first's audio is written,
    exit 1; a WAV to /dev/full is one line and exit 1, no traceback. About 60 s: four `myna`
    processes start, and one waits out its --wait."""
    # (A room of its own: LiveKit closes 'demo' 20 s after this one leaves it, agents or not, and
    # on a busy machine the next talk came after that, to a new 'demo' with no Myna in it.)
    alone = Command(TALK.replace("--room demo", "--room nobody") + " --wait 2", tmp_path, "talk-alone")
    assert alone.exit_code(timeout=30) == 1, alone.output()
    assert "myna talk: no Myna ready in room 'nobody' after 2 s" in alone.output(), alone.output()
    assert "could not join" not in alone.output() and "Traceback" not in alone.output()
    room = Command(ROOM + " --phrase-cache-warm none", tmp_path, "room-leaves")
    try:
        room.wait_for("myna: in room 'demo' as 'myna'")
        full = Command(TALK + " -o /dev/full", tmp_path, "talk-devfull")
        assert full.exit_code(timeout=60) == 1, full.output()
        assert "myna talk: cannot write /dev/full" in full.output() and "Traceback" not in full.output()
        talk = Command(TALK + ' "A second turn that never comes." --token-rate 30', tmp_path, "talk-leaves")
        talk.wait_for("turn 1:", timeout=60)
        room.proc.kill()
        t0 = time.monotonic()
        assert talk.exit_code(timeout=40) == 1, talk.output()
        # A killed Myna is gone once the server's ping timeout notices (~20 s), not the turn's 60 s.
        assert time.monotonic() - t0 < 28, talk.output()
        out = talk.output()
        assert "myna talk: turn 2: Myna left the room" in out and "wrote talk.wav" in out, out
        assert "Traceback" not in out, out
        assert speech(tmp_path / "talk.wav").size > 48_000
    finally:
        room.stop()
