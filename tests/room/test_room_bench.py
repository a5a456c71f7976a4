"""``myna bench ttfa --transport livekit`` runs end to end (short) and reports both paths;
``myna bench capacity --transport livekit`` loads Myna through rooms (short)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.room.support import ARTIFACTS

pytestmark = pytest.mark.network


def test_the_livekit_bench_measures_both_paths_in_one_run(livekit_node):  # (the fixture: server installed)
    """About 80 s: turns and a barge-in through a room and direct, played at 1×, then a CPU window."""
    ARTIFACTS.mkdir(exist_ok=True)
    out = ARTIFACTS / "bench-ttfa-livekit.json"
    cmd = [sys.executable, "-m", "myna.cli", "--log-level", "warning", "bench", "ttfa", "--transport", "livekit",
           "--turns", "2", "--interrupts", "1", "--cpu-sessions", "2", "--cpu-window", "2", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (ARTIFACTS / "bench-ttfa-livekit.txt").write_text(proc.stdout + proc.stderr[-5000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for path in ("direct", "room"):
        ttfa = result["ttfa"][path]
        assert ttfa["perceived_ttfa_ms"]["n"] == 2 and ttfa["silent_turns"] == 0, ttfa
        assert ttfa["server_ttfa_ms"]["p50"] < ttfa["perceived_ttfa_ms"]["p50"]
        assert result["interrupt"][path]["lag_ms"]["n"] == 1
        cpu = result["cpu"][path]
        assert cpu["sessions"] == 2 and cpu["process_cpu_s"] > 0 and cpu["sessions_per_core"] > 0, cpu
    room = result["cpu"]["room"]  # the SDK's libwebrtc threads encode and send: part of the send path
    assert 0 < room["native_cpu_ms_per_session_s"] <= room["send_cpu_ms_per_session_s"], room
    assert result["interrupt"]["room"]["sender_tail_ms"]["n"] == 1
    assert "Room TTFA p50 − direct TTFA p50" in proc.stdout and "sessions per core" in proc.stdout


def test_the_capacity_bench_holds_conversations_through_livekit_rooms(livekit_node, tmp_path):
    """About 70 s: two conversations of three replies each, played at 1× through rooms."""
    out = tmp_path / "capacity.json"
    cmd = [sys.executable, "-m", "myna.cli", "--log-level", "warning", "bench", "capacity", "--transport", "livekit",
           "--levels", "2", "--replies", "3", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (system,) = json.loads(out.read_text())["systems"]
    (row,) = system["rows"]
    assert system["label"] == "myna-room" and row["sessions"] == 2, system
    assert row["replies"] >= 3 and row["lost"] == 0 and row["refused"] == 0, row
    assert 20.0 < row["ttfa_ms"]["p50"] < 2000.0 and row["server_ttfa_ms_p50"] < row["ttfa_ms"]["p50"], row
    assert row["worker_pct"] > 0.0 and row["speech_min"] > 0.0, row
    assert "capacity myna-room:" in proc.stdout
