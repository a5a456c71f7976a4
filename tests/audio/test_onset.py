"""Onset detection against known signals."""

import numpy as np
import pytest

from myna.audio.onset import first_audible_sample


@pytest.mark.parametrize("rate,offset,amp", [(48_000, 12_345, 0.5), (48_000, 777, 0.03), (24_000, 5_000, 0.2)])
def test_silence_then_tone_is_found_within_1_ms(rate, offset, amp):
    x = np.zeros(rate, np.float32)
    t = np.arange(rate - offset) / rate
    x[offset:] = amp * np.sin(2 * np.pi * 440 * t + 0.3)
    found = first_audible_sample(x, rate)
    assert found is not None and abs(found - offset) <= rate // 1000


def test_noise_under_the_threshold_and_dc_are_not_audible():
    rng = np.random.default_rng(0)
    assert first_audible_sample(rng.normal(0, 0.005, 48_000), 48_000) is None
    assert first_audible_sample(0.4 + rng.normal(0, 0.005, 48_000), 48_000) is None
    assert first_audible_sample(np.zeros(100), 48_000) is None


def test_int16_input_is_scaled_to_full_scale():
    x = np.zeros(4800, np.int16)
    x[2400:] = 3000
    x[2400::2] = -3000
    assert abs(first_audible_sample(x, 48_000) - 2400) <= 48
