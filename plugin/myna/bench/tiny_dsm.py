"""Tiny random DSM TTS checkpoints in exactly the released layout (dsm-inference §1, §8.1), for tests
and offline demos: every feature on (demuxed text, cross-attention to a voice, the three
conditioners and the fuser, depformer weight schedule, low-rank embeddings, acoustic delays),
reduced sizes, a tiny voice file and a SentencePiece model trained on the spot.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import torch

from myna.dsm.checkpoint import codebook_names, mimi_checkpoint_name, save_lm
from myna.dsm.config import DSMConfig, MimiConfig
from myna.dsm.lm import DSMLM
from myna.dsm.mimi import MimiDecoder

#: File name of the voice written next to the tiny checkpoint.
TINY_VOICE = "tiny_voice.wav.00000000@0.safetensors"

_CORPUS = """\
The quick brown fox jumps over the lazy dog, while the cat sleeps on the warm mat.
Hello world! This is a tiny voice that speaks in real time over a small network.
A voice agent answers questions: it reads text as the language model writes it.
Numbers like 0 1 2 3 4 5 6 7 8 9 and 10, 25, 80 or 1920 appear now and then.
She sells sea shells by the sea shore; the shells she sells are surely sea shells.
Peter Piper picked a peck of pickled peppers. How many pickled peppers did he pick?
Jack and Jill went up the hill to fetch a pail of water, and Jill came tumbling after.
We test streaming speech synthesis with delayed streams, words, pauses and questions?
Quiet zebras jog by; vexing wizards fix quirky jukeboxes. Xylophones yield zany tunes.
"""


def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Fill a module with random weights, in place on its device, that keep activations near unit
    scale (std 1/sqrt(fan-in); norms near 1). Step time does not depend on the values,
    so this also serves the full-size benchmarks. Deterministic for a seed and device."""
    gens: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for name, p in module.named_parameters():
            gen = gens.get(p.device)
            if gen is None:
                gen = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "alpha" or (leaf == "weight" and p.dim() == 1):
                p.normal_(1.0, 0.1, generator=gen)
            elif leaf == "bias":
                p.normal_(0.0, 0.1, generator=gen)
            elif leaf == "scale":
                p.normal_(0.1, 0.05, generator=gen)
            elif leaf == "learnt_padding":
                p.normal_(0.0, 0.2, generator=gen)
            else:
                fan_in = math.prod(p.shape[1:]) if p.dim() > 1 else p.shape[0]
                if name.endswith("embed.weight") or (p.dim() == 2 and _is_table(name)):
                    fan_in = p.shape[1]
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)


def _is_table(name: str) -> bool:
    return name.startswith(("emb.", "text_emb.weight", "depformer_emb.", "depformer_text_emb.weight"))


def train_tokenizer(path: Path, vocab_size: int) -> None:
    """Write to ``path`` a BPE SentencePiece model trained on a small built-in corpus, with ids 0–3
    reserved (unk, bos, eos, pad) as the TTS text ids expect; at most ``vocab_size`` pieces."""
    import sentencepiece as spm

    buf = io.BytesIO()
    lines = [line for line in _CORPUS.splitlines() if line] * 4
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=3, num_threads=1,
        hard_vocab_limit=False, minloglevel=2)
    path.write_bytes(buf.getvalue())


def _mimi_state(mimi: MimiDecoder, cfg: MimiConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """The Mimi decoder in released names (fused attention weights), plus the encoder-side tensors
    a released file also holds, random."""
    sd: dict[str, torch.Tensor] = {}
    for name, t in mimi.state_dict().items():
        if name == "codebooks":
            continue
        sd[mimi_checkpoint_name(mimi, name)] = t.detach().clone()
    usage = 0.5 + 1.5 * torch.rand(cfg.n_q, cfg.bins, generator=gen)
    books = torch.randn(cfg.n_q, cfg.bins, cfg.codebook_dim, generator=gen)
    for q, (emb_key, usage_key) in enumerate(codebook_names(cfg.n_q, cfg.n_q_semantic)):
        sd[emb_key] = books[q] * usage[q][:, None]
        sd[usage_key] = usage[q].clone()
        sd[emb_key.replace("embedding_sum", "_initialized")] = torch.ones(1)
    fused: dict[str, list[torch.Tensor]] = {}
    for key in [k for k in sd if ".self_attn." in k]:
        kind = "in_proj_weight" if ".in_projs." in key else "out_proj.weight"
        fused.setdefault(key.split(".self_attn.")[0] + ".self_attn." + kind, []).append(sd.pop(key))
    sd.update({k: torch.cat(v, 0) for k, v in fused.items()})

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / math.sqrt(max(1, math.prod(shape[1:])))

    for key in [k for k in sd if k.startswith("decoder_transformer.")]:
        sd["encoder_transformer." + key[len("decoder_transformer."):]] = rnd(*sd[key].shape) if sd[key].dim() > 1 \
            else sd[key].clone()
    d, nf = cfg.dimension, cfg.n_filters
    sd["encoder.model.0.conv.conv.weight"], sd["encoder.model.0.conv.conv.bias"] = rnd(nf, 1, cfg.kernel_size), rnd(nf)
    mult, idx = 1, 1
    for ratio in reversed(cfg.ratios):
        c = mult * nf
        base = f"encoder.model.{idx}.block."
        sd[base + "1.conv.conv.weight"] = rnd(c // cfg.compress, c, cfg.residual_kernel_size)
        sd[base + "1.conv.conv.bias"] = rnd(c // cfg.compress)
        sd[base + "3.conv.conv.weight"] = rnd(c, c // cfg.compress, 1)
        sd[base + "3.conv.conv.bias"] = rnd(c)
        sd[f"encoder.model.{idx + 2}.conv.conv.weight"] = rnd(2 * c, c, 2 * ratio)
        sd[f"encoder.model.{idx + 2}.conv.conv.bias"] = rnd(2 * c)
        idx, mult = idx + 3, mult * 2
    sd[f"encoder.model.{idx + 1}.conv.conv.weight"] = rnd(d, mult * nf, cfg.last_kernel_size)
    sd[f"encoder.model.{idx + 1}.conv.conv.bias"] = rnd(d)
    sd["downsample.conv.conv.conv.weight"] = rnd(d, d, 2 * cfg.upsample_stride)
    for rvq in ("rvq_first", "rvq_rest"):
        sd[f"quantizer.{rvq}.input_proj.weight"] = rnd(cfg.codebook_dim, d, 1)
    return {k: v.contiguous() for k, v in sd.items()}


def build_tiny_checkpoint(out_dir: str | Path, seed: int = 0, *, fused: bool = False,
                          config: DSMConfig | None = None) -> Path:
    """Write a random tiny checkpoint folder and return its path.

    Files: ``config.json`` (released layout, with ``mimi_config_name``), ``mimi_config.json``, the
    LM safetensors (fp32; split ``in_projs.N`` names, or fused ``in_proj_weight`` with
    ``fused=True``), the Mimi safetensors (fused names, encoder included), the SentencePiece model
    and a voice file :data:`TINY_VOICE` (``speaker_wavs`` [1, C, 125]). Deterministic for a seed.
    """
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else DSMConfig.from_name("tiny")
    gen = torch.Generator().manual_seed(seed)

    with torch.device("meta"):  # no default initialisation: randomize() sets every parameter
        lm = DSMLM(cfg)
        mimi = MimiDecoder(cfg.mimi)
    lm = lm.to_empty(device="cpu")
    randomize(lm, seed)
    extra = {}
    if cfg.depformer_low_rank_embeddings and cfg.demux_second_stream:
        # The released file also holds the (unused) low-rank projection of the depformer text embedding.
        extra["depformer_text_emb.low_rank.weight"] = torch.randn(
            cfg.depformer_dim, cfg.depformer_low_rank_embeddings, generator=gen)
    save_lm(lm, out / cfg.files["moshi_name"], fused=fused, extra=extra)
    del lm

    mimi = mimi.to_empty(device="cpu")
    randomize(mimi, seed + 1)
    save_file(_mimi_state(mimi, cfg.mimi, gen), str(out / cfg.files["mimi_name"]))

    if cfg.cross_dim:
        voice = torch.randn(1, cfg.cross_dim, 125, generator=gen)
        save_file({"speaker_wavs": voice}, str(out / TINY_VOICE))

    train_tokenizer(out / cfg.files["tokenizer_name"], cfg.text_card)
    raw = cfg.to_json()
    if "mimi_config_name" not in raw:
        raw["mimi_config_name"] = "mimi_config.json"
    (out / raw["mimi_config_name"]).write_text(json.dumps(cfg.mimi.to_json(), indent=2))
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    return out
