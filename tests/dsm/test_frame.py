"""The batched step functions (myna.dsm.frame): per-slot freezing (exec_mask) and reset give the
same tokens as running each slot alone; synthesize() returns the documented result."""

from __future__ import annotations

import numpy as np
import torch

from myna.dsm.frame import FrameState, step_commit, step_depformer, step_text
from myna.dsm.sampling import sample_token

TEXTS = ["Hello world.", "Jack and Jill went up."]


def _run(tts, texts, voice, steps, frozen=None, reset_at=None):
    """Greedy lockstep loop over the step functions. frozen: {slot: set(steps)} during which the
    slot's exec_mask is false; reset_at: {step: slot} restarts that slot (and its text) at that step.
    Returns per-slot lists of the frames each slot produced while running."""
    lm, cfg = tts.lm, tts.cfg
    B = len(texts)
    cond_sum, cross = tts.conditions(voice)
    fs = FrameState(lm, B, cross.shape[1])
    lm.set_conditions(fs.temporal, slice(None), cond_sum.expand(B, -1, -1), cross.expand(B, -1, -1))
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
        h, logits = step_text(lm, fs)
        sampled = sample_token(logits, greedy=True).tolist()
        fed = [tts.machine.process(local[b], states[b], sampled[b]) if run[b] else 3 for b in range(B)]
        text = torch.tensor(fed)
        audio = step_depformer(lm, fs, text, h, greedy=True)
        frame = step_commit(lm, fs, text, audio, cfg.delay_steps)
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
