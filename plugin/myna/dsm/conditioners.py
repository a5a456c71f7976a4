"""Conditioning (dsm-inference §2.7, §3): the LUT conditioners (``cfg``, ``control``), the tensor
conditioner (``speaker_wavs``), and the fuser that turns them into the per-step sum
(B, 1, dim) and the cross-attention source (B, S, dim).

Parameter names follow the checkpoint (``condition_provider.conditioners.NAME.*``). The
conditioners always run in fp32; their outputs are cast to the LM dtype by the caller.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch
from torch import nn


class LUTConditioner(nn.Module):
    """A look-up-table condition: ``output_proj(embed[idx])``, or ``learnt_padding`` when the value
    is None (idx = n_bins, mask false). Output fp32 [B, 1, out_dim]."""

    def __init__(self, n_bins: int, dim: int, out_dim: int, possible_values: Sequence[str] | None = None,
                 tokenizer: str = "noop"):
        super().__init__()
        if tokenizer != "noop":
            raise NotImplementedError(f"LUT conditioner tokenizer {tokenizer!r} is not supported")
        self.n_bins = n_bins
        self.possible_values = list(possible_values) if possible_values is not None else None
        self.embed = nn.Embedding(n_bins + 1, dim)
        self.output_proj = nn.Linear(dim, out_dim, bias=False)
        self.learnt_padding = nn.Parameter(torch.zeros(1, 1, out_dim))

    def index(self, value: str | None) -> int:
        """Table row of ``value`` (n_bins for None); raises ValueError for an unknown value."""
        if value is None:
            return self.n_bins
        if self.possible_values is None:
            return int(hashlib.sha256(value.encode("utf-8")).hexdigest(), 16) % self.n_bins
        if value not in self.possible_values:
            raise ValueError(f"{value!r} is not one of {self.possible_values}")
        return self.possible_values.index(value)

    def forward(self, values: Sequence[str | None]) -> torch.Tensor:
        dev = self.embed.weight.device
        idx = torch.tensor([self.index(v) for v in values], device=dev)[:, None]
        maskf = torch.tensor([v is not None for v in values], device=dev).float()[:, None, None]
        cond = self.output_proj(self.embed(idx))
        return cond * maskf + self.learnt_padding * (1 - maskf)


class TensorConditioner(nn.Module):
    """A tensor condition (the voice): ``output_proj(x)`` where the mask is true, ``learnt_padding``
    elsewhere. x: fp32 [B, S, dim], mask: bool [B, S] → fp32 [B, S, out_dim]."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.output_proj = nn.Linear(dim, out_dim, bias=False)
        self.learnt_padding = nn.Parameter(torch.zeros(1, 1, out_dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        dev = self.output_proj.weight.device
        cond = self.output_proj(x.to(dev, torch.float32))
        maskf = mask.to(dev).float()[..., None]
        return cond * maskf + self.learnt_padding * (1 - maskf)


def sin_embedding(length: int, dim: int, max_period: float = 10000.0,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Sinusoidal positions 0..length−1, fp32 [1, length, dim] (§3, §7.8):
    cat[cos(p / P^(i / (half − 1))), sin(…)], note the half − 1."""
    half = dim // 2
    pos = torch.arange(length, device=device, dtype=torch.float32).view(1, -1, 1)
    adim = torch.arange(half, device=device, dtype=torch.float32).view(1, 1, -1)
    period = torch.full([], max_period, device=device, dtype=torch.float32)
    phase = pos / (period ** (adim / (half - 1)))
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)


class ConditionProvider(nn.Module):
    """All conditioners of a checkpoint plus the fuser settings (config ``conditioners``/``fuser``)."""

    def __init__(self, conditioners: dict[str, Any], fuser: dict[str, Any], out_dim: int):
        super().__init__()
        mods: dict[str, nn.Module] = {}
        for name, cfg in conditioners.items():
            kind = cfg["type"]
            kw = cfg[kind]
            if kind == "lut":
                mods[name] = LUTConditioner(kw["n_bins"], kw["dim"], out_dim, kw.get("possible_values"),
                                            kw.get("tokenizer", "noop"))
            elif kind == "tensor":
                mods[name] = TensorConditioner(kw["dim"], out_dim)
            else:
                raise NotImplementedError(f"conditioner type {kind!r} ({name}) is not supported")
        self.conditioners = nn.ModuleDict(mods)
        self.sum_names: list[str] = list(fuser.get("sum", []))
        self.cross_names: list[str] = list(fuser.get("cross", []))
        if fuser.get("prepend"):
            raise NotImplementedError("prepend conditions are not supported")
        self.cross_pos_emb = bool(fuser.get("cross_attention_pos_emb", False))
        self.cross_pos_scale = float(fuser.get("cross_attention_pos_emb_scale", 1.0))

    @property
    def lut_names(self) -> list[str]:
        return [n for n, m in self.conditioners.items() if isinstance(m, LUTConditioner)]

    @property
    def tensor_names(self) -> list[str]:
        return [n for n, m in self.conditioners.items() if isinstance(m, TensorConditioner)]

    def condition_sum(self, values: dict[str, Sequence[str | None]]) -> torch.Tensor | None:
        """Sum of the ``sum`` conditions (§2.7), fp32 [B, 1, out_dim]; ``values[name]`` has one
        value (or None) per batch item."""
        total = None
        for name in self.sum_names:
            cond = self.conditioners[name](values[name])
            total = cond if total is None else total + cond
        return total

    def cross_source(self, tensors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
        """The cross-attention source (§3), fp32 [B, S, out_dim]: projected voice with learnt padding
        on masked positions, plus sinusoidal positions. ``tensors[name] = (x [B, S, dim], mask [B, S])``."""
        cross = None
        for name in self.cross_names:
            if name not in tensors:
                raise KeyError(name)
            x, mask = tensors[name]
            cond = self.conditioners[name](x, mask)
            cross = cond if cross is None else torch.cat([cross, cond], dim=1)
        if cross is not None and self.cross_pos_emb:
            pos = sin_embedding(cross.shape[1], cross.shape[-1], device=cross.device)
            cross = cross + self.cross_pos_scale * pos.to(cross.dtype)
        return cross
