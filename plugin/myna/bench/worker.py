"""The Myna worker a network benchmark starts: ``myna serve`` on loopback, instrumented.

``python -m myna.bench.worker --port P --engine piper,...`` serves exactly what ``myna serve``
does (the same engine and session flags), plus ``GET /bench/engine-stats``: each engine's
cumulative synthesis counters (``compute_stats()``: busy seconds, compute seconds, audio
seconds, units), from which a benchmark derives RTF over an interval. Its phrase cache is off
unless ``--phrase-cache-mb`` is given (a benchmark measures synthesis; ``myna bench ttfa
--phrase-cache`` measures the cache), and it has no limits (a benchmark's clients connect as fast
as they like).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

#: The instrumented worker's counters endpoint.
STATS_PATH = "/bench/engine-stats"


def main(argv: list[str] | None = None) -> int:
    from aiohttp import web

    from myna.cli import run_server
    from myna.engines.build import SERVE_ENGINES, EngineOptions, add_engine_arguments, build_engines, milliseconds
    from myna.rtc.ice import enable_loopback_candidates
    from myna.server.app import Worker, create_app

    p = argparse.ArgumentParser(prog="myna.bench.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-hold-ms", type=milliseconds, default=100.0)
    # (no cache unless asked; --engines: the spelling older builds take, for `myna bench ttfa --compare`)
    add_engine_arguments(p, engines=SERVE_ENGINES, phrase_cache_mb=0.0, engine_flags=("--engine", "--engines"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    enable_loopback_candidates()
    worker = Worker(engines=build_engines(EngineOptions.from_args(args)), max_hold_ms=args.max_hold_ms)
    app = create_app(worker)

    async def engine_stats(request: web.Request) -> web.Response:
        stats = {name: e.compute_stats() for name, e in worker.engines.items()}
        return web.json_response({name: s for name, s in stats.items() if s is not None})

    app.router.add_get(STATS_PATH, engine_stats)
    return asyncio.run(run_server(app, worker, "127.0.0.1", args.port))


if __name__ == "__main__":
    sys.exit(main())
