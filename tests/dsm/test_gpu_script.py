"""scripts/gpu_dsm.py, the prepared GPU check, runs end to end on CPU with the tiny preset, from a
checkout (Myna not installed: as on a GPU machine that got a copy of the tree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_layout import WITHOUT_INSTALL

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_dsm.py"


@pytest.mark.slow
def test_cpu_smoke_run():
    pytest.importorskip("moshi")
    env = dict(os.environ, OMP_NUM_THREADS="1", NO_TORCH_COMPILE="1")
    argv = ["gpu_dsm.py", "--config", "tiny", "--device", "cpu", "--dtype", "fp32", "--batch", "1,2",
            "--iters", "1", "--rounds", "1", "--steps", "6", "--loop-sessions", "1"]
    code = WITHOUT_INSTALL + f"import runpy; sys.argv = {argv!r}; runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=240, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    sections = report["sections"]
    assert list(sections) == ["build", "parity", "timing", "loop"]  # "graphs" only on CUDA
    for name, entry in sections.items():
        assert "error" not in entry, (name, entry["error"])
        assert entry["wall_s"] >= 0 and entry["peak_host_gib"] > 0 and isinstance(entry["tf32"], bool)
    assert (sections["parity"]["tf32"], sections["timing"]["tf32"]) == (False, True)
    parity = sections["parity"]
    for key in ("teacher_forced_audio_logits", "teacher_forced_text_logits", "mimi_whole", "mimi_streaming"):
        assert parity[key]["max_abs"] <= 1e-5, key
    assert parity["greedy_frames"]["identical_frames"] == parity["greedy_frames"]["frames"] == 4
    assert [row["batch"] for row in sections["timing"]["rows_ms"]] == [1, 2]
    assert all(row["ratio"]["full_step"] > 0 for row in sections["timing"]["rows_ms"])
    loop = sections["loop"]
    assert "ours" in loop["table"] and [row["sessions"] for row in loop["results"]] == [1]
    assert loop["results"][0]["ours"]["first_audio_steps"] == 21 and loop["results"][0]["ref"]["steps_per_s"] > 0
