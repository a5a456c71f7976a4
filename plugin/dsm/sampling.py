"""Token sampling (dsm_spec §2.4 step 4, §2.6): temperature, top-k and the exponential-race
sampler, or greedy argmax.

The race draws q ~ Exp(1) with the shape of the (top-k) probabilities and takes argmax(p / q),
which samples from p without renormalising and without a host synchronisation. Draws happen in
the same order and shapes as the reference, so a seeded CPU run matches it token for token.
"""

from __future__ import annotations

import torch


def sample_token(logits: torch.Tensor, temperature: float = 0.6, top_k: int = 0, greedy: bool = False,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Sample one token per row. logits: float [B, V] (cast to fp32) → int64 [B].

    ``greedy`` (or temperature ≤ 0) takes argmax of the logits and draws nothing. Otherwise
    probs = softmax(logits / temperature); with ``top_k > 0`` only the k largest are kept (not
    renormalised); one Exp(1) draw per kept entry, [B, k].
    """
    logits = logits.float()
    if greedy or temperature <= 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k > 0:
        k = min(top_k, probs.shape[-1])
        probs, indices = torch.topk(probs, k, dim=-1)
        choice = exponential_race(probs, generator)
        return indices.gather(-1, choice[:, None])[:, 0]
    return exponential_race(probs, generator)


def exponential_race(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """argmax(p / q) with q ~ Exp(1) i.i.d.: a sample from p (unnormalised is fine). [B, V] → int64 [B]."""
    q = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / q).argmax(dim=-1)
