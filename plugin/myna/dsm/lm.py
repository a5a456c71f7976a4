"""The DSM language model (dsm-inference §1.3, §2.1, §2.4): input embeddings (audio, demuxed text),
the temporal transformer (fp32 RMSNorm, interleaved RoPE, self-attention over a ring KV cache,
cross-attention to the voice in every layer, gated SiLU FFN), the text head, and the depformer's
inputs and heads.

:class:`DSMLM` owns every tensor of the LM checkpoint under its released name, so loading is a
plain state-dict copy. Streaming state lives in :class:`TemporalState`, created once per batch
and passed to :meth:`DSMLM.forward_text`; nothing in a step allocates per-step state or branches
on Python ints, so a step is capturable as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .conditioners import ConditionProvider
from .config import DSMConfig
from .depformer import Depformer
from .layers import Attention, GatedFFN, RMSNorm, RingKVCache, RingPositions, positional_mask, swap_rows


def embed(weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Embedding lookup where token −1 gives exactly 0 (§2.1). tokens: int64 [...] → [..., dim]."""
    return F.embedding(tokens.clamp(min=0), weight).masked_fill_((tokens == -1)[..., None], 0.0)


class LowRankEmbedding(nn.Module):
    """Depformer audio input: 128-d lookup (−1 → 0), then ``low_rank`` Linear to the depformer width."""

    def __init__(self, num: int, rank: int | None, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num, rank or dim))
        self.low_rank = nn.Linear(rank, dim, bias=False) if rank else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        y = embed(self.weight, tokens)
        return F.linear(y, self.low_rank.weight) if self.low_rank is not None else y


class DemuxEmbedding(nn.Module):
    """Text embedding of the muxed stream v = (second + 1)·card + main (§2.1):
    ``out1(E[v mod card]) + out2(E[v div card − 1])`` (second term 0 when second = −1), 0 when v = −1.
    Without demux it is a plain lookup (−1 → 0)."""

    def __init__(self, num: int, emb_dim: int, out_dim: int, demux: bool):
        super().__init__()
        self.num = num
        self.weight = nn.Parameter(torch.zeros(num, emb_dim))
        self.demux = demux
        if demux:
            self.out1 = nn.Linear(emb_dim, out_dim, bias=False)
            self.out2 = nn.Linear(emb_dim, out_dim, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self.demux:
            return embed(self.weight, tokens)
        is_zero = (tokens == -1)[..., None]
        t = tokens.clamp(min=0)
        left = F.embedding(t % self.num, self.weight)
        right = t // self.num - 1
        right_emb = F.linear(F.embedding(right.clamp(min=0), self.weight), self.out2.weight)
        y = F.linear(left, self.out1.weight) + right_emb.masked_fill_((right < 0)[..., None], 0.0)
        return y.masked_fill_(is_zero, 0.0)


class TemporalLayer(nn.Module):
    """Pre-norm layer: x += SA(RMS1(x)); x += CA(LN_cross(x), voice); x += FFN(RMS2(x)) (§2.4)."""

    def __init__(self, cfg: DSMConfig):
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg.dim, cfg.num_heads, max_period=cfg.max_period)
        if cfg.cross_attention:
            self.norm_cross = nn.LayerNorm(cfg.dim, eps=1e-5)
            self.cross_attention = Attention(cfg.dim, cfg.num_heads)
        self.norm2 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.gating = GatedFFN(cfg.dim, cfg.ff_hidden)
        self.has_cross = cfg.cross_attention

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: RingKVCache | None,
                cross: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """x [B, T, dim], pos int64 [B, T] absolute positions, mask bool [B, 1, T, S] (see
        :meth:`Attention.forward`); cross: the voice's keys and values (:meth:`Attention.cross_kv`)."""
        x = x + self.self_attn(self.norm1(x), pos, mask, cache)
        if self.has_cross:
            assert cross is not None, "this model has cross-attention: a voice (cross source) is required"
            x = x + self.cross_attention.cross(self.norm_cross(x), *cross)
        return x + self.gating(self.norm2(x))


class Transformer(nn.Module):
    """``transformer.layers``."""

    def __init__(self, cfg: DSMConfig):
        super().__init__()
        self.layers = nn.ModuleList([TemporalLayer(cfg) for _ in range(cfg.num_layers)])


@dataclass
class TemporalState:
    """Streaming state of the temporal transformer for B slots (§5), created once per batch by
    :meth:`DSMLM.new_state` and updated in place.

    ``offset`` int64 [B] (next position), ``exec_mask`` bool [B] (false freezes a slot),
    ``cond_sum`` [B, 1, dim] (LM dtype), ``cross_k``/``cross_v`` [L, B, H, S, Dh] (LM dtype; S = 0
    without cross-attention), ``ring`` (the positions shared by the caches) and one
    :class:`RingKVCache` per layer.
    """

    offset: torch.Tensor
    exec_mask: torch.Tensor
    cond_sum: torch.Tensor
    cross_k: torch.Tensor
    cross_v: torch.Tensor
    ring: RingPositions
    caches: list[RingKVCache]

    @property
    def batch_size(self) -> int:
        return self.offset.shape[0]

    def reset(self, mask: torch.Tensor) -> None:
        """Restart the slots where ``mask`` (bool [B]) is true: position 0, empty zeroed caches, running."""
        self.offset.masked_fill_(mask, 0)
        self.exec_mask.masked_fill_(mask, True)
        self.ring.reset(mask)
        for cache in self.caches:
            cache.reset(mask)

    def swap(self, i: int, j: int) -> None:
        """Exchange slots i and j: positions, caches, conditions, run flags."""
        for t in (self.offset, self.exec_mask, self.cond_sum):
            swap_rows(t, i, j)
        swap_rows(self.cross_k, i, j, dim=1)
        swap_rows(self.cross_v, i, j, dim=1)
        self.ring.swap(i, j)
        for cache in self.caches:
            cache.swap(i, j)

    def narrow(self, n: int) -> "TemporalState":
        """The first n slots, sharing storage (in-place updates of the view update this state)."""
        ring = self.ring.narrow(n)
        return TemporalState(self.offset[:n], self.exec_mask[:n], self.cond_sum[:n], self.cross_k[:, :n],
                             self.cross_v[:, :n], ring, [c.narrow(n, ring) for c in self.caches])


class DSMLM(nn.Module):
    """The whole LM checkpoint (§1.3): ``emb``, ``text_emb``, ``transformer``, ``out_norm``,
    ``text_linear``, ``depformer_in``, ``depformer_emb``, ``depformer_text_emb``, ``depformer``,
    ``linears`` and ``condition_provider`` (kept in fp32)."""

    def __init__(self, cfg: DSMConfig):
        super().__init__()
        self.cfg = cfg
        d, dd = cfg.dim, cfg.depformer_dim
        self.emb = nn.ModuleList([nn.Embedding(cfg.card + 1, d) for _ in range(cfg.n_q)])
        self.text_emb = DemuxEmbedding(cfg.text_in_card, d, d, cfg.demux_second_stream)
        self.transformer = Transformer(cfg)
        self.out_norm = RMSNorm(d, cfg.norm_eps)
        self.text_linear = nn.Linear(d, cfg.text_out_card, bias=False)
        self.depformer_in = nn.ModuleList([nn.Linear(d, dd, bias=False) for _ in range(cfg.n_slots)])
        rank = cfg.depformer_low_rank_embeddings
        self.depformer_emb = nn.ModuleList([LowRankEmbedding(cfg.card + 1, rank, dd) for _ in range(cfg.dep_q - 1)])
        self.depformer_text_emb = DemuxEmbedding(cfg.text_in_card, rank or dd, dd, cfg.demux_second_stream)
        self.depformer = Depformer(dd, cfg.depformer_num_heads, cfg.depformer_num_layers, cfg.dep_ff_hidden,
                                   cfg.n_slots, cfg.norm_eps)
        self.linears = nn.ModuleList([nn.Linear(dd, cfg.card, bias=False) for _ in range(cfg.dep_q)])
        self.condition_provider = (ConditionProvider(cfg.conditioners, cfg.fuser, d)
                                   if cfg.conditioners else None)
        # the depformer's per-codebook modules as plain tuples, weights read at call time (see
        # Attention: at frame-step sizes ModuleList indexing and Module calls cost more than the ops)
        self._depformer_in, self._depformer_emb = tuple(self.depformer_in), tuple(self.depformer_emb)
        self._linears = tuple(self.linears)

    @property
    def dtype(self) -> torch.dtype:
        """The LM dtype (bf16 on GPU); the conditioners stay fp32."""
        return self.text_linear.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.text_linear.weight.device

    # ----------------------------------------------------------------- embeddings

    def embed_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Input embedding of the 1 + n_q streams (§2.4 step 2), in this order:
        emb0(a0) + … + emb_{n−1}(a_{n−1}) + text_emb(text). tokens int64 [B, K, T] → [B, T, dim]."""
        x = None
        for i, emb in enumerate(self.emb):
            e = embed(emb.weight, tokens[:, i + 1])
            x = e if x is None else x + e
        t = self.text_emb(tokens[:, 0])
        return t if x is None else x + t

    # ----------------------------------------------------------------- temporal

    def new_state(self, batch_size: int, cross_len: int = 0) -> TemporalState:
        """A fresh :class:`TemporalState` for ``batch_size`` slots on this model's device/dtype.
        ``cross_len`` is the cross-attention source length (max_speakers·125 for 1.6b)."""
        cfg, dev, dt = self.cfg, self.device, self.dtype
        ring = RingPositions.empty(batch_size, cfg.context, cfg.context, dev)
        caches = [RingKVCache.empty(ring, cfg.num_heads, cfg.head_dim, dev, dt) for _ in range(cfg.num_layers)]
        cross_shape = (cfg.num_layers, batch_size, cfg.num_heads, cross_len if cfg.cross_attention else 0,
                       cfg.head_dim)
        return TemporalState(offset=torch.zeros(batch_size, dtype=torch.long, device=dev),
                             exec_mask=torch.ones(batch_size, dtype=torch.bool, device=dev),
                             cond_sum=torch.zeros(batch_size, 1, cfg.dim, device=dev, dtype=dt),
                             cross_k=torch.zeros(cross_shape, device=dev, dtype=dt),
                             cross_v=torch.zeros(cross_shape, device=dev, dtype=dt), ring=ring, caches=caches)

    @torch.no_grad()
    def set_conditions(self, state: TemporalState, index: torch.Tensor | slice,
                       cond_sum: torch.Tensor | None, cross: torch.Tensor | None) -> None:
        """Install conditions for the slots ``index``: cond_sum [b, 1, dim] and the cross source
        [b, S, dim] (any float dtype, cast to the LM dtype); cross K/V are computed once here (§3)."""
        if cond_sum is not None:
            state.cond_sum[index] = cond_sum.to(state.cond_sum.dtype)
        if self.cfg.cross_attention:
            if cross is None:
                raise ValueError("this model has cross-attention and needs a cross source (a voice)")
            src = cross.to(self.device, self.dtype)
            for i, layer in enumerate(self.transformer.layers):
                k, v = layer.cross_attention.cross_kv(src)
                state.cross_k[i, index] = k
                state.cross_v[i, index] = v

    def forward_text(self, state: TemporalState, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One temporal step for B slots (§2.4 steps 2–3). tokens int64 [B, 1 + n_q] (text first).

        Returns (h [B, 1, dim] normalised transformer output in the LM dtype, text logits fp32
        [B, text_out_card]). Advances ``state.offset`` where ``state.exec_mask``."""
        x = self.embed_inputs(tokens[:, :, None])
        if self.condition_provider is not None and self.condition_provider.sum_names:
            x = x + state.cond_sum.to(x)
        pos = state.offset[:, None]
        mask = state.ring.advance(pos, state.exec_mask)
        for i, layer in enumerate(self.transformer.layers):
            cross = (state.cross_k[i], state.cross_v[i]) if layer.has_cross else None
            x = layer(x, pos, mask, state.caches[i], cross)
        h = self.out_norm(x)
        logits = self.text_linear(h)[:, 0].float()
        state.offset.copy_(torch.where(state.exec_mask, state.offset + 1, state.offset))
        return h, logits

    def forward_sequence(self, tokens: torch.Tensor, cond_sum: torch.Tensor | None = None,
                         cross: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Temporal transformer over a whole sequence without cache (teacher forcing).
        tokens int64 [B, K, T] (already delayed) → (h [B, T, dim], text logits [B, T, V] fp32)."""
        B, _, T = tokens.shape
        x = self.embed_inputs(tokens)
        if cond_sum is not None:
            x = x + cond_sum.to(x)
        pos = torch.arange(T, device=tokens.device).expand(B, T)
        mask = positional_mask(pos, pos, self.cfg.context)
        src = cross.to(x) if cross is not None else None
        for layer in self.transformer.layers:
            kv = layer.cross_attention.cross_kv(src) if src is not None and layer.has_cross else None
            x = layer(x, pos, mask, None, kv)
        h = self.out_norm(x)
        return h, self.text_linear(h).float()

    # ----------------------------------------------------------------- depformer

    def depformer_input(self, k: int, prev: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Depformer input of codebook k (§2.4 step 5): depformer_in[schedule[k]](h) + the embedding
        of the previous token (the muxed text token for k = 0). prev int64 [...], h [..., dim]."""
        x = F.linear(h, self._depformer_in[self.cfg.schedule[k]].weight)
        e = self.depformer_text_emb.forward(prev) if k == 0 else self._depformer_emb[k - 1].forward(prev)
        return x + e

    def depformer_logits(self, k: int, prev: torch.Tensor, h: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        """Logits of codebook k for B slots: prev int64 [B], h [B, 1, dim], cache from
        ``self.depformer.new_cache``. Returns fp32 [B, card]."""
        x = self.depformer_input(k, prev[:, None], h)
        y = self.depformer.step(x, k, self.cfg.schedule[k], cache)
        return F.linear(y, self._linears[k].weight)[:, 0].float()

    def forward_depformer(self, tokens: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Teacher-forced depformer over all frames: tokens int64 [B, K, T] (the step-t inputs:
        muxed text then codebooks 0..n_q−2), h [B, T, dim] → logits fp32 [B, n_q, T, card]."""
        B, _, T = tokens.shape
        xs = [self.depformer_input(k, tokens[:, k], h) for k in range(self.cfg.dep_q)]
        x = torch.stack(xs, dim=2).reshape(B * T, self.cfg.dep_q, -1)
        y = self.depformer(x, self.cfg.schedule)
        logits = [self.linears[k](y[:, k]).view(B, T, -1) for k in range(self.cfg.dep_q)]
        return torch.stack(logits, dim=1).float()

    def forward(self, codes: torch.Tensor, cond_sum: torch.Tensor | None = None,
                cross: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced forward on aligned codes int64 [B, 1 + n_q, T] (text first): applies the
        delays, runs both transformers, and realigns. Returns (audio logits [B, n_q, T, card],
        text logits [B, 1, T, V]), fp32, NaN where a delay leaves no prediction."""
        cfg = self.cfg
        B, K, T = codes.shape
        initial = torch.tensor([cfg.text_card] + [cfg.card] * cfg.n_q, device=codes.device)
        delayed = torch.empty(B, K, T + 1, dtype=torch.long, device=codes.device)
        delayed[:, :, 0] = initial
        for k, d in enumerate(cfg.delays):
            delayed[:, k, 1:1 + d] = initial[k]
            delayed[:, k, 1 + d:] = codes[:, k, :T - d]
        h, text_logits = self.forward_sequence(delayed[:, :, :-1], cond_sum, cross)
        logits = self.forward_depformer(delayed[:, :, 1:], h)
        out = torch.full_like(logits, float("nan"))
        for q in range(cfg.dep_q):
            d = cfg.delays[q + 1]
            out[:, q, :T - d] = logits[:, q, d:]
        text = torch.full_like(text_logits, float("nan"))
        d0 = cfg.delays[0]
        text[:, :T - d0] = text_logits[:, d0:]
        return out, text[:, None]
