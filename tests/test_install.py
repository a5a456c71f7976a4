"""The light install: the main job, ``pip install -e .`` with no extra, pulls no PyTorch.

Checked offline from the installed packages' metadata: what ``pip install -e .`` resolves is the
closure of pyproject.toml's core dependencies. ``tests/test_cli.py`` runs ``myna serve`` with
PyTorch unimportable; a fresh venv install was timed by hand (README quick start).
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement

from myna.extras import EXTRAS

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DSM_ONLY = {"torch", "safetensors", "sentencepiece", "tqdm", "triton"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements: list[str]) -> set[str]:
    """Every distribution (normalised name) that installing ``requirements`` brings in,
    following the installed packages' own requirements (extras and environment markers
    evaluated as pip does)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (_key(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            continue  # not installed here, so nothing further to follow
        for raw in dist.requires or []:
            sub = Requirement(raw)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in sorted(req.extras) or [""]):
                todo.append(sub)
    return {name for name, _ in seen}


def test_the_core_install_pulls_no_pytorch():
    core = closure(PYPROJECT["project"]["dependencies"])
    assert "piper-tts" in core and "aiortc" in core  # the walk follows real requirements
    assert not core & DSM_ONLY, sorted(core & DSM_ONLY)
    assert not any(name.startswith("nvidia-") for name in core)


def test_the_dsm_extra_carries_pytorch():
    dsm = closure(PYPROJECT["project"]["optional-dependencies"]["dsm"])
    assert {"torch", "safetensors", "sentencepiece"} <= dsm


def test_every_extra_the_code_names_exists_in_pyproject():
    declared = set(PYPROJECT["project"]["optional-dependencies"])
    assert set(EXTRAS) <= declared, set(EXTRAS) - declared


def test_tooling_only_dependencies_are_not_in_the_core_install():
    """psutil serves the soak benchmark alone: it comes with the bench extra, not the main job."""
    assert "psutil" not in {_key(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    assert "psutil" in {_key(Requirement(r).name) for r in PYPROJECT["project"]["optional-dependencies"]["bench"]}
    assert "psutil" in EXTRAS["bench"][1]
