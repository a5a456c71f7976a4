"""The Mimi decoder (dsm-inference §4), fp32: split RVQ decode → ×2 depthwise transposed-conv upsample
(12.5 → 25 Hz) → causal transformer (LayerNorm, RoPE, GELU, LayerScale, ring KV cache) → SEANet
decoder (causal convs and transposed convs, ELU) → 24 kHz PCM.

Streaming state lives in :class:`MimiState` (per-conv left context, per-transposed-conv overlap
stored without bias, transformer ring cache and positions), so decoding frame by frame equals
decoding the whole sequence at once. One frame of codes gives exactly ``frame_size`` (1920) samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .config import MimiConfig
from .layers import Attention, RingKVCache, RingPositions, positional_mask, swap_rows


@dataclass
class MimiState:
    """Streaming state of the decoder for B streams, created by :meth:`MimiDecoder.new_state`.

    ``buffers[name]``: per-conv left context [B, C_in, (k−1)·dilation] (zeros at start) and
    per-transposed-conv overlap [B, C_out, K−S] (bias removed); ``ring`` and ``caches``: the
    transformer's ring KV caches and their shared positions; ``offset`` int64 [B]: transformer
    position (25 Hz); ``exec_mask`` bool [B] (false leaves a stream as it is).
    """

    buffers: dict[str, torch.Tensor]
    ring: RingPositions
    caches: list[RingKVCache]
    offset: torch.Tensor
    exec_mask: torch.Tensor

    def reset(self, mask: torch.Tensor) -> None:
        """Restart the streams where ``mask`` (bool [B]) is true."""
        for buf in self.buffers.values():
            buf.masked_fill_(mask[:, None, None], 0.0)
        self.ring.reset(mask)
        for cache in self.caches:
            cache.reset(mask)
        self.offset.masked_fill_(mask, 0)
        self.exec_mask.masked_fill_(mask, True)

    def swap(self, i: int, j: int) -> None:
        """Exchange streams i and j."""
        for buf in self.buffers.values():
            swap_rows(buf, i, j)
        self.ring.swap(i, j)
        for cache in self.caches:
            cache.swap(i, j)
        swap_rows(self.offset, i, j)
        swap_rows(self.exec_mask, i, j)

    def narrow(self, n: int) -> "MimiState":
        """The first n streams, sharing storage."""
        ring = self.ring.narrow(n)
        return MimiState({k: b[:n] for k, b in self.buffers.items()}, ring, [c.narrow(n, ring) for c in self.caches],
                         self.offset[:n], self.exec_mask[:n])


def _keep(state: MimiState, name: str, value: torch.Tensor) -> None:
    buf = state.buffers[name]
    buf.copy_(torch.where(state.exec_mask[:, None, None], value, buf))


class CausalConv1d(nn.Module):
    """Causal Conv1d with zero left padding (k−1)·dilation, or the streamed left context."""

    def __init__(self, name: str, cin: int, cout: int, kernel: int, dilation: int = 1, bias: bool = True):
        super().__init__()
        self.name, self.dilation = name, dilation
        self.weight = nn.Parameter(torch.zeros(cout, cin, kernel))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.context = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, state: MimiState | None) -> torch.Tensor:
        if self.context:
            if state is None:
                x = F.pad(x, (self.context, 0))
            else:
                x = torch.cat([state.buffers[self.name], x], dim=-1)
                _keep(state, self.name, x[..., -self.context:])
        return F.conv1d(x, self.weight, self.bias, dilation=self.dilation)


class CausalConvTranspose1d(nn.Module):
    """Causal ConvTranspose1d: the last K−S outputs are trimmed (batch) or kept, without bias,
    and added to the first K−S outputs of the next chunk (streaming)."""

    def __init__(self, name: str, cin: int, cout: int, kernel: int, stride: int, groups: int = 1,
                 bias: bool = True):
        super().__init__()
        self.name, self.stride, self.groups = name, stride, groups
        self.weight = nn.Parameter(torch.zeros(cin, cout // groups, kernel))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.overlap = kernel - stride

    def forward(self, x: torch.Tensor, state: MimiState | None) -> torch.Tensor:
        y = F.conv_transpose1d(x, self.weight, self.bias, stride=self.stride, groups=self.groups)
        P = self.overlap
        if not P:
            return y
        if state is None:
            return y[..., :-P]
        y = torch.cat([y[..., :P] + state.buffers[self.name], y[..., P:]], dim=-1)
        tail = y[..., -P:]
        if self.bias is not None:
            tail = tail - self.bias[:, None]
        _keep(state, self.name, tail)
        return y[..., :-P]


class ResBlock(nn.Module):
    """SEANet residual block: x + conv2(ELU(conv1(ELU(x)))), conv1 k3 C→C/2, conv2 k1 C/2→C."""

    def __init__(self, name: str, dim: int, hidden: int, kernel: int):
        super().__init__()
        self.conv1 = CausalConv1d(name + ".conv1", dim, hidden, kernel)
        self.conv2 = CausalConv1d(name + ".conv2", hidden, dim, 1)

    def forward(self, x: torch.Tensor, state: MimiState | None) -> torch.Tensor:
        return x + self.conv2(F.elu(self.conv1(F.elu(x), state)), state)


class LayerScale(nn.Module):
    """Learnt per-channel residual scale ``scale`` [dim] (§4)."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))


class MimiLayer(nn.Module):
    """x += ls1·SA(LN1(x)) (RoPE, causal, context window); x += ls2·W2(GELU(W1(LN2(x))))."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        d = cfg.tr_dim
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.self_attn = Attention(d, cfg.tr_heads, max_period=cfg.tr_max_period)
        self.linear1 = nn.Linear(d, cfg.tr_ff, bias=False)
        self.linear2 = nn.Linear(cfg.tr_ff, d, bias=False)
        self.layer_scale_1 = LayerScale(d)
        self.layer_scale_2 = LayerScale(d)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                cache: RingKVCache | None) -> torch.Tensor:
        x = x + self.layer_scale_1.scale * self.self_attn(self.norm1(x), pos, mask, cache)
        h = self.linear2(F.gelu(self.linear1(self.norm2(x))))
        return x + self.layer_scale_2.scale * h


class MimiTransformer(nn.Module):
    """The decoder transformer's layers (``decoder_transformer.transformer.layers`` in the file)."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.layers = nn.ModuleList([MimiLayer(cfg) for _ in range(cfg.tr_layers)])


class MimiDecoder(nn.Module):
    """Codes → PCM (§4). ``codebooks`` fp32 [n_q, bins, dim_q] holds embedding_sum / clamp(cluster_usage,
    1e-5), folded at load time."""

    def __init__(self, cfg: MimiConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dimension
        self.register_buffer("codebooks", torch.zeros(cfg.n_q, cfg.bins, cfg.codebook_dim))
        self.proj_first = nn.Conv1d(cfg.codebook_dim, d, 1, bias=False)
        self.proj_rest = nn.Conv1d(cfg.codebook_dim, d, 1, bias=False)
        s = cfg.upsample_stride
        self.upsample = CausalConvTranspose1d("upsample", d, d, 2 * s, s, groups=d, bias=False)
        self.transformer = MimiTransformer(cfg)
        mult = 2 ** len(cfg.ratios)
        layers: list[nn.Module] = [CausalConv1d("seanet.0", d, mult * cfg.n_filters, cfg.kernel_size)]
        for ratio in cfg.ratios:
            c = mult * cfg.n_filters
            i = len(layers) + 1
            layers += [nn.ELU(), CausalConvTranspose1d(f"seanet.{i}", c, c // 2, 2 * ratio, ratio)]
            i = len(layers)
            layers += [ResBlock(f"seanet.{i}", c // 2, c // 2 // cfg.compress, cfg.residual_kernel_size)]
            mult //= 2
        layers += [nn.ELU(), CausalConv1d(f"seanet.{len(layers) + 1}", cfg.n_filters, 1, cfg.last_kernel_size)]
        self.seanet = nn.ModuleList(layers)

    @property
    def frame_size(self) -> int:
        """Samples per 80 ms frame (1920)."""
        return self.cfg.frame_size

    def new_state(self, batch_size: int) -> MimiState:
        """A fresh streaming state for ``batch_size`` streams."""
        dev, dt = self.proj_first.weight.device, self.proj_first.weight.dtype
        buffers = {}
        for m in self.modules():
            if isinstance(m, CausalConv1d) and m.context:
                buffers[m.name] = torch.zeros(batch_size, m.weight.shape[1], m.context, device=dev, dtype=dt)
            elif isinstance(m, CausalConvTranspose1d) and m.overlap:
                cout = m.weight.shape[1] * m.groups
                buffers[m.name] = torch.zeros(batch_size, cout, m.overlap, device=dev, dtype=dt)
        c = self.cfg
        ring = RingPositions.empty(batch_size, c.tr_context, c.tr_context, dev)
        caches = [RingKVCache.empty(ring, c.tr_heads, c.tr_dim // c.tr_heads, dev, dt) for _ in range(c.tr_layers)]
        return MimiState(buffers, ring, caches, torch.zeros(batch_size, dtype=torch.long, device=dev),
                         torch.ones(batch_size, dtype=torch.bool, device=dev))

    def decode_latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Split RVQ decode: codes int64 [B, K, T] (K ≤ n_q; the first is semantic) → [B, dim, T]."""
        cb = self.codebooks
        first = F.embedding(codes[:, 0], cb[0]).transpose(1, 2)
        latent = self.proj_first(first)
        if codes.shape[1] > 1:
            rest = None
            for j in range(1, codes.shape[1]):
                e = F.embedding(codes[:, j], cb[j])
                rest = e if rest is None else rest + e
            latent = latent + self.proj_rest(rest.transpose(1, 2))
        return latent

    def decode(self, codes: torch.Tensor, state: MimiState | None = None) -> torch.Tensor:
        """Codes int64 [B, K, T] → PCM fp32 [B, 1, T·frame_size] (not clipped).

        Without ``state`` the sequence is decoded as a whole from silence; with a state, codes
        continue the stream (call it frame by frame or in chunks: the result is the same)."""
        x = self.upsample(self.decode_latent(codes), state)
        x = x.transpose(1, 2)
        B, T, _ = x.shape
        start = state.offset[:, None] if state is not None else torch.zeros(B, 1, dtype=torch.long,
                                                                             device=x.device)
        pos = start + torch.arange(T, device=x.device)[None, :]
        if state is None:
            mask = positional_mask(pos, pos, self.cfg.tr_context)
        else:
            mask = state.ring.advance(pos, state.exec_mask)
        for i, layer in enumerate(self.transformer.layers):
            x = layer(x, pos, mask, state.caches[i] if state is not None else None)
        if state is not None:
            state.offset.copy_(torch.where(state.exec_mask, state.offset + T, state.offset))
        x = x.transpose(1, 2)
        for layer in self.seanet:
            x = layer(x) if isinstance(layer, nn.ELU) else layer(x, state)
        return x
