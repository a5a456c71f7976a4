"""``myna bench ttfa``, the headless latency race: its table, JSON and plot, and a real race at
concurrency 1 and 4 over WebRTC on loopback (the embedded voice's three streaming strategies).

The race needs a loopback-only network namespace (DESIGN.md §5)::

    unshare -n sh -c 'ip link set lo up; . .venv/bin/activate; python -m pytest tests/bench -q'
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from myna.bench import add_parsers
from myna.bench import ttfa

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
STRATEGIES = ["piper", "piper-sentence", "piper-whole"]


def _row(engine: str, sessions: int, p50: float, rtf: float | None = 0.2) -> dict:
    return {"engine": engine, "sessions": sessions, "turns": sessions,
            "perceived_ttfa_ms": ttfa._stats([p50] if sessions == 1 else [p50 - 10, p50, p50 + 10]),
            "server_ttfa_ms": ttfa._stats([p50 - 40]), "rtf": rtf, "silent_turns": 0, "errors": 0, "underruns": 0,
            "audio_ms_p50": 4000.0, "wall_s": 5.0}


def _result() -> dict:
    return {"benchmark": "ttfa", "engines": ["a", "b"], "concurrency": [1, 4], "turns_per_session": 1, "text": "Hi there.",
            "words": 2, "token_rate": 30.0, "text_stream_ms": 33.3, "cpus": 2, "race_wall_s": 10.0,
            "rows": [_row("a", 1, 200), _row("b", 1, 900), _row("a", 4, 400, None),
                     {**_row("b", 4, 0), "perceived_ttfa_ms": {"n": 0}, "silent_turns": 4}],
            "whole_reply": {"synthesis_ms": ttfa._stats([500, 520]), "ttfa_ms_p50": 543.3}}


def test_parser_defaults_and_aliases():
    parser = argparse.ArgumentParser(prog="myna bench")
    add_parsers(parser.add_subparsers(dest="benchmark", required=True))
    args = parser.parse_args(["ttfa"])
    assert args.engines == "piper,piper-sentence,piper-whole"
    assert args.concurrency == "1,4" and args.turns == 2 and args.token_rate == 30.0
    assert parser.parse_args(["ttfa", "--engine", "piper"]).engines == "piper"  # the old flag still works


def test_stats_shape():
    s = ttfa._stats([100.0, 200.0, 300.0, 400.0, 500.0])
    assert s == {"n": 5, "p50": 300.0, "p25": 200.0, "p75": 400.0, "iqr": 200.0, "p95": 480.0}
    assert ttfa._stats([]) == {"n": 0}


def test_table_is_a_serving_table():
    text = ttfa.format_table(_result())
    lines = text.splitlines()
    header = lines[1]
    for column in ("engine", "sessions", "TTFA p50", "IQR", "p95", "server p50", "RTF", "n"):
        assert column in header
    assert lines[2].split()[:4] == ["a", "1", "200", "ms"]
    assert "0.200" in lines[2]
    assert "—" in lines[4]  # no RTF without the worker's counters
    assert "RTF —: not measured" in text  # and the table says why
    assert "no audio" in lines[5]
    assert "non-streaming pipeline's TTFA ≈ 543 ms" in text
    assert "perceived TTFA / non-streaming TTFA = 0.37" in text


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "ttfa.png"
    ttfa.plot(_result(), str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _loopback_only() -> bool:
    import ifaddr

    return all((ip.ip if isinstance(ip.ip, str) else ip.ip[0]) in ("127.0.0.1", "::1")
               for adapter in ifaddr.get_adapters() for ip in adapter.ips)


@pytest.mark.network
def test_headless_race_at_concurrency_1_and_4(tmp_path):
    """The CI race: the embedded voice's strategies at 1 and 4 sessions, one turn each."""
    if not _loopback_only():
        pytest.fail("the headless race must run in a loopback-only namespace (unshare -n, see the module docstring)")
    ARTIFACTS.mkdir(exist_ok=True)
    out, png = ARTIFACTS / "bench-ttfa.json", ARTIFACTS / "bench-ttfa.png"
    plot = ["--plot", str(png)] if _has_matplotlib() else []
    cmd = [sys.executable, "-m", "myna.cli", "--log-level", "warning", "bench", "ttfa", "--engines", ",".join(STRATEGIES),
           "--concurrency", "1,4", "--turns", "1", "--baseline-repeats", "2", "--json", str(out), *plot]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (ARTIFACTS / "bench-ttfa.txt").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["engine"], r["sessions"]) for r in result["rows"]] == [(e, n) for n in (1, 4) for e in STRATEGIES]
    for row in result["rows"]:
        p, s = row["perceived_ttfa_ms"], row["server_ttfa_ms"]
        assert row["errors"] == 0 and row["silent_turns"] == 0, row
        assert p["n"] == row["sessions"] == s["n"], row
        assert 0 < s["p50"] <= p["p50"] < 60_000, row  # perceived includes the server's part
        assert row["rtf"] is not None and 0 < row["rtf"] < 10, row
        assert row["audio_ms_p50"] > 2000  # the default sentence is ~4 s of speech
    assert result["whole_reply"]["synthesis_ms"]["n"] == 2
    assert "TTFA p50" in proc.stdout and "RTF" in proc.stdout
    if plot:
        assert png.read_bytes()[:4] == b"\x89PNG"


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
