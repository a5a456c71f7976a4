"""A wheel that stands alone: built from this checkout, installed into a new venv, run from outside.

What happens, in order (about 40 s on a warm machine):

1. The tracked and untracked-but-not-ignored files of the checkout (what a clean clone holds, plus
   work in progress; no ``.venv``, no ``*.egg-info``) are copied to a temporary folder, and
   ``python -m build --no-isolation`` makes the sdist there and then the wheel *from the sdist*,
   so a file the sdist forgets is missing from the wheel too. ``--no-isolation`` builds with the
   test venv's setuptools and ``build`` (the ``dev`` extra): an isolated build would fetch
   setuptools from the index, which the test namespace cannot reach.
2. A new venv is created in a temporary folder outside the checkout, and the wheel is installed
   into it with ``pip install --no-index --find-links WHEELHOUSE myna-*.whl``. The wheelhouse holds
   wheels of pyproject's core dependencies at the versions ``.venv`` has, collected by
   ``scripts/wheelhouse.sh`` (run by ``scripts/setup.sh dev`` while the network is up; by default
   in ``~/.cache/myna/wheelhouse``, ``$MYNA_WHEELHOUSE`` elsewhere). pip resolves the wheel's own
   requirements from those wheels alone: Myna's files come from the wheel, its dependencies are
   installed as a user's pip would install them, and a dependency the wheel fails to declare is
   missing in the new venv (``.venv``'s packages are not visible there: no
   ``--system-site-packages``, no ``.pth``). Why not the index: ``scripts/test.sh`` runs the suite
   in a network namespace with only ``lo``, where pip reaches no index.
3. From a working folder outside the checkout (nothing can be imported from ``plugin/``), with
   ``PYTHONPATH`` cleared: ``myna --version`` prints pyproject's version; ``myna say`` writes
   speech with the embedded voice; ``myna serve`` starts on a free loopback port and one turn
   is spoken through ``POST /v1/audio/speech`` (a WAV with audible audio comes back).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest

from inprocess import loopback_only
from myna.bench.processes import free_port, terminate

pytestmark = [pytest.mark.e2e, pytest.mark.network, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def wheelhouse() -> Path:
    """Where ``scripts/wheelhouse.sh`` collects the dependencies' wheels."""
    if os.environ.get("MYNA_WHEELHOUSE"):
        return Path(os.environ["MYNA_WHEELHOUSE"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "myna" / "wheelhouse"


def clean_env() -> dict[str, str]:
    """The environment of the installed commands: nothing pointing back into the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    return {**env, "PYTHONUNBUFFERED": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def run(argv: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def copy_checkout(dest: Path) -> None:
    """The files a clean clone would hold, with the working tree's changes (git decides)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():  # (a tracked file deleted in the working tree is listed too)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def audible(pcm: np.ndarray) -> bool:
    return pcm.size > 0 and float(np.abs(pcm.astype(np.float32)).max()) > 1000


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16), w.getframerate()


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A new venv with the wheel built from this checkout installed; returns its bin folder."""
    if not loopback_only():
        pytest.fail("network tests must run in a loopback-only namespace: use `bash scripts/test.sh`")
    house = wheelhouse()
    if not any(house.glob("*.whl")):
        pytest.fail(f"no wheelhouse at {house}: run `bash scripts/wheelhouse.sh` (scripts/setup.sh dev does) "
                    "while the network is up")
    pytest.importorskip("build", reason="the dev extra's `build` is missing: run `bash scripts/setup.sh dev`")
    root = tmp_path_factory.mktemp("wheel")
    src, dist, venv = root / "src", root / "dist", root / "venv"
    copy_checkout(src)
    t0 = time.monotonic()
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src], cwd=root)
    wheels, sdists = list(dist.glob("myna-*.whl")), list(dist.glob("myna-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    assert wheels[0].name == f"myna-{VERSION}-py3-none-any.whl"
    t_build = time.monotonic()
    run([sys.executable, "-m", "venv", venv], cwd=root)
    pip = [venv / "bin" / "python", "-m", "pip"]
    run([*pip, "install", "--no-index", "--find-links", house, wheels[0]], cwd=root)
    run([*pip, "check"], cwd=root)  # every requirement of every installed package is met
    print(f"\nbuilt sdist + wheel in {t_build - t0:.1f} s; venv + install from {house} in "
          f"{time.monotonic() - t_build:.1f} s")
    return venv / "bin"


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A working folder outside the checkout."""
    folder = tmp_path_factory.mktemp("elsewhere")
    assert REPO not in folder.parents
    return folder


def test_the_package_comes_from_the_wheel_and_knows_its_version(installed, outside):
    where = run([installed / "python", "-c", "import json, myna, myna.server, myna.web; "
                 "print(json.dumps([myna.__file__, myna.server.__file__, myna.web.__file__]))"], cwd=outside)
    site = installed.parent / "lib"
    for path in json.loads(where.stdout):
        assert Path(path).is_relative_to(site), path
    assert run([installed / "myna", "--version"], cwd=outside).stdout.strip() == f"myna {VERSION}"
    # The web page and the phrase list are package data: they must have come with the wheel.
    data = run([installed / "python", "-c", "import importlib.resources as r; "
                "print(r.files('myna.web').joinpath('index.html').is_file(), "
                "any(p.name.endswith('.txt') for p in r.files('myna.engines').iterdir()))"], cwd=outside)
    assert data.stdout.split() == ["True", "True"]


def test_myna_say_speaks_with_the_embedded_voice(installed, outside):
    out = outside / "hello.wav"
    run([installed / "myna", "say", "Hello from a wheel installed on its own.", "-o", out], cwd=outside, timeout=120)
    pcm, rate = read_wav(out.read_bytes())
    assert rate == 22050 and len(pcm) / rate > 1.0 and audible(pcm)


def test_myna_serve_speaks_a_turn_over_http(installed, outside):
    port = free_port()
    log_path = outside / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(installed / "myna"), "serve", "--port", str(port), "--engine", "piper",
                                 "--max-sessions", "4", "--phrase-cache-warm", "none"],
                                cwd=outside, env=clean_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "myna: ready" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        assert f"myna {VERSION}: loading" in log_path.read_text()
        body = json.dumps({"model": "piper", "voice": "alloy", "input": "One turn, spoken by an installed worker.",
                           "response_format": "wav"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/audio/speech", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200 and answer.headers["Content-Type"].startswith("audio/wav")
            data = answer.read()
        pcm, rate = read_wav(data)
        assert len(pcm) / rate > 1.0 and audible(pcm), (len(pcm), rate)
    finally:
        terminate(proc, 30)
    assert proc.returncode == 0, log_path.read_text(errors="replace")[-3000:]
