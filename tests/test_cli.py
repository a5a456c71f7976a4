"""The ``myna`` command line as a newcomer meets it: clear one-line errors, exit codes,
fail-fast ``--server``, ``--log-level`` on either side of the sub-command, ``--trim``.

Tests that start a worker or a stand-in HTTP server use loopback only (``scripts/test.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest
from aiohttp import web

from myna.audio.onset import first_audible_sample
from myna.cli import main
from myna.engines.build import milliseconds
from myna.rtc.client import wait_until_ready



def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``myna ARGV`` in-process: (exit status, stdout, stderr); argparse exits count too."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- say: bad input is refused before anything is loaded or sent --------------------------
@pytest.mark.parametrize("text", ["", "   ", "...", " !? — ", "**"])
@pytest.mark.parametrize("server", [None, "http://127.0.0.1:1"])
def test_say_refuses_text_with_nothing_to_speak(capsys, tmp_path, text, server):
    out_wav = tmp_path / "out.wav"
    argv = ["say", text, "-o", str(out_wav)] + (["--server", server] if server else [])
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert "nothing to speak" in one_line(err)
    assert not out_wav.exists() and out == ""


@pytest.mark.parametrize("url", ["127.0.0.1:18080", "localhost:18080", "ftp://127.0.0.1:8080", "http://", "http://127.0.0.1:99999"])
def test_say_rejects_a_server_url_it_cannot_use_at_once(capsys, tmp_path, url):
    t0 = time.monotonic()
    code, _, err = run_cli(capsys, "say", "Hi.", "--server", url, "-o", str(tmp_path / "x.wav"))
    assert code == 2
    line = one_line(err)
    assert url in line and ("http://127.0.0.1:8080" in line or "65535" in line), line
    assert time.monotonic() - t0 < 30  # not the 60 s readiness wait


@pytest.mark.parametrize("output", ["{tmp}/no-such-folder/x.wav", "{tmp}/a-file/x.wav", "{tmp}", "/proc/x.wav"])
def test_say_fails_before_synthesis_when_the_file_cannot_be_written(capsys, tmp_path, output):
    (tmp_path / "a-file").write_text("")
    code, out, err = run_cli(capsys, "say", "Hello there.", "-o", output.format(tmp=tmp_path))
    assert code == 2
    assert one_line(err).startswith("myna say: cannot write ")
    assert "loading" not in out  # refused before the voice loaded


def test_say_leaves_an_existing_file_alone_when_it_refuses(capsys, tmp_path):
    target = tmp_path / "keep.wav"
    target.write_bytes(b"precious")
    code, _, _ = run_cli(capsys, "say", "...", "-o", str(target))
    assert code == 2 and target.read_bytes() == b"precious"


# -- say --server: fail fast unless the worker is still loading -----------------------------
class StandIn:
    """An HTTP server on loopback in its own thread whose ``/healthz`` answers ``statuses`` in
    turn (the last one repeats); every other path is a 404. ``hits`` counts every request."""

    def __init__(self, statuses: list[int], port: int, healthz_path: str = "/healthz"):
        self.statuses = list(statuses)
        self.hits = 0
        self.port = port
        self.url = f"http://127.0.0.1:{self.port}"
        self._path = healthz_path
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._started.wait(10)

    @web.middleware
    async def _count(self, request: web.Request, handler):
        self.hits += 1
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        status = self.statuses[min(self.hits - 1, len(self.statuses) - 1)]
        return web.json_response({"status": "ready" if status == 200 else "starting"}, status=status)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application(middlewares=[self._count])
        app.router.add_get(self._path, self._healthz)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def stand_in(port_finder):
    servers: list[StandIn] = []

    def make(statuses: list[int]) -> StandIn:
        servers.append(StandIn(statuses, port_finder()))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


@pytest.mark.network
def test_say_fails_at_once_when_nothing_listens(capsys, tmp_path, port_finder):
    t0 = time.monotonic()
    code, _, err = run_cli(capsys, "say", "Hi.", "--server", f"http://127.0.0.1:{port_finder()}", "-o", str(tmp_path / "x.wav"))
    assert code == 1
    assert "connection refused" in one_line(err)
    assert time.monotonic() - t0 < 30


@pytest.mark.network
@pytest.mark.parametrize("status, path", [(404, "/wrong/path"), (500, ""), (401, "")])
def test_say_fails_at_once_on_a_server_that_is_not_a_worker(capsys, tmp_path, stand_in, status, path):
    server = stand_in([status])
    code, _, err = run_cli(capsys, "say", "Hi.", "--server", server.url + path, "-o", str(tmp_path / "x.wav"))
    assert code == 1
    line = one_line(err)
    assert f"HTTP {status}" in line and "not a Myna worker" in line, line
    assert server.hits == 1  # asked once, not polled for a minute


@pytest.mark.network
async def test_a_loading_worker_is_waited_for(stand_in):
    server = stand_in([503, 503, 503, 200])
    await wait_until_ready(server.url, timeout=30, starting=False)
    assert server.hits == 4


@pytest.mark.network
async def test_a_worker_that_never_finishes_loading_times_out_saying_so(stand_in):
    server = stand_in([503])
    with pytest.raises(TimeoutError, match="still loading"):
        await wait_until_ready(server.url, timeout=1.0, starting=False)
    assert server.hits >= 2


@pytest.mark.network
async def test_a_worker_being_started_may_refuse_at_first(port_finder):
    """``starting=True`` (a benchmark's own worker, just launched) waits through refused connections."""
    port = port_finder()
    waiting = asyncio.ensure_future(wait_until_ready(f"http://127.0.0.1:{port}", timeout=30))
    await asyncio.sleep(0.6)
    assert not waiting.done()
    server = StandIn([200], port)  # now something listens on the port the waiter asks
    try:
        await asyncio.wait_for(waiting, 30)
        assert server.hits == 1
    finally:
        server.close()


# -- serve ---------------------------------------------------------------------------------
@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_serve_rejects_a_bad_port_in_one_line(capsys, port):
    code, _, err = run_cli(capsys, "serve", "--port", port)
    assert code == 2
    assert "argument --port: a TCP port is a number from 1 to 65535" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.network
def test_serve_on_a_port_in_use_says_so():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "myna.cli", "serve", "--port", str(port), "--engine", "piper"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("where", ["before", "after"])
def test_log_level_is_taken_before_and_after_the_sub_command(tmp_path, where):
    """The Piper voice logs an INFO line as it loads: --log-level warning hides it either way."""
    args = ["say", "Hi.", "-o", str(tmp_path / "hi.wav")]
    flag = ["--log-level", "warning"]
    argv = flag + args if where == "before" else args + flag
    quiet = subprocess.run([sys.executable, "-m", "myna.cli", *argv], capture_output=True, text=True, timeout=120)
    loud = subprocess.run([sys.executable, "-m", "myna.cli", *args, "--log-level", "info"],
                          capture_output=True, text=True, timeout=120)
    assert quiet.returncode == loud.returncode == 0, quiet.stderr + loud.stderr
    assert "voice en_US-joe-medium loaded" in loud.stderr
    assert "loaded" not in quiet.stderr and "INFO" not in quiet.stderr


def test_log_level_after_a_benchmark_name_is_accepted(capsys):
    code, out, err = run_cli(capsys, "bench", "ttfa", "--log-level", "warning", "--help")
    assert code == 0 and "--log-level" in out


def test_bench_ttfa_help_reads_plainly(capsys):
    code, out, _ = run_cli(capsys, "bench", "ttfa", "--help")
    assert code == 0 and "``" not in out
    assert "myna bench ttfa: the headless latency race" in out
    assert "RTF then shows as —" in " ".join(out.split())  # the table's "—" is explained


# -- missing extras ------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["serve", "--engine", "piper,dsm", "--dsm-checkpoint", "x"], ["say", "Hi.", "--engine", "dsm"]])
def test_the_dsm_engine_without_its_extra_is_one_line_with_the_install_command(capsys, monkeypatch, tmp_path, argv):
    monkeypatch.setitem(sys.modules, "torch", None)  # as in an install without the dsm extra
    code, out, err = run_cli(capsys, *argv, *(["-o", str(tmp_path / "x.wav")] if argv[0] == "say" else []))
    assert code == 1
    line = one_line(err)
    assert "'dsm' extra" in line and "bash scripts/setup.sh dsm" in line and "myna[dsm]" in line, line
    assert "loading" not in out


# -- the main job without PyTorch, and say --server against it ------------------------------
DSM_MODULES = ("torch", "safetensors", "sentencepiece")


@pytest.fixture(scope="session")
def no_dsm_extra(uninstalled) -> dict[str, str]:
    """Environment of a process without the dsm extra (PyTorch and co. not importable)."""
    return {**os.environ, **uninstalled(*DSM_MODULES)}


@pytest.fixture(scope="module")
def light_worker(start_worker, uninstalled):
    """``myna serve`` as the light install runs it: default engines, PyTorch not importable."""
    w = start_worker(env=uninstalled(*DSM_MODULES))
    yield w
    w.stop()


@pytest.mark.slow
@pytest.mark.network
def test_the_main_job_serves_without_pytorch(light_worker):
    import json
    import urllib.request

    with urllib.request.urlopen(f"{light_worker.url}/healthz", timeout=10) as r:
        assert json.load(r)["engines"] == ["piper", "piper-sentence", "piper-whole"]
    with urllib.request.urlopen(f"{light_worker.url}/", timeout=10) as r:
        assert b"Myna" in r.read()
    assert "torch" not in light_worker.log_path.read_text()


@pytest.mark.network
def test_serve_dsm_without_the_extra_fails_before_listening(port_finder, no_dsm_extra):
    port = port_finder()
    proc = subprocess.run([sys.executable, "-m", "myna.cli", "serve", "--port", str(port), "--engine", "dsm",
                           "--dsm-checkpoint", "kyutai/tts-1.6b-en_fr"],
                          capture_output=True, text=True, timeout=120, env=no_dsm_extra)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "bash scripts/setup.sh dsm" in one_line(proc.stderr)


def _read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        assert w.getframerate() == 48_000
        return np.frombuffer(w.readframes(w.getnframes()), "<i2")


@pytest.mark.slow
@pytest.mark.network
def test_say_server_trims_the_ttfa_silence_unless_asked_not_to(light_worker, tmp_path, no_dsm_extra):
    def say(*extra: str) -> tuple[subprocess.CompletedProcess, np.ndarray]:
        out_wav = tmp_path / f"say{len(extra)}.wav"
        proc = subprocess.run([sys.executable, "-m", "myna.cli", "--log-level", "warning", "say", "--server", light_worker.url,
                               "Thanks for calling, your order ships today.", "-o", str(out_wav), *extra],
                              capture_output=True, text=True, timeout=120, env=no_dsm_extra)
        assert proc.returncode == 0, proc.stderr
        return proc, _read_wav(out_wav)

    _, trimmed = say()
    proc, raw = say("--no-trim")
    onset_trimmed = first_audible_sample(trimmed, 48_000)
    onset_raw = first_audible_sample(raw, 48_000)
    assert onset_trimmed is not None and onset_trimmed <= 480 + 48  # within the 10 ms margin (1 ms detector slack)
    assert onset_raw is not None and onset_raw > 2 * 480  # the wait for the first audio is in the measured file
    assert "silence before the first sound left out" not in proc.stdout


# -- serve: the start rule's budget --------------------------------------------------------
def test_max_hold_ms_takes_milliseconds_from_0_to_10_s():
    assert milliseconds("100") == 100.0 and milliseconds("0") == 0.0
    for bad in ("-1", "ten", "10001"):
        with pytest.raises(argparse.ArgumentTypeError):
            milliseconds(bad)


def test_a_bad_budget_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--max-hold-ms", "-5"])
    assert exit.value.code == 2 and "--max-hold-ms" in capsys.readouterr().err


@pytest.mark.parametrize("mb", ["-1", "nan", "inf", "0.0000001"])
def test_a_bad_phrase_cache_size_is_a_usage_error(capsys, mb):
    """(A size under one byte was taken, then failed at start-up with a traceback.)"""
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--phrase-cache-mb", mb])
    assert exit.value.code == 2 and "--phrase-cache-mb" in capsys.readouterr().err


def test_an_unreadable_warm_up_list_fails_in_one_line_before_loading(capsys, tmp_path):
    code, out, err = run_cli(capsys, "serve", "--phrase-cache-warm", str(tmp_path / "missing.txt"))
    assert code == 1 and "loading" not in out
    assert "cannot read --phrase-cache-warm" in one_line(err)


def test_the_phrase_cache_flags_build_the_workers_cache(tmp_path):
    from myna.engines.build import EngineOptions, build_engines

    def cache_of(*argv: str):
        engines = build_engines(EngineOptions.from_args(_parse_serve("--engine", "piper", *argv)))
        return engines.phrase_cache, engines.warm_phrases

    phrases = tmp_path / "openings.txt"
    phrases.write_text("# ours\nHello there.\n\nOne moment.\n", "utf-8")
    cache, warm = cache_of("--phrase-cache-mb", "2", "--phrase-cache-warm", str(phrases))
    assert cache.max_bytes == 2_000_000 and warm == ["Hello there.", "One moment."]
    cache, warm = cache_of()
    assert cache.max_bytes == 64_000_000 and "Sure." in warm  # the package's list by default
    assert cache_of("--phrase-cache-warm", "none")[1] == []
    assert cache_of("--phrase-cache-mb", "0") == (None, [])


def _parse_serve(*argv: str):
    import argparse

    from myna.cli import _add_serve

    parser = argparse.ArgumentParser()
    _add_serve(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


# -- one way to build engines: every command takes the same flags --------------------------
ENGINE_FLAGS = ("--engine", "--voice", "--dsm-checkpoint", "--n-q", "--guidance", "--fallback", "--fallback-after-ms",
                "--fallback-stall-ms", "--phrase-cache-mb", "--phrase-cache-warm")
SESSION_FLAGS = ("--max-turn-chars", "--max-queued-turns", "--message-rate", "--message-burst", "--max-hold-ms",
                 "--drain-timeout")


@pytest.mark.parametrize("command", ["serve", "say", "room", "worker"])
def test_every_command_takes_the_engine_flags_of_serve(capsys, command):
    code, out, _ = run_cli(capsys, command, "--help")
    assert code == 0
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out))
    assert set(ENGINE_FLAGS) <= flags, set(ENGINE_FLAGS) - flags
    if command != "say":  # (one local turn: no limits, nothing to drain)
        assert set(SESSION_FLAGS) <= flags, set(SESSION_FLAGS) - flags


@pytest.mark.parametrize("command", ["room", "worker"])
def test_the_room_commands_build_dsm_and_refuse_it_without_a_checkpoint_as_serve_does(capsys, monkeypatch, command):
    monkeypatch.setenv("LIVEKIT_API_KEY", "a-key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "a-secret-long-enough-for-hs256-0123456789")
    args = ["--url", "ws://127.0.0.1:9"] + (["--room", "r"] if command == "room" else [])
    code, _, err = run_cli(capsys, command, *args, "--engine", "dsm,piper", "--fallback", "piper")
    assert code == 1 and one_line(err) == f"myna {command}: the dsm engine needs --dsm-checkpoint PATH_OR_REPO"


@pytest.mark.parametrize("voice, message", [
    ("mine.safetensors", "a voice file is the dsm engine's, and --engine does not load it"),
    ("nobody", "piper has no voice 'nobody'"),
])
def test_a_voice_no_loaded_engine_takes_is_one_line(capsys, tmp_path, voice, message):
    code, out, err = run_cli(capsys, "say", "Hi.", "--voice", voice, "-o", str(tmp_path / "x.wav"))
    assert code == 1 and message in one_line(err) and "loading" not in out


@pytest.mark.parametrize("seed", ["-1", "x"])
def test_a_piper_seed_that_is_no_seed_is_refused_by_the_parser_naming_the_flag(seed, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--piper-seed", seed])
    assert exited.value.code == 2 and "--piper-seed" in capsys.readouterr().err
