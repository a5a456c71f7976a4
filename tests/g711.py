"""G.711 decoders written from the ITU-T recommendation's tables, independent of FFmpeg: the
tests decode the worker's µ-law and A-law with these (checked against ``audioop`` where Python
still has it, ≤ 3.12)."""

from __future__ import annotations

import numpy as np


def ulaw_to_s16(data: bytes) -> np.ndarray:
    """ITU-T G.711 µ-law → int16, by the textbook formula (not FFmpeg's code)."""
    u = ~np.frombuffer(data, dtype=np.uint8)
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    magnitude = (((mantissa.astype(np.int32) << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype(np.int16)


def alaw_to_s16(data: bytes) -> np.ndarray:
    """ITU-T G.711 A-law → int16, by the textbook formula (not FFmpeg's code)."""
    a = np.frombuffer(data, dtype=np.uint8) ^ 0x55
    exponent, mantissa = ((a >> 4) & 7).astype(np.int32), (a & 0x0F).astype(np.int32)
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)
