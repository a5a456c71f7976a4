"""The WAV files the command line writes (``myna say``, ``myna talk``): checked before the work
that fills them, then written whole as s16 mono PCM."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np


def unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written (None: it can), found before synthesis rather than after
    it: a folder, a missing folder, no permission. Opens it for appending, which leaves an
    existing file as it is, and removes a file it created."""
    if path.is_dir():
        return "it is a folder"
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        return str(exc.strerror or exc)
    if not existed:
        path.unlink(missing_ok=True)
    return None


def write_wav(path: Path, pcm: np.ndarray, sample_rate: int) -> None:
    """Write ``pcm`` (s16 samples, mono, any integer dtype) at ``sample_rate`` Hz to ``path``.

    Raises:
        OSError: the file cannot be written (e.g. a full disk).
    """
    with open(path, "wb") as f, wave.open(f, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.astype("<i2").tobytes())
