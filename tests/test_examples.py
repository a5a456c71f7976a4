"""The examples as a newcomer runs them: one without its extra says in one line which
extra to install, instead of a ModuleNotFoundError traceback; ``--help`` works where it can."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("script, args, missing, extra", [
    ("pipecat_bot.py", [], ["pipecat"], "pipecat"),
    ("pipecat_bot.py", [], ["loguru"], "pipecat"),
    ("livekit_agent.py", ["wav"], ["livekit"], "livekit"),
    ("framework_ttfb.py", [], ["pipecat"], "pipecat"),
    ("framework_ttfb.py", [], ["livekit"], "livekit"),
])
def test_an_example_without_its_extra_names_the_extra(uninstalled, script, args, missing, extra):
    proc = run(script, *args, env=uninstalled(*missing))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"'{extra}' extra" in lines[0] and f"bash scripts/setup.sh {extra}" in lines[0], lines[0]


@pytest.mark.parametrize("script", ["client.py", "framework_ttfb.py"])
def test_examples_that_need_no_extra_for_help_show_it(uninstalled, script):
    proc = run(script, "--help", env=uninstalled("pipecat", "livekit", "loguru"))
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr


@pytest.mark.network
def test_the_client_example_fails_in_one_line_when_no_worker_listens(port_finder):
    proc = run("client.py", "--server", f"http://127.0.0.1:{port_finder()}", "Hello.")
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("client.py: cannot reach") and "Traceback" not in proc.stderr, proc.stderr
