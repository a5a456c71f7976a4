"""``myna bench fallback`` end to end on the embedded voice (one trial, no Whisper): every case
runs, the switches have the right reasons, no word is heard twice or lost, and the table and
JSON carry the targets."""

from __future__ import annotations

import json

import pytest

from myna.cli import main


@pytest.mark.slow
def test_bench_fallback_runs_every_case_and_reports_the_targets(tmp_path, capsys):
    out = tmp_path / "fallback.json"
    assert main(["bench", "fallback", "--trials", "1", "--no-wer", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert list(cases) == ["alone", "fails at once", "never starts", "fails mid-turn", "stalls mid-turn"]
    assert cases["alone"]["switches"] == [] and cases["fails at once"]["switches"] == ["error@0"]
    assert cases["never starts"]["switches"] == ["late@0"]
    assert all(len(c["ttfa_ms"]) == 1 and c["word_errors"] == 0 for c in cases.values())
    for name in ("fails mid-turn", "stalls mid-turn"):  # (late@0 when the busy host delays the primary)
        assert len(cases[name]["switches"]) == 1
    # the late deadline is a floor: first audio cannot come before it
    assert cases["never starts"]["ttfa_ms"][0] >= result["fallback_after_ms"]
    assert [t["target"].split(":")[0] for t in result["targets"]] == [
        "fails at once", "never starts", "fails mid-turn", "stalls mid-turn"]
    assert "injected fault" in table and "fails at once: first audio" in table
