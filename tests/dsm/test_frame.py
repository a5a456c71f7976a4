"""The frame step (myna.dsm.frame): per-slot freezing (exec_mask) and reset give the same tokens
as running each slot alone; narrowed views share the state; synthesize() returns the documented
result."""

from __future__ import annotations

import numpy as np
import torch

from myna.dsm.frame import FrameState, FrameStep, Sampling

TEXTS = ["Hello world.", "Jack and Jill went up."]


def _run(tts, texts, voice, steps, frozen=None, reset_at=None):
    """Greedy lockstep loop over the step functions. frozen: {slot: set(steps)} during which the
    slot's exec_mask is false; reset_at: {step: slot} restarts that slot (and its text) at that step.
    Returns per-slot lists of the frames each slot produced while running."""
    lm, cfg = tts.lm, tts.cfg
    B = len(texts)
    cond_sum, cross = tts.conditions(voice)
    fs = FrameState.new(lm, B, cross.shape[1])
    lm.set_conditions(fs.temporal, slice(None), cond_sum.expand(B, -1, -1), cross.expand(B, -1, -1))
    frame_step = FrameStep(lm, fs, Sampling(greedy=True))
    states = [tts.machine.new_state(tts.script(t)) for t in texts]
    local = [0] * B
    out = [[] for _ in range(B)]
    for step in range(steps):
        if reset_at and step in reset_at:
            slot = reset_at[step]
            mask = torch.zeros(B, dtype=torch.bool)
            mask[slot] = True
            fs.reset(mask)
            states[slot] = tts.machine.new_state(tts.script(texts[slot]))
            local[slot] = 0
            out[slot] = []
        run = [not (frozen and step in frozen.get(b, ())) for b in range(B)]
        fs.exec_mask.copy_(torch.tensor(run))
        sampled = frame_step.text().tolist()
        fed = [tts.machine.process(local[b], states[b], sampled[b]) if run[b] else 3 for b in range(B)]
        frame_step.text_in.copy_(torch.tensor(fed))
        frame = frame_step.audio()
        for b in range(B):
            if run[b]:
                if local[b] >= cfg.max_delay:
                    out[b].append(frame[b].clone())
                local[b] += 1
    return out


def test_frozen_slot_resumes_as_if_alone(ours, voice_path):
    alone = [_run(ours, [t], voice_path, 40)[0] for t in TEXTS]
    both = _run(ours, TEXTS, voice_path, 44, frozen={1: {3, 4, 20, 21}})
    for b in range(2):
        n = min(len(alone[b]), len(both[b]))
        assert n >= 30
        assert torch.equal(torch.stack(alone[b][:n]), torch.stack(both[b][:n])), b


def test_reset_slot_restarts(ours, voice_path):
    alone = _run(ours, [TEXTS[0]], voice_path, 30)[0]
    both = _run(ours, TEXTS, voice_path, 42, reset_at={12: 0})
    n = min(len(alone), len(both[0]))
    assert n >= 25
    assert torch.equal(torch.stack(alone[:n]), torch.stack(both[0][:n]))


def test_a_narrowed_step_runs_on_the_shared_state(ours, voice_path):
    """A bucket's view (narrow) writes through to the full state; the other rows stay as they were."""
    lm = ours.lm
    cond_sum, cross = ours.conditions(voice_path)
    fs = FrameState.new(lm, 4, cross.shape[1])
    lm.set_conditions(fs.temporal, slice(None), cond_sum.expand(4, -1, -1), cross.expand(4, -1, -1))
    full = FrameStep(lm, fs, Sampling(greedy=True))
    tokens, k0 = fs.tokens.clone(), fs.temporal.caches[0].k.clone()
    view = full.narrow(2)
    assert view.fs.batch_size == 2 and view.text_in.data_ptr() == full.text_in.data_ptr()
    view.text()
    view.audio()
    assert fs.offset.tolist() == [1, 1, 0, 0] and fs.temporal.offset.tolist() == [1, 1, 0, 0]
    assert torch.equal(fs.tokens[2:], tokens[2:]) and not torch.equal(fs.tokens[:2], tokens[:2])
    assert torch.equal(fs.temporal.caches[0].k[2:], k0[2:]) and not torch.equal(fs.temporal.caches[0].k[:2], k0[:2])
    assert fs.temporal.ring.positions[:2, 0].tolist() == [0, 0] and (fs.temporal.ring.positions[2:] == -1).all()


def test_ring_cache_write_returns_what_it_stores(ours):
    from myna.dsm.layers import MASK_ALIGN, RingKVCache, RingPositions

    ring = RingPositions.empty(2, capacity=5, context=5)
    cache = RingKVCache.empty(ring, n_heads=1, head_dim=3)
    assert ring.positions.shape == (2, MASK_ALIGN)  # padded: the mask's last dimension is aligned
    for t in range(7):
        pos = torch.tensor([[t], [min(t, 3)]])  # slot 1 is frozen from step 3 on: its position stays
        mask = ring.advance(pos, torch.tensor([True, t < 3]))
        k, v, positions = cache.write(torch.full((2, 1, 1, 3), float(t)), torch.full((2, 1, 1, 3), -float(t)), pos)
    assert k is cache.k and v is cache.v and positions is ring.positions
    # slot 0 holds steps 2..6 at t % 5; slot 1 ran steps 0..2, then its frozen step is recorded empty
    assert positions[0, :5].tolist() == [5, 6, 2, 3, 4] and (positions[:, 5:] == -1).all()
    assert positions[1, :5].tolist() == [0, 1, 2, -1, -1]
    assert k[0, 0, :5, 0].tolist() == [5.0, 6.0, 2.0, 3.0, 4.0]
    assert mask.shape == (2, 1, 1, MASK_ALIGN) and mask[0, 0, 0].tolist()[:5] == [True] * 5
    cache.reset(torch.tensor([True, False]))
    assert (cache.k[0] == 0).all() and (cache.v[0] == 0).all() and (cache.k[1] != 0).any()


def test_synthesize_result(ours, voice_path):
    res = ours.synthesize("Hello world, again.", voice_path, greedy=True)
    assert res.sample_rate == 24000
    assert res.pcm.dtype == np.float32 and res.pcm.ndim == 1
    assert res.codes.dtype == torch.int64 and res.codes.shape[0] == ours.cfg.n_q
    assert res.pcm.shape[0] == res.codes.shape[1] * 1920
    assert [w for w, _ in res.words] == ["Hello", "world,", "again."]
    starts = [s for _, s in res.words]
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert np.abs(res.pcm).max() <= 1.0
    again = ours.synthesize("Hello world, again.", voice_path, greedy=True)
    assert np.array_equal(res.pcm, again.pcm)
    a = ours.synthesize("Hello world, again.", voice_path, seed=3)
    b = ours.synthesize("Hello world, again.", voice_path, seed=3)
    assert torch.equal(a.codes, b.codes)
