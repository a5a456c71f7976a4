"""PCM conversions every output shares: an engine's samples in, s16 out."""

from __future__ import annotations

import numpy as np


def as_mono_float32(pcm: object, sample_rate: object) -> np.ndarray:
    """An engine's PCM as float32 mono ``[n]`` in [-1, 1]: the only shape a turn output takes.

    Multi-channel audio (``[n, c]`` or ``[c, n]`` with ``c`` ≤ 8) is averaged to mono; integer
    PCM is scaled from its full scale; NaN and ±inf become 0 and values are clipped to [-1, 1].

    Raises:
        ValueError: not an array of numbers, more than two dimensions, or a sample rate
            outside 1-384000 Hz.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer)) or not 0 < sample_rate <= 384_000:
        raise ValueError(f"bad sample rate {sample_rate!r}")
    x = np.asarray(pcm)
    if x.dtype.kind not in "fiu":
        raise ValueError(f"samples of type {x.dtype} are not audio")
    if x.ndim not in (1, 2):
        raise ValueError(f"audio of shape {x.shape} (expected [n] or [n, channels])")
    if x.dtype.kind == "u":  # offset binary: the midpoint is silence
        x = (x.astype(np.float64) - (np.iinfo(x.dtype).max + 1) / 2) / ((np.iinfo(x.dtype).max + 1) / 2)
    elif x.dtype.kind == "i":
        x = x / float(np.iinfo(x.dtype).max + 1)
    if x.ndim == 2:
        x = x.mean(axis=1 if x.shape[1] <= 8 and x.shape[1] <= x.shape[0] else 0)
    x = np.nan_to_num(x.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0, copy=False)
    return np.clip(x, -1.0, 1.0, out=x)


def to_s16(x: np.ndarray, scratch: bool = False) -> np.ndarray:
    """float32 samples in [-1, 1] ``[n]`` as int16 ``[n]`` (full scale 32767, clipped).

    Args:
        scratch: ``x`` may be overwritten (saves a copy on the 20 ms frame path).
    """
    y = x if scratch else x.astype(np.float32, copy=True)
    np.multiply(y, 32767.0, out=y)
    np.minimum(y, 32767.0, out=y)  # (np.clip costs more than the rest of a frame)
    np.maximum(y, -32767.0, out=y)
    return y.astype(np.int16)
