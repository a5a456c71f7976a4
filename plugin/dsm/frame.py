"""One 80 ms DSM frame step for B slots (dsm_spec §2.4): the token cache that implements the
delays, the temporal step, the depformer chain, the audio mask, and the undelayed output frame.

A frame step is split in three plain functions so the caller can run the text state machine on
the host between them and so the next layer can batch, mask and graph them:

1. :func:`step_text` — inputs from the token cache → temporal transformer → text logits;
2. :func:`step_depformer` — the codebook chain for the muxed text token (skipped while every
   slot is in its first ``delay_steps`` steps: "text-only" steps);
3. :func:`step_commit` — audio mask, write the new tokens, advance, read the undelayed frame.

All per-slot positions are tensors in :class:`FrameState`; ``exec_mask`` freezes slots.
"""

from __future__ import annotations

import torch
from torch import nn

from .lm import DSMLM, TemporalState
from .sampling import sample_token


class FrameState(nn.Module):
    """State of the frame loop for B slots, created once per batch and updated in place:

    - ``tokens`` int64 [B, 1 + n_q, max_delay + 2]: ring of the last generated tokens (−2 = none);
    - ``offset`` int64 [B]: the step index t of each slot;
    - ``temporal``: the :class:`TemporalState` (KV caches, conditions);
    - ``dep_cache``: the depformer's per-frame KV cache, reused every frame.
    """

    def __init__(self, lm: DSMLM, batch_size: int, cross_len: int = 0):
        super().__init__()
        cfg = lm.cfg
        dev = lm.device
        self.batch_size = batch_size
        self.ring = cfg.max_delay + 2
        self.register_buffer("tokens", torch.full((batch_size, cfg.n_q + 1, self.ring), -2, dtype=torch.long,
                                                  device=dev), persistent=False)
        self.register_buffer("offset", torch.zeros(batch_size, dtype=torch.long, device=dev), persistent=False)
        self.register_buffer("initial", torch.tensor([cfg.text_card] + [cfg.card] * cfg.n_q, device=dev),
                             persistent=False)
        self.register_buffer("delays", torch.tensor(cfg.delays, device=dev), persistent=False)
        self.temporal: TemporalState = lm.new_state(batch_size, cross_len)
        self.register_buffer("dep_cache", lm.depformer.new_cache(batch_size, cfg.dep_q, dev, lm.dtype),
                             persistent=False)

    @property
    def exec_mask(self) -> torch.Tensor:
        return self.temporal.exec_mask

    def reset(self, mask: torch.Tensor) -> None:
        """Restart the slots where ``mask`` (bool [B]) is true."""
        self.tokens.masked_fill_(mask[:, None, None], -2)
        self.offset.masked_fill_(mask, 0)
        self.temporal.reset(mask)


def frame_inputs(fs: FrameState) -> torch.Tensor:
    """Inputs of step t (§2.4 step 1): the initial token while t ≤ delay_k (and for frozen slots),
    else the token written at step t − 1. Returns int64 [B, 1 + n_q]."""
    pos = (fs.offset % fs.ring)[:, None, None].expand(-1, fs.tokens.shape[1], 1)
    prev = fs.tokens.gather(2, pos)[:, :, 0]
    is_init = (fs.offset[:, None] <= fs.delays[None, :]) | ~fs.exec_mask[:, None]
    return torch.where(is_init, fs.initial[None, :], prev)


def step_text(lm: DSMLM, fs: FrameState) -> tuple[torch.Tensor, torch.Tensor]:
    """Temporal part of a step: returns (h [B, 1, dim], text logits fp32 [B, V])."""
    return lm.forward_text(fs.temporal, frame_inputs(fs))


def step_depformer(lm: DSMLM, fs: FrameState, text: torch.Tensor, h: torch.Tensor, *,
                   temperature: float = 0.6, top_k: int = 250, greedy: bool = False,
                   generator: torch.Generator | None = None, n_q: int | None = None) -> torch.Tensor:
    """The codebook chain (§2.4 step 5): codebook k reads the sample of k − 1 (the muxed text
    token for k = 0). text int64 [B], h [B, 1, dim] → audio tokens int64 [B, n_q_model].

    With ``n_q`` below the model's, only the first n_q codebooks are generated and the others are
    −1 (§2.6 "reduced n_q": they still read the initial token for t ≤ delay, then −1)."""
    n_q = lm.cfg.dep_q if n_q is None else n_q
    prev = text
    out = []
    for k in range(n_q):
        logits = lm.depformer_logits(k, prev, h, fs.dep_cache)
        prev = sample_token(logits, temperature, top_k, greedy, generator)
        out.append(prev)
    audio = torch.stack(out, dim=1)
    if n_q < lm.cfg.dep_q:
        rest = torch.full((text.shape[0], lm.cfg.dep_q - n_q), -1, dtype=torch.long, device=text.device)
        audio = torch.cat([audio, rest], dim=1)
    return audio


def step_commit(lm: DSMLM, fs: FrameState, text: torch.Tensor, audio: torch.Tensor | None,
                delay_steps: int) -> torch.Tensor:
    """Finish step t (§2.4 steps 6–8): mask codebook q to −1 while t < delay_steps + delay_q, write
    text int64 [B] and audio int64 [B, n_q] (None: all −1) at t + 1, advance frozen-aware, and
    return the undelayed frame τ = t + 1 − max_delay, int64 [B, 1 + n_q] (valid once t ≥ max_delay)."""
    cfg = lm.cfg
    B = text.shape[0]
    if audio is None:
        audio = torch.full((B, cfg.n_q), -1, dtype=torch.long, device=text.device)
    masked = fs.offset[:, None] < (delay_steps + fs.delays[None, 1:])
    audio = torch.where(masked, torch.full_like(audio, -1), audio)
    run = fs.exec_mask
    fs.offset.copy_(torch.where(run, fs.offset + 1, fs.offset))
    new = torch.cat([text[:, None], audio], dim=1)
    idx = (fs.offset % fs.ring)[:, None, None].expand(-1, new.shape[1], 1)
    old = fs.tokens.gather(2, idx)[:, :, 0]
    fs.tokens.scatter_(2, idx, torch.where(run[:, None], new, old)[:, :, None])
    read = ((fs.offset[:, None] - cfg.max_delay + fs.delays[None, :]) % fs.ring)[:, :, None]
    return fs.tokens.gather(2, read)[:, :, 0]
