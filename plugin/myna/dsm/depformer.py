"""The depformer (depth transformer, dsm-inference §2.4 step 5, §7.5): a small transformer that runs
across the codebooks of one frame, codebook k using weight slot ``schedule[k]`` for its input
projection, attention and FFN, with a fresh per-frame KV cache and a per-codebook output head.

Parameter names follow the checkpoint (``depformer.layers.L.self_attn.in_projs.S`` …). The input
projections, embeddings and heads (``depformer_in``, ``depformer_emb``, ``depformer_text_emb``,
``linears``) live on :class:`myna.dsm.lm.DSMLM`, which owns the whole checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import Attention, GatedFFN, RMSNorm, attention


class DepformerLayer(nn.Module):
    """Pre-norm layer: shared RMSNorms, per-slot attention and gated FFN, no positional encoding."""

    def __init__(self, dim: int, n_heads: int, hidden: int, n_slots: int, eps: float):
        super().__init__()
        self.norm1 = RMSNorm(dim, eps)
        self.norm2 = RMSNorm(dim, eps)
        self.self_attn = Attention(dim, n_heads, n_slots)
        self.gating = nn.ModuleList([GatedFFN(dim, hidden) for _ in range(n_slots)])
        self._gating = tuple(self.gating)  # see Attention: the step calls forward() directly

    def step(self, x: torch.Tensor, k: int, slot: int, cache: torch.Tensor) -> torch.Tensor:
        """Codebook ``k`` of the frame: x [B, 1, dim]; cache [2, B, H, dep_q, Dh] is written at
        index k and read over 0..k (k is the unrolled loop index, static for a graph)."""
        attn = self.self_attn
        q, kk, v = attn.qkv(self.norm1.forward(x), slot)
        cache[0, :, :, k:k + 1] = kk
        cache[1, :, :, k:k + 1] = v
        a = attention(q, cache[0, :, :, :k + 1], cache[1, :, :, :k + 1], None)
        x = x + attn.project_out(a, slot)
        return x + self._gating[slot].forward(self.norm2.forward(x))

    def forward(self, x: torch.Tensor, schedule: list[int]) -> torch.Tensor:
        """All codebooks at once (teacher forcing): x [N, K, dim], causal over the K codebooks."""
        N, K, _ = x.shape
        h = self.norm1(x)
        parts = [self.self_attn.qkv(h[:, i:i + 1], schedule[i]) for i in range(K)]
        q, kk, v = (torch.cat([p[j] for p in parts], dim=2) for j in range(3))
        causal = torch.ones(K, K, dtype=torch.bool, device=x.device).tril()
        a = attention(q, kk, v, causal)
        x = x + torch.cat([self.self_attn.project_out(a[:, :, i:i + 1], schedule[i]) for i in range(K)], dim=1)
        h = self.norm2(x)
        return x + torch.cat([self.gating[schedule[i]](h[:, i:i + 1]) for i in range(K)], dim=1)


class Depformer(nn.Module):
    """The stack of depformer layers (``depformer.layers``)."""

    def __init__(self, dim: int, n_heads: int, n_layers: int, hidden: int, n_slots: int, eps: float):
        super().__init__()
        self.dim, self.n_heads = dim, n_heads
        self.layers = nn.ModuleList([DepformerLayer(dim, n_heads, hidden, n_slots, eps)
                                     for _ in range(n_layers)])
        self._layers = tuple(self.layers)

    def new_cache(self, batch_size: int, n_codebooks: int, device: torch.device | str,
                  dtype: torch.dtype) -> torch.Tensor:
        """A per-frame KV cache, [L, 2, B, H, n_codebooks, Dh]. Every entry a frame reads has been
        written earlier in the same frame, so one buffer can be reused frame after frame."""
        return torch.zeros(len(self.layers), 2, batch_size, self.n_heads, n_codebooks,
                           self.dim // self.n_heads, device=device, dtype=dtype)

    def step(self, x: torch.Tensor, k: int, slot: int, cache: torch.Tensor) -> torch.Tensor:
        """Codebook k: x [B, 1, dim] → [B, 1, dim]."""
        for i, layer in enumerate(self._layers):
            x = layer.step(x, k, slot, cache[i])
        return x

    def forward(self, x: torch.Tensor, schedule: list[int]) -> torch.Tensor:
        """Teacher-forced: x [N, K, dim] → [N, K, dim]."""
        for layer in self.layers:
            x = layer(x, schedule)
        return x
