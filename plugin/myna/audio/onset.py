"""Audible onset detection (the Coval/Gradium convention).

Audible means: the first 10 ms window, moved in 1 ms hops, whose mean-removed RMS exceeds
0.01 of full scale. That window locates the onset only to within 10 ms (a loud sound starting
at sample k already makes the window beginning ~9 ms before k audible), so the onset sample is
the first one inside that window that differs from the quiet baseline (the mean of the window
one hop earlier, or of the window itself when it is the first) by more than the threshold. The
page's detector (``web/onset.js``) follows the same rule, so both read the same audio alike.
"""

from __future__ import annotations

import numpy as np

WINDOW_MS = 10.0
HOP_MS = 1.0
THRESHOLD = 0.01


def first_audible_sample(pcm: np.ndarray, sample_rate: int, threshold: float = THRESHOLD) -> int | None:
    """Index of the first sample of the first audible 10 ms window, or None if there is none.

    Args:
        pcm: mono samples, shape ``[n]``; float in [-1, 1] or int16 (scaled by 1/32768).
        sample_rate: Hz.
        threshold: RMS threshold as a fraction of full scale.
    """
    x = np.asarray(pcm)
    x = x.astype(np.float64) / 32768.0 if x.dtype == np.int16 else x.astype(np.float64)
    win = int(round(sample_rate * WINDOW_MS / 1000))
    hop = max(1, int(round(sample_rate * HOP_MS / 1000)))
    if len(x) < win:
        return None
    # Windowed mean and mean square from cumulative sums: var = E[x²] − E[x]² is the
    # mean-removed power of each window.
    c1 = np.concatenate(([0.0], np.cumsum(x)))
    c2 = np.concatenate(([0.0], np.cumsum(x * x)))
    starts = np.arange(0, len(x) - win + 1, hop)
    mean = (c1[starts + win] - c1[starts]) / win
    power = (c2[starts + win] - c2[starts]) / win - mean * mean
    loud = np.nonzero(power > threshold * threshold)[0]
    if not len(loud):
        return None
    k = int(loud[0])
    start = int(starts[k])
    baseline = mean[k - 1] if k > 0 else mean[k]
    deviating = np.nonzero(np.abs(x[start : start + win] - baseline) > threshold)[0]
    return start + int(deviating[0]) if len(deviating) else start
