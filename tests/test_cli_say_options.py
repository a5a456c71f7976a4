"""``myna say --voice NAME --speed X``: locally on engines built as ``myna serve``
builds them (``--piper-voice`` loads a second voice), and through a running worker.

The second voice is the bundled model under another name with its config's ``length_scale`` at
1.6 (a slower reader): which voice spoke shows in the length of the file."""

from __future__ import annotations

import sys
import wave

import pytest

from myna.cli import main

TEXT = "Your table for four is booked for Friday evening at seven."
SLOW = "en_GB-slow-medium"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def seconds(path) -> float:
    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()



def test_say_help_names_voice_and_speed(capsys):
    code, out, _ = run_cli(capsys, "say", "--help")
    text = " ".join(out.split())
    assert code == 0 and "--speed X" in text and "0.5 to 2.0" in text and "--voice" in text


@pytest.mark.parametrize("bad", ["3", "0.1", "fast", "nan"])
def test_say_refuses_a_speed_out_of_range_before_loading(capsys, tmp_path, bad):
    code, out, err = run_cli(capsys, "say", TEXT, "--speed", bad, "-o", str(tmp_path / "x.wav"))
    assert code == 2 and "--speed" in err and "0.5 to 2.0" in err and "Traceback" not in err
    assert not (tmp_path / "x.wav").exists()


@pytest.mark.slow
def test_say_locally_at_a_speed_and_in_a_second_voice(capsys, tmp_path, slow_voice):
    lengths = {}
    for name, extra in (("plain", []), ("fast", ["--speed", "1.5"]), ("slow", ["--voice", SLOW])):
        out_wav = tmp_path / f"{name}.wav"
        code, _, err = run_cli(capsys, "--log-level", "warning", "say", TEXT, "-o", str(out_wav), "--piper-seed", "0",
                               "--piper-voice", slow_voice, *extra)
        assert code == 0, err
        lengths[name] = seconds(out_wav)
    print(f"myna say: {lengths}")
    assert 0.6 < lengths["fast"] / lengths["plain"] < 0.75
    assert lengths["slow"] / lengths["plain"] > 1.2


def test_say_locally_in_a_voice_the_engine_lacks_fails_naming_it(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--log-level", "warning", "say", TEXT, "--voice", "no-such-voice",
                           "-o", str(tmp_path / "x.wav"))
    assert code != 0 and "no-such-voice" in err and "Traceback" not in err


@pytest.mark.network
@pytest.mark.serial  # the recording is played out at 1×: a starved worker's underruns lengthen it
def test_say_through_a_worker_at_a_speed(worker, tmp_path):
    import subprocess

    lengths = {}
    for name, extra in (("plain", []), ("fast", ["--speed", "1.5"])):
        out_wav = tmp_path / f"{name}.wav"
        proc = subprocess.run([sys.executable, "-m", "myna.cli", "--log-level", "warning", "say", "--server", worker.url,
                               TEXT, "-o", str(out_wav), "--token-rate", "0", *extra],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        lengths[name] = seconds(out_wav)
    print(f"myna say --server: {lengths}")
    assert 0.6 < lengths["fast"] / lengths["plain"] < 0.8  # (the recording ends 0.1 s after turn_done)
