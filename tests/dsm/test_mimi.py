"""The Mimi decoder (myna.dsm.mimi): one frame gives 1920 samples, frame-by-frame equals
whole-sequence decoding, and both match the reference (moshi 0.2.13) to 1e-5 (dsm-inference §4, §8.4)."""

from __future__ import annotations

import pytest
import torch

ATOL = 1e-5


@pytest.fixture(scope="module")
def mimi(ours):
    return ours.mimi


@pytest.fixture(scope="module")
def ref_mimi(tiny_dir, ref_info):
    return ref_info(tiny_dir).get_mimi()


def _codes(mimi, B: int, K: int, T: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, mimi.cfg.bins, (B, K, T), generator=gen)


@torch.no_grad()
def test_one_frame_is_1920_samples(mimi):
    state = mimi.new_state(3)
    for _ in range(2):
        pcm = mimi.decode(_codes(mimi, 3, 6, 1), state)
        assert pcm.shape == (3, 1, 1920) and pcm.dtype == torch.float32
    assert mimi.decode(_codes(mimi, 1, 6, 4)).shape == (1, 1, 4 * 1920)


@torch.no_grad()
def test_streaming_equals_whole_sequence(mimi):
    """Within the transformer context (here 50 steps at 25 Hz = 25 frames)."""
    codes = _codes(mimi, 2, 6, 24)
    whole = mimi.decode(codes)
    state = mimi.new_state(2)
    frames = torch.cat([mimi.decode(codes[:, :, i:i + 1], state) for i in range(24)], dim=-1)
    assert (frames - whole).abs().max().item() <= ATOL
    state = mimi.new_state(2)
    chunks = torch.cat([mimi.decode(codes[:, :, i:i + 3], state) for i in range(0, 24, 3)], dim=-1)
    assert (chunks - whole).abs().max().item() <= ATOL


@torch.no_grad()
def test_reset_restarts_a_stream(mimi):
    codes = _codes(mimi, 2, 6, 5, seed=3)
    state = mimi.new_state(2)
    for i in range(5):
        mimi.decode(codes[:, :, i:i + 1], state)
    state.reset(torch.tensor([True, False]))
    first = mimi.decode(codes[:, :, :1], state)
    fresh = mimi.decode(codes[:1, :, :1])
    assert (first[:1] - fresh).abs().max().item() <= ATOL


@torch.no_grad()
def test_matches_reference_whole_sequence(mimi, ref_mimi):
    pytest.importorskip("moshi")
    codes = _codes(mimi, 2, 6, 70, seed=1)
    assert (mimi.decode(codes) - ref_mimi.decode(codes)).abs().max().item() <= ATOL


@torch.no_grad()
def test_matches_reference_streaming(mimi, ref_mimi):
    """Frame by frame past the transformer context, where the ring cache wraps."""
    pytest.importorskip("moshi")
    codes = _codes(mimi, 2, 6, 70, seed=2)
    state = mimi.new_state(2)
    ours = torch.cat([mimi.decode(codes[:, :, i:i + 1], state) for i in range(70)], dim=-1)
    with ref_mimi.streaming(2):
        ref = torch.cat([ref_mimi.decode(codes[:, :, i:i + 1]) for i in range(70)], dim=-1)
    assert (ours - ref).abs().max().item() <= ATOL
