"""Building blocks shared by the temporal transformer, the depformer and Mimi's transformer:
fp32 RMSNorm, interleaved RoPE, the gated SiLU feed-forward, masked attention, and the
preallocated ring KV cache (dsm_spec §2.4, §4, §5, §7.1–7.4).

Nothing here branches on Python ints that change from step to step: positions live in tensors,
so a step is capturable as a CUDA graph.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (``rms_norm_f32``, §7.1): ``x·α·rsqrt(mean(x²) + eps)``, no centring.

    ``alpha`` has shape [1, 1, dim] (the checkpoint layout). Input [B, T, dim] of any float dtype;
    the output has the input's dtype.
    """

    def __init__(self, dim: int, eps: float = 1e-8):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(1, 1, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        var = self.eps + torch.mean(xf * xf, dim=-1, keepdim=True)
        return (xf * (self.alpha.float() * torch.rsqrt(var))).to(x.dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               max_period: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved rotary embedding (§7.2): rotates pairs (x[2i], x[2i+1]) by pos·max_period^(−2i/D).

    q, k: [B, H, T, D]; positions: absolute positions, int64 [B, T]. Computed in fp32, returned
    in the input dtype.
    """
    D = q.shape[-1]
    ds = torch.arange(D // 2, device=q.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / D))
    ts = positions.float()[:, None, :, None]  # [B, 1, T, 1]
    rotr = torch.cos(freqs * ts)
    roti = torch.sin(freqs * ts)

    def rot(x: torch.Tensor) -> torch.Tensor:
        xs = x.view(*x.shape[:-1], D // 2, 2)
        xr, xi = xs[..., 0].float(), xs[..., 1].float()
        out_r = xr * rotr - xi * roti
        out_i = xr * roti + xi * rotr
        return torch.stack([out_r.to(x.dtype), out_i.to(x.dtype)], dim=-1).view(x.shape)

    return rot(q), rot(k)


class GatedFFN(nn.Module):
    """Gated SiLU feed-forward (§7.4): ``linear_out(silu(a) * b)`` with ``[a; b] = linear_in(x)``.

    ``linear_in``: [2·hidden, dim], ``linear_out``: [dim, hidden], no biases.
    """

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.linear_in = nn.Linear(dim, 2 * hidden, bias=False)
        self.linear_out = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear_in(x)
        h = h.view(*h.shape[:-1], 2, -1)
        return self.linear_out(F.silu(h[..., 0, :]) * h[..., 1, :])


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, H·D] → [B, H, T, D]."""
    B, T, _ = x.shape
    return x.view(B, T, n_heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] → [B, T, H·D]."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def positional_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, context: int | None) -> torch.Tensor:
    """Causal (and windowed) attention mask, bool [B, 1, T, S]: key valid when
    ``k_pos ≥ 0`` and ``0 ≤ q_pos − k_pos < context`` (§5). q_pos: [B, T], k_pos: [B, S]."""
    delta = q_pos[:, :, None] - k_pos[:, None, :]
    mask = (k_pos[:, None, :] >= 0) & (delta >= 0)
    if context is not None:
        mask = mask & (delta < context)
    return mask[:, None]


class RingKVCache(nn.Module):
    """Preallocated ring KV cache (§5): buffers ``k``, ``v`` [B, H, capacity, D] and the absolute
    position held by every entry, ``positions`` int64 [B, capacity] (−1 = empty).

    :meth:`write` scatters T new entries at ``position % capacity`` in place; positions come as a
    tensor, so the write is graph-capturable. Entries of frozen slots (``exec_mask`` false) are
    written with position −1 so they are never attended to, and their next real step overwrites them.
    """

    def __init__(self, batch_size: int, n_heads: int, capacity: int, head_dim: int,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.capacity = capacity
        shape = (batch_size, n_heads, capacity, head_dim)
        self.register_buffer("k", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("v", torch.zeros(shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("positions", torch.full((batch_size, capacity), -1, device=device,
                                                     dtype=torch.long), persistent=False)

    def write(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
              exec_mask: torch.Tensor | None = None) -> None:
        """Store k, v [B, H, T, D] at absolute positions pos [B, T] (T ≤ capacity)."""
        B, H, T, D = k.shape
        idx = pos % self.capacity
        idx4 = idx[:, None, :, None].expand(B, H, T, D)
        self.k.scatter_(2, idx4, k.to(self.k.dtype))
        self.v.scatter_(2, idx4, v.to(self.v.dtype))
        if exec_mask is not None:
            pos = torch.where(exec_mask[:, None], pos, torch.full_like(pos, -1))
        self.positions.scatter_(1, idx, pos)

    def reset(self, mask: torch.Tensor) -> None:
        """Empty the cache of the slots where ``mask`` (bool [B]) is true."""
        self.positions.masked_fill_(mask[:, None], -1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention, q [B, H, T, D], k/v [B, H, S, D], bool mask [B, 1, T, S]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
