"""One turn's audio at the rate its output needs: the one resampling path of every output.

Engines hand out chunks at their own rate (Piper 22050 Hz, DSM 24 kHz); each output wants one
rate (playout 48 kHz, the WebSocket the client's ``sample_rate``, a plug-in its framework's).
A :class:`TurnResampler` per turn keeps soxr's streaming filter state across the turn's chunks,
so chunk boundaries leave no clicks, and gives back the filter's tail when the turn ends.
"""

from __future__ import annotations

import numpy as np
import soxr

_EMPTY = np.zeros(0, dtype=np.float32)
_EMPTY.flags.writeable = False


class TurnResampler:
    """float32 mono chunks of one turn → ``out_rate`` Hz (soxr ``HQ``, streaming).

    The turn's rate is its first chunk's; chunks already at ``out_rate`` pass through
    unchanged (the same array, not a copy).

    Args:
        out_rate: the output's sample rate (Hz).
    """

    def __init__(self, out_rate: int):
        self.out_rate = out_rate
        self.in_rate: int | None = None  # the turn's rate, set by its first chunk (Hz)
        self._stream: soxr.ResampleStream | None = None

    def resample(self, pcm: np.ndarray, sample_rate: int) -> np.ndarray:
        """The chunk at ``out_rate``: float32 ``[m]``; ``m`` may be 0 while the filter fills.

        Args:
            pcm: float32 mono ``[n]`` in [-1, 1] (converted to float32 otherwise).
            sample_rate: the chunk's rate (Hz).

        Raises:
            ValueError: ``sample_rate`` differs from the turn's first chunk's.
        """
        if self.in_rate is None:
            self.in_rate = sample_rate
            if sample_rate != self.out_rate:
                self._stream = soxr.ResampleStream(sample_rate, self.out_rate, 1, dtype="float32", quality="HQ")
        elif sample_rate != self.in_rate:
            raise ValueError(f"sample rate changed within a turn: {self.in_rate} -> {sample_rate} Hz")
        x = np.asarray(pcm, dtype=np.float32)
        return x if self._stream is None else self._stream.resample_chunk(x)

    def flush(self) -> np.ndarray:
        """The end of the turn: what the filter still holds, at ``out_rate`` (float32 ``[m]``;
        empty, read-only, when nothing was resampled)."""
        if self._stream is None:
            return _EMPTY
        return self._stream.resample_chunk(_EMPTY, last=True)
