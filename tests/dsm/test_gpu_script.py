"""scripts/gpu_dsm.py, the prepared GPU check, runs end to end on CPU with the tiny preset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_dsm.py"


def test_cpu_smoke_run():
    pytest.importorskip("moshi")
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_TORCH_COMPILE="1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--config", "tiny", "--device", "cpu", "--dtype", "fp32", "--batch", "1,2",
         "--iters", "1", "--rounds", "1", "--steps", "6", "--loop-sessions", "1"],
        capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert "parity_error" not in report
    parity = report["parity"]
    for key in ("teacher_forced_audio_logits", "teacher_forced_text_logits", "mimi_whole", "mimi_streaming"):
        assert parity[key]["max_abs"] <= 1e-5, key
    assert parity["greedy_frames"]["identical_frames"] == parity["greedy_frames"]["frames"] == 4
    assert [row["batch"] for row in report["timing_ms"]] == [1, 2]
    assert all(row["ratio"]["full_step"] > 0 for row in report["timing_ms"])
    assert "error" not in report["loop"] and "ours" in report["loop"]["table"]
