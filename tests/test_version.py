"""``myna.__version__`` has one source, pyproject.toml's ``version``: read from the file in a
checkout (a bumped version shows before any reinstall), from the package metadata once installed
(tests/test_wheel.py)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import myna

REPO = Path(__file__).resolve().parents[1]


def _version_of_a_checkout(root: Path) -> str:
    spec = importlib.util.spec_from_file_location("myna_checkout", root / "plugin" / "myna" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.__version__


def test_a_checkout_says_its_pyprojects_version(tmp_path):
    (tmp_path / "plugin" / "myna").mkdir(parents=True)
    shutil.copy(Path(myna.__file__), tmp_path / "plugin" / "myna" / "__init__.py")
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "myna"\nversion = "9.8.7"\n')
    assert _version_of_a_checkout(tmp_path) == "9.8.7"
    assert _version_of_a_checkout(REPO) == myna.__version__
