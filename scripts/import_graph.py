"""The import graph of the package, from the source (``ast``, nothing is imported or run).

    python scripts/import_graph.py [--repo DIR] [--tooling MODULE,...] [--json]

Modules are found through pyproject.toml's ``[tool.setuptools] package-dir`` (any layout), and
every ``import`` / ``from ... import`` of a project module counts, at module level or inside a
function (a lazy import is still a dependency). Printed:

- each folder's modules and lines, serving code and tooling apart (tooling: :data:`TOOLING`);
- the arrows between folders (``myna.rtc -> myna.audio: 3`` = three modules of ``rtc`` import
  ``audio``), and how many there are between files;
- import circles between files (strongly connected groups of two or more);
- every import of tooling from serving code (there should be none; the command line,
  :data:`ENTRY_POINTS`, starts ``myna bench`` and is not counted).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

#: Packages that hold tooling (benchmarks, test servers, fault injection, simulators).
TOOLING = ("myna.bench",)
#: The command line, which starts tooling (``myna bench``) as well as serving.
ENTRY_POINTS = ("myna.cli",)


def modules(repo: Path) -> dict[str, Path]:
    """Every project module by dotted name → its file, from pyproject's package-dir."""
    setuptools = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = setuptools.get("package-dir", {})
    found: dict[str, Path] = {}
    for package in setuptools["packages"]:
        base = next((p for p in sorted(roots, key=len, reverse=True) if package == p or package.startswith(p + ".")), None)
        folder = repo / roots[base] / Path(*package[len(base):].lstrip(".").split(".")) if base else repo / Path(*package.split("."))
        for path in sorted(folder.glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` (at ``path``) imports."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
                break  # `from a.b import c`: the most specific module named
    return out


def folder(module: str) -> str:
    """The folder (package) a module's file sits in: ``myna.rtc.track`` → ``myna.rtc``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or module in _PACKAGES else parts[0]


_PACKAGES: set[str] = set()


def is_tooling(module: str, tooling: tuple[str, ...] = TOOLING) -> bool:
    return any(module == t or module.startswith(t + ".") for t in tooling)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def report(repo: Path, tooling: tuple[str, ...] = TOOLING) -> dict:
    """The figures (see the module docstring); ``tooling``: the modules and packages counted as tooling."""
    known = modules(repo)
    _PACKAGES.update(m for m, p in known.items() if p.stem == "__init__")
    graph = {name: imports(name, path, known) for name, path in known.items()}
    lines = {name: len(path.read_text().splitlines()) for name, path in known.items()}
    folders: dict[str, dict] = defaultdict(lambda: {"modules": 0, "lines": 0})
    for name in known:
        f = folders[folder(name)]
        f["modules"] += 1
        f["lines"] += lines[name]
    arrows: dict[tuple[str, str], int] = defaultdict(int)
    for name, targets in graph.items():
        for other in {folder(t) for t in targets} - {folder(name)}:
            arrows[(folder(name), other)] += 1
    serving = sum(n for m, n in lines.items() if not is_tooling(m, tooling))
    tooling_lines = sum(n for m, n in lines.items() if is_tooling(m, tooling))
    return {
        "folders": dict(sorted(folders.items())),
        "lines": {"serving": serving, "tooling": tooling_lines},
        "file_arrows": sum(len(t) for t in graph.values()),
        "folder_arrows": {f"{a} -> {b}": n for (a, b), n in sorted(arrows.items())},
        "circles": circles(graph),
        "serving_imports_tooling": sorted(f"{m} -> {t}" for m, ts in graph.items()
                                          if not is_tooling(m, tooling) and m not in ENTRY_POINTS
                                          for t in ts if is_tooling(t, tooling)),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent, help="checkout to read")
    p.add_argument("--tooling", default=",".join(TOOLING), metavar="MODULE,...",
                   help="modules and packages counted as tooling (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    tooling = tuple(t.strip() for t in args.tooling.split(",") if t.strip())
    r = report(args.repo, tooling)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"lines: {r['lines']['serving']} serving, {r['lines']['tooling']} tooling ({', '.join(tooling)})")
    for name, f in r["folders"].items():
        print(f"  {name:<22} {f['modules']:>3} modules {f['lines']:>6} lines{'  (tooling)' if is_tooling(name, tooling) else ''}")
    print(f"arrows: {r['file_arrows']} between files, {len(r['folder_arrows'])} between folders")
    for arrow, n in r["folder_arrows"].items():
        print(f"  {arrow}: {n}")
    print(f"circles: {len(r['circles'])}")
    for group in r["circles"]:
        print("  " + " <-> ".join(group))
    print(f"serving code importing tooling: {len(r['serving_imports_tooling'])}")
    for line in r["serving_imports_tooling"]:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
