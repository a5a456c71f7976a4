"""Checkpoint loading (myna.dsm.checkpoint, myna.dsm.config, myna.bench.tiny_dsm): fused and split names,
clear errors for a missing key, a wrong shape and a missing voice, the released layout."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from myna.dsm import DSMConfig, load
from myna.dsm.checkpoint import CheckpointError, resolve_checkpoint
from myna.dsm.lm import DSMLM
from myna.dsm.voice import VoiceError


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _edit(folder, file_key, fn):
    cfg = DSMConfig.from_json(json.loads((folder / "config.json").read_text()))
    path = folder / cfg.files[file_key]
    sd = load_file(str(path))
    fn(sd)
    save_file(sd, str(path))


def test_fused_and_split_names_load_the_same(tiny_dir, tiny_fused_dir, ours):
    keys = load_file(str(tiny_fused_dir / "dsm_tts_tiny.safetensors")).keys()
    assert any(k.endswith("in_proj_weight") for k in keys)
    assert not any(".in_projs." in k for k in keys)
    fused = load(tiny_fused_dir, progress=False)
    a, b = ours.lm.state_dict(), fused.lm.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    mimi_keys = load_file(str(tiny_dir / "mimi_tiny.safetensors")).keys()
    assert any(k.endswith("self_attn.in_proj_weight") for k in mimi_keys)  # Mimi ships fused names


def test_bf16_load_keeps_conditioners_fp32(tiny_dir):
    tts = load(tiny_dir, dtype=torch.bfloat16, progress=False)
    assert tts.lm.text_linear.weight.dtype == torch.bfloat16
    assert tts.lm.condition_provider.conditioners["cfg"].embed.weight.dtype == torch.float32
    assert tts.mimi.codebooks.dtype == torch.float32


def test_missing_key_is_named(tiny_dir, tmp_path):
    folder = _copy(tiny_dir, tmp_path)
    _edit(folder, "moshi_name", lambda sd: sd.pop("transformer.layers.1.gating.linear_out.weight"))
    with pytest.raises(CheckpointError, match=r"missing key transformer\.layers\.1\.gating\.linear_out\.weight "
                                              r"\(expected shape \[64, 176\]\)"):
        load(folder, progress=False)


def test_wrong_shape_is_named(tiny_dir, tmp_path):
    folder = _copy(tiny_dir, tmp_path)

    def shrink(sd):
        sd["depformer_in.2.weight"] = sd["depformer_in.2.weight"][:, :10].contiguous()

    _edit(folder, "moshi_name", shrink)
    with pytest.raises(CheckpointError, match=r"depformer_in\.2\.weight has shape \[32, 10\], expected \[32, 64\]"):
        load(folder, progress=False)


def test_wrong_fused_shape_is_named(tiny_fused_dir, tmp_path):
    folder = _copy(tiny_fused_dir, tmp_path)

    def shrink(sd):
        key = "depformer.layers.0.self_attn.in_proj_weight"
        sd[key] = sd[key][:-96].contiguous()

    _edit(folder, "moshi_name", shrink)
    with pytest.raises(CheckpointError, match=r"depformer\.layers\.0\.self_attn\.in_proj_weight has shape"):
        load(folder, progress=False)


def test_mimi_missing_codebook_is_named(tiny_dir, tmp_path):
    folder = _copy(tiny_dir, tmp_path)
    _edit(folder, "mimi_name", lambda sd: sd.pop("quantizer.rvq_rest.vq.layers.2._codebook.cluster_usage"))
    with pytest.raises(CheckpointError, match=r"missing key quantizer\.rvq_rest\.vq\.layers\.2\._codebook"
                                              r"\.cluster_usage"):
        load(folder, progress=False)


def test_missing_voice_is_a_clear_error(ours, tmp_path):
    assert ours.needs_voice
    with pytest.raises(VoiceError, match="needs a voice"):
        ours.synthesize("hello")
    bad = tmp_path / "bad.safetensors"
    save_file({"speaker_wavs": torch.zeros(1, 7, 125)}, str(bad))
    with pytest.raises(VoiceError, match=r"expected \[1, 16, 125\]"):
        ours.synthesize("hello", bad)
    with pytest.raises(VoiceError, match="not found"):
        ours.synthesize("hello", tmp_path / "nope.safetensors")


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="holds no config.json"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="not found"):
        resolve_checkpoint(tmp_path / "does" / "not" / "exist")


def test_config_round_trip_and_presets(tiny_dir):
    raw = json.loads((tiny_dir / "config.json").read_text())
    cfg = DSMConfig.from_json(raw, json.loads((tiny_dir / "mimi_config.json").read_text()))
    assert cfg.to_json() == raw | {"mimi_config_name": raw["mimi_config_name"]}
    big = DSMConfig.from_name("1.6b")
    assert (big.delay_steps, big.max_delay, big.n_slots, big.ff_hidden, big.dep_ff_hidden) == (16, 2, 11, 5632, 2048)
    with torch.device("meta"):
        n = sum(p.numel() for p in DSMLM(big).parameters())
    # The size the spec verified with the reference (§1.2), which also holds the unused
    # depformer_text_emb.low_rank (1024 × 128) that we do not build.
    assert n + 1024 * 128 == 1_836_550_272
    with pytest.raises(ValueError, match="unknown DSM preset"):
        DSMConfig.from_name("huge")


def test_reference_loads_our_layout_strictly(tiny_dir, ref_info):
    """The tiny files are in the released layout: the reference loads them with strict=True."""
    pytest.importorskip("moshi")
    info = ref_info(tiny_dir)
    info.get_moshi(device="cpu", dtype=torch.float32)  # strict load_state_dict inside
    info.get_mimi(device="cpu")
