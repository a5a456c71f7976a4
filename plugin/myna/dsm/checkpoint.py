"""Reading released DSM TTS checkpoints (dsm-inference §1): ``config.json``, the LM and Mimi safetensors,
from a folder or a Hugging Face repo id.

- Tensors are read memory-mapped (``safetensors.safe_open``) and cast on the way: the LM to the
  requested dtype, ``condition_provider.*`` and Mimi to fp32.
- Attention weights load from split names (``in_projs.N.weight``, ``out_projs.N.weight``) or fused
  ones (``in_proj_weight``, ``in_proj.weight``, ``out_proj.weight``), split along dim 0 (§7.9).
- A missing key or a wrong shape raises :class:`CheckpointError` naming the file, key and shapes.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn

from .config import DSMConfig, MimiConfig
from .lm import DSMLM
from .mimi import CausalConvTranspose1d, MimiDecoder

log = logging.getLogger(__name__)

#: Keys present in released LM files that this port does not use.
LM_IGNORED = re.compile(r"^(depformer_text_emb\.low_rank\.weight|extra_heads\..*)$")
#: Mimi keys outside the decode path.
MIMI_IGNORED = re.compile(r"^(encoder\.|encoder_transformer\.|downsample\.|quantizer\.rvq_(first|rest)\.input_proj"
                          r"|.*_codebook\._initialized)")


class CheckpointError(RuntimeError):
    """A checkpoint file lacks a key, has a tensor of the wrong shape, or cannot be found."""


# ------------------------------------------------------------------------------------------ files


def resolve_checkpoint(path_or_repo: str | Path, revision: str | None = None) -> Path:
    """A local folder holding ``config.json`` and the files it names, or a Hugging Face repo id
    (``owner/name``) fetched through ``huggingface_hub`` (needs a network; not used in tests)."""
    path = Path(path_or_repo).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} holds no config.json")
        return path
    text = str(path_or_repo)
    if path.exists() or not re.fullmatch(r"[\w.-]+/[\w.-]+", text):
        raise CheckpointError(f"checkpoint not found: {text} (give a folder or a Hugging Face repo id)")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise CheckpointError(f"{text} looks like a Hugging Face repo id, but huggingface_hub is not "
                              "installed (pip install 'myna[hub]')") from exc
    config = Path(hf_hub_download(text, "config.json", revision=revision))
    raw = json.loads(config.read_text())
    for key in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name"):
        if raw.get(key):
            hf_hub_download(text, raw[key], revision=revision)
    return config.parent


def read_config(folder: Path) -> DSMConfig:
    """Parse ``config.json`` (and ``mimi_config_name`` when the config names one)."""
    raw = json.loads((folder / "config.json").read_text())
    mimi = None
    if raw.get("mimi_config_name"):
        mimi = json.loads((folder / raw["mimi_config_name"]).read_text())
    return DSMConfig.from_json(raw, mimi)


# ------------------------------------------------------------------------------------------ names


def fused_alternatives(name: str) -> list[tuple[str, int]] | None:
    """For ``P.in_projs.I.weight`` / ``P.out_projs.I.weight``: the fused names that may hold it,
    with the chunk index I."""
    m = re.fullmatch(r"(.*)\.(in|out)_projs\.(\d+)\.weight", name)
    if m is None:
        return None
    prefix, kind, i = m.group(1), m.group(2), int(m.group(3))
    if kind == "in":
        return [(f"{prefix}.in_proj_weight", i), (f"{prefix}.in_proj.weight", i)]
    return [(f"{prefix}.out_proj.weight", i)]


def mimi_checkpoint_name(model: MimiDecoder, name: str) -> str:
    """Released name of a :class:`MimiDecoder` tensor (except ``codebooks``, built from two)."""
    if name == "proj_first.weight":
        return "quantizer.rvq_first.output_proj.weight"
    if name == "proj_rest.weight":
        return "quantizer.rvq_rest.output_proj.weight"
    if name == "upsample.weight":
        return "upsample.convtr.convtr.convtr.weight"
    if name.startswith("transformer."):
        return "decoder_transformer." + name
    m = re.fullmatch(r"seanet\.(\d+)\.(conv1|conv2)\.(weight|bias)", name)
    if m:
        block = 1 if m.group(2) == "conv1" else 3
        return f"decoder.model.{m.group(1)}.block.{block}.conv.conv.{m.group(3)}"
    m = re.fullmatch(r"seanet\.(\d+)\.(weight|bias)", name)
    if m:
        kind = "convtr.convtr" if isinstance(model.seanet[int(m.group(1))], CausalConvTranspose1d) else "conv.conv"
        return f"decoder.model.{m.group(1)}.{kind}.{m.group(2)}"
    raise KeyError(name)


def codebook_names(n_q: int, n_first: int = 1) -> list[tuple[str, str]]:
    """(embedding_sum, cluster_usage) checkpoint names of the n_q RVQ levels, semantic first."""
    out = []
    for q in range(n_q):
        rvq, j = ("rvq_first", q) if q < n_first else ("rvq_rest", q - n_first)
        base = f"quantizer.{rvq}.vq.layers.{j}._codebook."
        out.append((base + "embedding_sum", base + "cluster_usage"))
    return out


# ------------------------------------------------------------------------------------------ loading


class _Reader:
    """Memory-mapped access to one safetensors file."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        if not path.is_file():
            raise CheckpointError(f"checkpoint file not found: {path}")
        self.path = path
        self._f = safe_open(str(path), framework="pt", device="cpu")
        self.keys = set(self._f.keys())

    def get(self, key: str) -> torch.Tensor:
        return self._f.get_tensor(key)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._f.get_slice(key).get_shape())


def _progress(items: Iterable, desc: str, total: int, show: bool):
    if not show:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, total=total, unit="tensor", leave=False)


def _gather(reader: _Reader, expected: dict[str, torch.Size], to_ckpt: Callable[[str], str],
            cast: Callable[[str, torch.Tensor], torch.Tensor], desc: str, progress: bool,
            ) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Read every expected tensor (by our name) from the file, checking shapes."""
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for name in _progress(list(expected), desc, len(expected), progress):
        shape = tuple(expected[name])
        key = to_ckpt(name)
        if key in reader.keys:
            got = reader.shape(key)
            if got != shape:
                raise CheckpointError(f"{reader.path.name}: {key} has shape {list(got)}, expected {list(shape)}")
            tensor = reader.get(key)
            used.add(key)
        else:
            tensor = None
            for fused, i in fused_alternatives(key) or []:
                if fused in reader.keys:
                    fshape = reader.shape(fused)
                    prefix = key.rsplit(".", 3)[0] + (".in_projs." if ".in_projs." in key else ".out_projs.")
                    mult = sum(1 for n in expected if to_ckpt(n).startswith(prefix))
                    if fshape != (mult * shape[0], *shape[1:]):
                        raise CheckpointError(
                            f"{reader.path.name}: {fused} has shape {list(fshape)}, expected "
                            f"{[mult * shape[0], *shape[1:]]} ({mult} × {key} {list(shape)})")
                    tensor = reader.get(fused).view(mult, *shape)[i]
                    used.add(fused)
                    break
            if tensor is None:
                raise CheckpointError(f"{reader.path.name}: missing key {key} (expected shape {list(shape)})")
        out[name] = cast(name, tensor)
    return out, used


def load_lm(path: Path, cfg: DSMConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
            progress: bool = True) -> DSMLM:
    """Build :class:`DSMLM` from an LM safetensors file (§1.3): weights in ``dtype`` on ``device``,
    ``condition_provider.*`` in fp32."""
    reader = _Reader(Path(path))
    with torch.device("meta"):
        model = DSMLM(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items()}

    def cast(name: str, t: torch.Tensor) -> torch.Tensor:
        target = torch.float32 if name.startswith("condition_provider.") else dtype
        return t.to(device=device, dtype=target)

    sd, used = _gather(reader, expected, lambda n: n, cast, "loading LM", progress)
    _warn_unused(reader, used, LM_IGNORED)
    model.load_state_dict(sd, assign=True)
    return model.eval().requires_grad_(False)


def load_mimi(path: Path, cfg: MimiConfig, device: torch.device | str = "cpu", progress: bool = True) -> MimiDecoder:
    """Build the fp32 :class:`MimiDecoder` from a Mimi safetensors file (§4); the encoder is skipped."""
    reader = _Reader(Path(path))
    with torch.device("meta"):
        model = MimiDecoder(cfg)
    expected = {k: v.shape for k, v in model.state_dict().items() if k != "codebooks"}

    def cast(name: str, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.float32)

    sd, used = _gather(reader, expected, lambda n: mimi_checkpoint_name(model, n), cast, "loading Mimi", progress)
    books = []
    for emb_key, usage_key in codebook_names(cfg.n_q, cfg.n_q_semantic):
        for key, shape in ((emb_key, (cfg.bins, cfg.codebook_dim)), (usage_key, (cfg.bins,))):
            if key not in reader.keys:
                raise CheckpointError(f"{reader.path.name}: missing key {key} (expected shape {list(shape)})")
            if reader.shape(key) != shape:
                raise CheckpointError(f"{reader.path.name}: {key} has shape {list(reader.shape(key))}, "
                                      f"expected {list(shape)}")
            used.add(key)
        emb = reader.get(emb_key).float()
        usage = reader.get(usage_key).float()
        books.append(emb / usage.clamp(min=1e-5)[:, None])
    sd["codebooks"] = torch.stack(books).to(device)
    _warn_unused(reader, used, MIMI_IGNORED)
    model.load_state_dict(sd, assign=True)
    return model.eval().requires_grad_(False)


def _warn_unused(reader: _Reader, used: set[str], ignored: re.Pattern) -> None:
    unused = sorted(k for k in reader.keys - used if not ignored.match(k))
    if unused:
        log.warning("%s: %d unused tensors, e.g. %s", reader.path.name, len(unused), unused[:5])


def save_lm(model: nn.Module, path: Path, fused: bool = False, extra: dict[str, torch.Tensor] | None = None) -> None:
    """Write a :class:`DSMLM` state dict in the released layout (split or fused attention names),
    with ``extra`` tensors a released file holds beside it, in one write."""
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    sd.update(extra or {})
    if fused:
        groups: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for k in list(sd):
            m = re.fullmatch(r"(.*)\.(in|out)_projs\.(\d+)\.weight", k)
            if m:
                fused_key = f"{m.group(1)}.in_proj_weight" if m.group(2) == "in" else f"{m.group(1)}.out_proj.weight"
                groups.setdefault(fused_key, []).append((int(m.group(3)), sd.pop(k)))
        for key, parts in groups.items():
            sd[key] = torch.cat([t for _, t in sorted(parts, key=lambda p: p[0])], dim=0).contiguous()
    save_file(sd, str(path))
