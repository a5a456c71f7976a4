"""Building blocks shared by the temporal transformer, the depformer and Mimi's transformer:
fp32 RMSNorm, interleaved RoPE, the gated SiLU feed-forward, the attention module, and the
preallocated ring KV cache with its shared positions (dsm-inference §2.4, §4, §5, §7.1–7.4).

Nothing here branches on Python ints that change from step to step: positions live in tensors,
so a step is capturable as a CUDA graph.
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=None)
def _rope_freqs(D: int, max_period: float, device: torch.device) -> torch.Tensor:
    """max_period^(−2i/D) for i < D/2, fp32 [D/2]: made once per head size and device (at warm-up,
    before any graph capture), not in every layer of every step."""
    ds = torch.arange(D // 2, device=device, dtype=torch.float32)
    return torch.exp(ds * (-math.log(max_period) * 2 / D))


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               max_period: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved rotary embedding (§7.2): rotates pairs (x[2i], x[2i+1]) by pos·max_period^(−2i/D).

    q, k: [B, H, T, D]; positions: absolute positions, int64 [B, T]. Computed in fp32, returned
    in the input dtype. Each pair (r, i) becomes (r·cos − i·sin, i·cos + r·sin), written as
    x·[cos, cos] + swap(x)·[−sin, sin] over the pairs: the same products and sums, so the same
    bits, in a third fewer tensor operations (the step is bound by their count on the CPU).
    """
    D = q.shape[-1]
    angle = _rope_freqs(D, max_period, q.device) * positions.float()[:, None, :, None]  # [B, 1, T, D/2]
    c, s = torch.cos(angle), torch.sin(angle)
    cos = torch.stack([c, c], dim=-1)
    sin = torch.stack([-s, s], dim=-1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        pairs = x.float().view(*x.shape[:-1], D // 2, 2)
        return (pairs * cos + pairs.flip(-1) * sin).view(x.shape).to(x.dtype)

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
        h = F.linear(x, self.linear_in.weight)
        h = h.view(*h.shape[:-1], 2, -1)
        return F.linear(F.silu(h[..., 0, :]) * h[..., 1, :], self.linear_out.weight)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, T, H·D] → [B, H, T, D]."""
    B, T, _ = x.shape
    return x.view(B, T, n_heads, -1).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] → [B, T, H·D]."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


def swap_rows(t: torch.Tensor, i: int, j: int, dim: int = 0) -> torch.Tensor:
    """Exchange slots i and j of ``t`` along its batch dimension ``dim``, in place (through one
    slot's worth of temporary memory). Returns ``t``."""
    a, b = t.select(dim, i), t.select(dim, j)
    kept = a.clone()
    a.copy_(b)
    b.copy_(kept)
    return t


def positional_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, context: int | None) -> torch.Tensor:
    """Causal (and windowed) attention mask, bool [B, 1, T, S]: key valid when
    ``k_pos ≥ 0`` and ``0 ≤ q_pos − k_pos < context`` (§5). q_pos: [B, T], k_pos: [B, S]."""
    delta = q_pos[:, :, None] - k_pos[:, None, :]
    mask = (k_pos[:, None, :] >= 0) & (delta >= 0)
    if context is not None:
        mask = mask & (delta < context)
    return mask[:, None]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention, q [B, H, T, D], k/v [B, H, S, D], bool mask [B, 1, T, S]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


#: Ring buffers are allocated to a multiple of this many entries: CUDA's memory-efficient
#: attention pads a mask whose last dimension is not aligned, in every layer of every step.
MASK_ALIGN = 16


class RingPositions:
    """The absolute position held by every entry of the ring KV caches of one state (§5), shared
    by all their layers, so the attention mask is built once per step.

    ``positions`` int64 [B, L] (−1 = empty), where the ring holds ``capacity`` entries and L is
    ``capacity`` rounded up to :data:`MASK_ALIGN`: entries past ``capacity`` stay empty, so the
    ring behaves exactly as one of ``capacity`` entries (as the reference's, §5) while the mask is
    aligned. ``context`` is the attention window (queries see keys with 0 ≤ q − k < context).
    """

    def __init__(self, positions: torch.Tensor, capacity: int, context: int | None):
        self.positions, self.capacity, self.context = positions, capacity, context

    @classmethod
    def empty(cls, batch_size: int, capacity: int, context: int | None,
              device: torch.device | str | None = None) -> "RingPositions":
        length = -(-capacity // MASK_ALIGN) * MASK_ALIGN
        return cls(torch.full((batch_size, length), -1, dtype=torch.long, device=device), capacity, context)

    def index(self, pos: torch.Tensor) -> torch.Tensor:
        """Ring index of absolute positions pos int64 [B, T]."""
        return pos % self.capacity

    def advance(self, pos: torch.Tensor, exec_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Record T new entries at absolute positions pos int64 [B, T] (T ≤ capacity) and return the
        attention mask of those queries over the ring, bool [B, 1, T, L]. Entries of frozen slots
        (``exec_mask`` bool [B] false) are recorded as empty, so nothing ever attends to them and
        their next real step overwrites them (positions do not advance for a frozen slot)."""
        if exec_mask is not None:
            recorded = torch.where(exec_mask[:, None], pos, torch.full_like(pos, -1))
        else:
            recorded = pos
        self.positions.scatter_(1, self.index(pos), recorded)
        return positional_mask(pos, self.positions, self.context)

    def reset(self, mask: torch.Tensor) -> None:
        """Empty the slots where ``mask`` (bool [B]) is true."""
        self.positions.masked_fill_(mask[:, None], -1)

    def swap(self, i: int, j: int) -> None:
        """Exchange slots i and j."""
        swap_rows(self.positions, i, j)

    def narrow(self, n: int) -> "RingPositions":
        """The first n slots, sharing storage."""
        return RingPositions(self.positions[:n], self.capacity, self.context)


class RingKVCache:
    """Preallocated ring KV cache of one attention layer (§5): ``k``, ``v`` [B, H, L, D], indexed
    by the shared :class:`RingPositions` ``ring``. Writes scatter in place at positions given as a
    tensor, so a step that writes is graph-capturable."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, ring: RingPositions):
        self.k, self.v, self.ring = k, v, ring

    @classmethod
    def empty(cls, ring: RingPositions, n_heads: int, head_dim: int, device: torch.device | str | None = None,
              dtype: torch.dtype = torch.float32) -> "RingKVCache":
        B, L = ring.positions.shape
        shape = (B, n_heads, L, head_dim)
        return cls(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype),
                   ring)

    def write(self, k: torch.Tensor, v: torch.Tensor,
              pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store k, v [B, H, T, D] at absolute positions pos int64 [B, T]; return the whole cache:
        (k, v [B, H, L, D], positions int64 [B, L]) (positions as recorded by ``ring.advance``)."""
        B, H, T, D = k.shape
        idx = self.ring.index(pos)[:, None, :, None].expand(B, H, T, D)
        self.k.scatter_(2, idx, k.to(self.k.dtype))
        self.v.scatter_(2, idx, v.to(self.v.dtype))
        return self.k, self.v, self.ring.positions

    def reset(self, mask: torch.Tensor) -> None:
        """Zero the keys and values of the slots where ``mask`` (bool [B]) is true. Their entries
        are masked anyway, but a masked value still enters attention as 0 · value: a NaN left by
        an earlier turn (CUDA's memory-efficient attention gives NaN rows where every key is
        masked, pytorch#110213) would otherwise reach the next turn of the slot."""
        self.k.masked_fill_(mask[:, None, None, None], 0.0)
        self.v.masked_fill_(mask[:, None, None, None], 0.0)

    def swap(self, i: int, j: int) -> None:
        """Exchange the keys and values of slots i and j (the shared ring swaps its own)."""
        swap_rows(self.k, i, j)
        swap_rows(self.v, i, j)

    def narrow(self, n: int, ring: RingPositions) -> "RingKVCache":
        """The first n slots, sharing storage, indexed by ``ring`` (the narrowed shared ring)."""
        return RingKVCache(self.k[:n], self.v[:n], ring)


class Attention(nn.Module):
    """Multi-head attention with the checkpoint's projections: ``in_projs.S`` [3·dim, dim] (rows
    q; k; v, head-major) and ``out_projs.S`` [dim, dim], no biases, for ``n_slots`` weight slots
    (one, except in the depformer, §7.5). One class for the temporal transformer (self- and
    cross-attention), the depformer and Mimi's transformer.

    ``max_period``: interleaved RoPE on q and k at absolute positions (§7.2); None for none.
    """

    def __init__(self, dim: int, n_heads: int, n_slots: int = 1, max_period: float | None = None):
        super().__init__()
        self.n_heads, self.max_period = n_heads, max_period
        self.in_projs = nn.ModuleList([nn.Linear(dim, 3 * dim, bias=False) for _ in range(n_slots)])
        self.out_projs = nn.ModuleList([nn.Linear(dim, dim, bias=False) for _ in range(n_slots)])
        # Plain tuples beside the ModuleLists: indexing a ModuleList and calling a Module cost more
        # host time than the op itself at frame-step sizes (the step is bound by op count).
        self._in, self._out = tuple(self.in_projs), tuple(self.out_projs)

    def qkv(self, x: torch.Tensor, slot: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Projections of x [B, T, dim] with weight slot ``slot``: q, k, v [B, H, T, Dh]."""
        qkv = F.linear(x, self._in[slot].weight)
        q, k, v = (split_heads(t, self.n_heads) for t in qkv.chunk(3, dim=-1))
        return q, k, v

    def project_out(self, a: torch.Tensor, slot: int = 0) -> torch.Tensor:
        """Attention output a [B, H, T, Dh] → [B, T, dim]."""
        return F.linear(merge_heads(a), self._out[slot].weight)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                cache: RingKVCache | None = None) -> torch.Tensor:
        """Self-attention of x [B, T, dim] at absolute positions pos int64 [B, T] under ``mask``
        (bool [B, 1, T, S]). With a cache, the new keys and values are written to it and attention
        reads the whole ring (S = its length); without, it reads x itself (S = T)."""
        q, k, v = self.qkv(x)
        if self.max_period is not None:
            q, k = apply_rope(q, k, pos, self.max_period)
        if cache is not None:
            k, v, _ = cache.write(k, v, pos)
        return self.project_out(attention(q, k, v, mask))

    def cross_kv(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of a source: src [B, S, dim] → k, v [B, H, S, Dh] (§3)."""
        w = self._in[0].weight
        d = w.shape[0] // 3
        k, v = F.linear(src, w[d:]).chunk(2, dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def cross(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Cross-attention of x [B, T, dim] to precomputed k, v [B, H, S, Dh], unmasked (§3); q uses
        the first third of ``in_projs.0``."""
        w = self._in[0].weight
        q = split_heads(F.linear(x, w[: w.shape[0] // 3]), self.n_heads)
        return self.project_out(attention(q, k, v, None))
