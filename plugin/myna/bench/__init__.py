"""Benchmarks behind ``myna bench NAME``: each prints a table and can write JSON.

Each benchmark module exposes ``add_parser(subparsers)``, which registers its sub-command and
sets ``func`` on its parser to a callable taking the parsed ``argparse.Namespace``.
"""

import importlib

#: Benchmark modules in the order ``myna bench --help`` lists them.
BENCHMARKS: list[str] = ["ttfa", "capacity", "dsm_step", "playout", "dsm_loop", "soak", "fallback", "speech", "prepare", "frontend", "race", "phone"]


def add_parsers(subparsers) -> None:
    """Register every benchmark's sub-command on ``subparsers`` (argparse)."""
    for name in BENCHMARKS:
        importlib.import_module(f"myna.bench.{name}").add_parser(subparsers)
