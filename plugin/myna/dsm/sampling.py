"""Token sampling (dsm-inference §2.4 step 4, §2.6): temperature, top-k and the exponential-race
sampler, or greedy argmax.

The race takes argmax(p / q) over the (top-k) probabilities p with q ~ Exp(1) i.i.d., which
samples from p without renormalising and without a host synchronisation. The draws q are an
input (``noise``), so the caller decides where and from which generator they come: a step can
then be captured as a CUDA graph, and the frame loop draws each session's noise from the
session's own generator on the host. Drawn in the reference's order and shapes (text [B, k],
then one [B, k] per codebook), a seeded CPU run matches it token for token.
"""

from __future__ import annotations

import torch


def noise_width(top_k: int, vocab: int) -> int:
    """How many Exp(1) draws one row of :func:`sample_token` takes: min(top_k, vocab), or vocab
    when ``top_k ≤ 0`` (no top-k)."""
    return min(top_k, vocab) if top_k > 0 else vocab


def exponential_noise(*shape: int, generator: torch.Generator | None = None,
                      device: torch.device | str | None = None) -> torch.Tensor:
    """Exp(1) draws, fp32, of ``shape`` (the generator's device by default)."""
    if device is None and generator is not None:
        device = generator.device
    return torch.empty(shape, device=device).exponential_(1, generator=generator)


def sample_token(logits: torch.Tensor, temperature: float, top_k: int, noise: torch.Tensor | None) -> torch.Tensor:
    """Sample one token per row. logits: float [B, V] (cast to fp32) → int64 [B].

    ``noise`` None (greedy) takes argmax of the logits. Otherwise noise is fp32 [B, k] of Exp(1)
    draws, k = :func:`noise_width` (top_k, V): probs = softmax(logits / temperature); with
    ``top_k > 0`` the k largest are kept, sorted (not renormalised), as the reference does even
    when k = V; the token is argmax(probs / noise) over them.
    """
    logits = logits.float()
    if noise is None:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_k > 0:
        probs, indices = torch.topk(probs, noise.shape[-1], dim=-1)
        choice = (probs / noise).argmax(dim=-1)
        return indices.gather(-1, choice[:, None])[:, 0]
    return (probs / noise).argmax(dim=-1)
