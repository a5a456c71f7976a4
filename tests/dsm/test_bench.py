"""``myna bench dsm-step`` (myna.bench.dsm_step) on the tiny preset: the parser, the table, the JSON."""

from __future__ import annotations

import argparse
import json

import pytest

from myna.bench import BENCHMARKS, add_parsers


def _parse(argv):
    parser = argparse.ArgumentParser(prog="myna bench")
    add_parsers(parser.add_subparsers(dest="cmd", required=True))
    return parser.parse_args(argv)


def test_registered_with_options():
    assert "dsm_step" in BENCHMARKS
    args = _parse(["dsm-step", "--config", "1.6b", "--batch", "1,8,32", "--device", "cpu", "--json", "x.json"])
    assert (args.config, args.batch, args.device, args.json_out) == ("1.6b", "1,8,32", "cpu", "x.json")
    assert callable(args.func)
    with pytest.raises(SystemExit):
        _parse(["dsm-step", "--config", "huge"])


def test_tiny_side_by_side(tmp_path, capsys):
    pytest.importorskip("moshi")
    out = tmp_path / "bench.json"
    args = _parse(["dsm-step", "--config", "tiny", "--batch", "1,2", "--json", str(out),
                   "--iters", "2", "--rounds", "1", "--device", "cpu"])
    assert args.func(args) == 0
    table = capsys.readouterr().out
    assert "ours/ref" in table and "full_step" in table
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["results"]] == [1, 2]
    for row in result["results"]:
        for kind in ("text_step", "full_step", "mimi_frame"):
            assert row["ours"][kind] > 0 and row["ref"][kind] > 0
            assert row["ratio"][kind] == pytest.approx(row["ours"][kind] / row["ref"][kind])


def test_ours_only_and_memory_skip(tmp_path, monkeypatch):
    from myna.bench import dsm_step

    out = tmp_path / "ours.json"
    args = _parse(["dsm-step", "--config", "tiny", "--batch", "1", "--no-ref", "--json", str(out),
                   "--iters", "2", "--rounds", "1", "--device", "cpu"])
    assert args.func(args) == 0
    assert json.loads(out.read_text())["results"][0]["ref"] == {}
    monkeypatch.setattr(dsm_step, "available_bytes", lambda device: 1 << 20)
    args = _parse(["dsm-step", "--config", "1.6b", "--no-ref", "--json", str(out), "--device", "cpu"])
    assert args.func(args) == 0
    assert "skipping config 1.6b" in json.loads(out.read_text())["skipped"]
