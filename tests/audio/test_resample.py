"""One turn's resampling (myna.audio.resample): streaming state, the filter's tail, the rate check."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from myna.audio.resample import TurnResampler


def sweep(n: int, rate: int) -> np.ndarray:
    t = np.arange(n) / rate
    return (0.5 * np.sin(2 * np.pi * (200 + 2000 * t) * t)).astype(np.float32)


def test_chunks_at_the_output_rate_pass_through_untouched():
    r = TurnResampler(48_000)
    pcm = sweep(960, 48_000)
    assert r.resample(pcm, 48_000) is pcm
    assert len(r.flush()) == 0


@pytest.mark.parametrize("in_rate, out_rate", [(22_050, 48_000), (24_000, 16_000)])
def test_a_turn_split_anywhere_equals_the_turn_resampled_whole(in_rate, out_rate):
    pcm = sweep(in_rate, in_rate)  # one second
    whole = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ").resample_chunk(pcm, last=True)
    r = TurnResampler(out_rate)
    cuts = [0, 1, 300, 301, 5000, 12_345, in_rate]
    pieces = [r.resample(pcm[a:b], in_rate) for a, b in zip(cuts, cuts[1:])] + [r.flush()]
    out = np.concatenate(pieces)
    assert len(out) == len(whole) == out_rate  # the tail comes out at the end, nothing is lost
    np.testing.assert_allclose(out, whole, atol=1e-5)


@pytest.mark.parametrize("first", [48_000, 22_050])
def test_a_rate_change_within_a_turn_is_an_error(first):
    r = TurnResampler(48_000)
    r.resample(np.zeros(100, np.float32), first)
    with pytest.raises(ValueError, match="sample rate changed within a turn"):
        r.resample(np.zeros(100, np.float32), 24_000)


class _Sink:
    def put_audio(self, turn_id: str, pcm: bytes) -> None:
        pass

    def drop_audio(self) -> None:
        pass


def _playout():
    from myna.audio.playout import Playout

    return Playout(lambda event: None)


def _unpaced():
    from myna.audio.unpaced import UnpacedOutput

    return UnpacedOutput(lambda event: None, _Sink(), 48_000)


@pytest.mark.parametrize("make", [_playout, _unpaced], ids=["playout", "unpaced"])
def test_every_output_refuses_a_rate_change_within_a_turn_also_from_its_own_rate(make):
    out = make()
    out.begin_turn("t", 0.0)
    out.push_audio("t", np.zeros(480, np.float32), 48_000)  # at the output's rate: passed through
    with pytest.raises(ValueError, match="48000 -> 24000 Hz"):
        out.push_audio("t", np.zeros(240, np.float32), 24_000)
