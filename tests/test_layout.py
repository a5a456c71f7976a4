"""The tree as a reader and a tool see it: import paths name files, the package works
from a checkout without an install, serving code imports no tooling, and no file imports itself
round a circle. The graph comes from ``scripts/import_graph.py`` (the source, read with ``ast``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import import_graph  # noqa: E402

#: Run code as from a checkout with no install of Myna: the installed (editable) finder removed
#: (also used by tests/dsm/test_gpu_script.py: the GPU script runs from a checkout).
WITHOUT_INSTALL = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in "
                   "(getattr(f, '__module__', '') or '') and 'editable' not in type(f).__name__.lower()]; ")


def test_every_import_path_names_its_file():
    modules = import_graph.modules(REPO)
    assert "myna.session" in modules and "myna.server.app" in modules and len(modules) > 80
    for name, path in modules.items():
        parts = name.split(".") if path.stem != "__init__" else [*name.split("."), "__init__"]
        assert path.relative_to(REPO).parts[-len(parts):] == (*parts[:-1], parts[-1] + ".py"), (name, path)


def test_the_package_imports_from_a_checkout_without_an_install():
    code = WITHOUT_INSTALL + (
        "import myna.server.app, myna.session, myna.web, importlib.resources as r; "
        "print(myna.server.app.__file__); print(r.files('myna.web').joinpath('index.html').is_file())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": "plugin:server:web", "PATH": ""})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(REPO / "server/myna/server/app.py"), "True"]


def test_serving_code_imports_no_tooling_and_no_file_circles_back():
    report = import_graph.report(REPO)
    assert report["serving_imports_tooling"] == []
    assert report["circles"] == []
    assert report["folder_arrows"]  # the graph is drawn at all
    assert not any(arrow.startswith(("myna.engines ->", "myna.audio ->")) and arrow.endswith(("myna.server", "myna.room"))
                   for arrow in report["folder_arrows"])  # the core does not reach out to a door


def test_commands_other_than_bench_load_no_tooling():
    code = ("import sys; from myna.cli import build_parser; "
            "[build_parser([c]) for c in ('serve', 'say', 'room', 'worker', 'token')]; "
            "print(sorted(m for m in sys.modules if m.startswith('myna.bench')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
