"""The command line: the start rule's budget flag of ``myna serve``."""

from __future__ import annotations

import argparse

import pytest

from myna.cli import _non_negative_ms, main


def test_max_hold_ms_takes_milliseconds_from_0_to_10_s():
    assert _non_negative_ms("100") == 100.0 and _non_negative_ms("0") == 0.0
    for bad in ("-1", "ten", "10001"):
        with pytest.raises(argparse.ArgumentTypeError):
            _non_negative_ms(bad)


def test_a_bad_budget_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["serve", "--max-hold-ms", "-5"])
    assert exit.value.code == 2 and "--max-hold-ms" in capsys.readouterr().err
