"""``myna bench ttfa --client chromium``: TTFA as a listener hears it, in real Chromium.

Debian's Chromium (``/usr/bin/chromium``) driven by Python Playwright, as the browser tests do;
the run needs a loopback-only network namespace::

    unshare -n sh -c 'ip link set lo up; . .venv/bin/activate; python -m pytest tests/bench/test_ttfa_chromium.py -q'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import loopback_only
from myna.bench import add_parsers, ttfa
from myna.bench.chromium import CHROMIUM

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
TURNS = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="myna bench")
    add_parsers(parser.add_subparsers(dest="benchmark", required=True))
    return parser


def test_the_client_flag_defaults_to_aiortc_and_refuses_the_room_path():
    parser = _parser()
    assert ttfa.Plan.from_args(parser.parse_args(["ttfa"])).client == "aiortc"
    assert ttfa.Plan.from_args(parser.parse_args(["ttfa", "--client", "chromium"])).client == "chromium"
    with pytest.raises(SystemExit):
        parser.parse_args(["ttfa", "--client", "firefox"])
    with pytest.raises(SystemExit, match="livekit"):
        ttfa.run(parser.parse_args(["ttfa", "--client", "chromium", "--transport", "livekit"]))


def test_render_cells_summarise_the_chromium_turns_and_show_beside_arrival():
    heard = [ttfa.Heard("Hi.", 150.0, 70.0, None, None, None, None, 0),
             ttfa.Heard("Hi.", 130.0, 90.0, None, None, None, None, 0),
             ttfa.Heard("Hi.", None, 80.0, None, None, None, None, 1)]
    cell = ttfa.summarise_render(heard)
    assert cell["render_ttfa_ms"]["n"] == 2 and cell["render_ttfa_ms"]["p50"] == 140.0
    assert cell["server_ttfa_ms"]["n"] == 3 and cell["silent_turns"] == 1 and cell["errors"] == 1
    assert cell["render_minus_server_ms_min"] == 40.0
    row = {"system": "piper", "sessions": 1, "token_rate": 0.0, "peer": False, "arrival_ttfa_ms": ttfa._stats([95.0]),
           "perceived_ttfa_ms": ttfa._stats([160.0]), "server_ttfa_ms": ttfa._stats([70.0]), "rtf": 0.2,
           "silent_turns": 0, "errors": 0, "underruns": 0, "pre_roll_ms_max": 1.0, "gap_ms_p95": 0.0,
           "gap_ms_total": 0.0, "chromium": cell}
    table = ttfa.format_table({"words": 2, "turns_per_session": 3, "cpus": 2, "load": 0, "concurrency": [1],
                               "systems": ["piper"], "token_rates": [0.0], "rows": [row]})
    line = next(x for x in table.splitlines() if x.startswith("piper") and "140 ms" in x)
    assert line.split()[3:11] == ["140", "ms", "149", "80", "95", "2", "1", "1"], line  # render, p95, server, arrival


@pytest.mark.network
@pytest.mark.browser
def test_chromium_hears_every_turn_after_the_server_sent_it():
    """A short real run: Myna's clause lane (and, where Pipecat is installed, the Pipecat peer's two
    lanes) each measured in Chromium: every turn rendered audibly, none silent, and no render
    before the server's own first audio. About 2 min: Chromium, a worker and the Pipecat peer
    start, and every turn plays out at 1×."""
    if not os.path.exists(CHROMIUM) or importlib.util.find_spec("playwright") is None:
        pytest.skip(f"needs {CHROMIUM} and Python Playwright")
    if not loopback_only():
        pytest.fail("the Chromium bench must run in a loopback-only namespace (unshare -n, see the module docstring)")
    ARTIFACTS.mkdir(exist_ok=True)
    out = ARTIFACTS / "bench-ttfa-chromium.json"
    peer = ["--peer", "pipecat"] if importlib.util.find_spec("pipecat") else []
    cmd = [sys.executable, "-m", "myna.cli", "--log-level", "warning", "bench", "ttfa", "--engines", "piper",
           "--concurrency", "1", "--turns", str(TURNS), "--token-rate", "0", "--baseline-repeats", "0",
           "--client", "chromium", *peer, "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (ARTIFACTS / "bench-ttfa-chromium.txt").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["client"] == "chromium" and result["chromium_page_errors"] == []
    systems = ["piper", *(["pipecat-sentence", "pipecat-token"] if peer else [])]
    assert [r["system"] for r in result["rows"]] == systems
    for row in result["rows"]:
        c = row["chromium"]
        render, server = c["render_ttfa_ms"], c["server_ttfa_ms"]
        assert c["turns"] == TURNS and c["errors"] == 0 and c["silent_turns"] == 0, row
        assert render["n"] == TURNS, row
        if not row["peer"] or server["n"]:
            # Pipecat's sentence lane, on a loaded host, may end its TTS context "with no audio"
            # and play the audio after it: no first_audio for that turn (its aiortc row shows
            # the same). Myna always reports one.
            assert row["peer"] or server["n"] == TURNS, row
            # Per turn: the first audible sample is rendered after the server sent its first audio.
            assert c["render_minus_server_ms_min"] >= 0, row
            assert 0 < server["p50"] <= render["p50"] < 60_000, row
        assert row["arrival_ttfa_ms"]["n"] == TURNS  # the aiortc client's figure of the same cell, beside it
    assert "In Chromium" in proc.stdout and "render p50" in proc.stdout
