"""Fixtures for myna.dsm: tiny checkpoints built once per session, and the moshi reference
(the oracle; tests that need it skip when it is not installed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from myna.bench.tiny_dsm import build_tiny_checkpoint
from myna.dsm import load
from myna.bench.tiny_dsm import TINY_VOICE

# The reference torch.compiles small kernels lazily unless told not to; compiling on CPU costs
# seconds per kernel and changes nothing we compare.
os.environ.setdefault("NO_TORCH_COMPILE", "1")


@pytest.fixture(scope="session", autouse=True)
def _threads():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """Tiny checkpoint with split attention names (``in_projs.N``)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_split"), seed=0)


@pytest.fixture(scope="session")
def tiny_fused_dir(tmp_path_factory) -> Path:
    """The same weights (same seed) with fused attention names (``in_proj_weight``)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny_fused"), seed=0, fused=True)


@pytest.fixture(scope="session")
def voice_path(tiny_dir) -> Path:
    return tiny_dir / TINY_VOICE


@pytest.fixture(scope="session")
def ours(tiny_dir):
    """Our model, fp32 on CPU."""
    return load(tiny_dir, progress=False)


def _moshi_checkpoint_info(folder: Path):
    """The reference's CheckpointInfo for a local folder (no network)."""
    pytest.importorskip("moshi")
    from moshi.models import loaders

    raw = json.loads((folder / "config.json").read_text())
    return loaders.CheckpointInfo.from_hf_repo(
        "local/none", moshi_weights=folder / raw["moshi_name"], mimi_weights=folder / raw["mimi_name"],
        tokenizer=folder / raw["tokenizer_name"], config_path=folder / "config.json",
        mimi_config_path=folder / raw["mimi_config_name"])


@pytest.fixture(scope="session")
def ref_tts(tiny_dir):
    """The reference TTSModel (moshi 0.2.13), fp32 on CPU, all codebooks."""
    pytest.importorskip("moshi")
    from moshi.models.tts import TTSModel

    info = _moshi_checkpoint_info(tiny_dir)
    n_q = json.loads((tiny_dir / "config.json").read_text())["n_q"]
    return TTSModel.from_checkpoint_info(info, device="cpu", dtype=torch.float32, n_q=n_q)


@pytest.fixture(scope="session")
def ref_info():
    """Function: folder → the reference's CheckpointInfo."""
    return _moshi_checkpoint_info
