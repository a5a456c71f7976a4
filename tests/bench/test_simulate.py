"""The virtual-clock simulation: the paced track keeps its grid; a sleeping writer drifts."""

from __future__ import annotations

import pytest

from myna.audio.preroll import FixedPreRoll
from myna.bench.simulate import fast_steady, simulate_paced, simulate_sleep_writer, timer_overshoot


def test_two_minutes_of_audio_paced_do_not_drift_while_a_sleeping_writer_does():
    late = timer_overshoot(mean_s=0.0, stall_p=1.0, stall_s=0.0005)  # every wake-up 0.5 ms late
    paced = simulate_paced(fast_steady, FixedPreRoll(0.0), turns=1, turn_s=(120.0, 120.0), overshoot=late)
    writer = simulate_sleep_writer(fast_steady, turns=1, turn_s=(120.0, 120.0), overshoot=late)
    assert paced.underruns == [0] and paced.audio_s == pytest.approx(120.0, abs=0.1)
    assert abs(paced.drift_ms) <= 0.5 + 1e-6  # one wake-up's lateness, whatever the length
    assert writer.drift_ms == pytest.approx(0.5 * (1500 - 1) - 60.0, abs=1.0)  # 0.5 ms per chunk, minus the last chunk's burst
