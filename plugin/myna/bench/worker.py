"""The Myna worker a network benchmark starts: ``myna serve`` on loopback, instrumented.

``python -m myna.bench.worker --port P --engines piper,...`` serves exactly what ``myna serve``
does, plus ``GET /bench/engine-stats``: each engine's cumulative synthesis counters
(``compute_stats()``: busy seconds, compute seconds, audio seconds, units), from which a
benchmark derives RTF over an interval. Its phrase cache is off unless ``--phrase-cache-mb`` is
given (a benchmark measures synthesis; ``myna bench ttfa --phrase-cache`` measures the cache).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from myna.cli import DEFAULT_ENGINES

#: The instrumented worker's counters endpoint.
STATS_PATH = "/bench/engine-stats"


def main(argv: list[str] | None = None) -> int:
    from aiohttp import web

    from myna.cli import _add_phrase_cache_options, _engines, _phrase_cache, _run_server
    from myna.rtc.ice import enable_loopback_candidates
    from myna.server.app import Worker, create_app

    p = argparse.ArgumentParser(prog="myna.bench.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--engines", default=DEFAULT_ENGINES)
    p.add_argument("--max-hold-ms", type=float, default=100.0)
    _add_phrase_cache_options(p, default_mb=0.0)  # off: a benchmark measures synthesis unless it asks
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    enable_loopback_candidates()
    cache, warm = _phrase_cache(args)
    worker = Worker(engines=_engines(args.engines), max_hold_ms=args.max_hold_ms, phrase_cache=cache, warm_phrases=warm)
    app = create_app(worker)

    async def engine_stats(request: web.Request) -> web.Response:
        return web.json_response({name: e.compute_stats() for name, e in worker.engines.items() if hasattr(e, "compute_stats")})

    app.router.add_get(STATS_PATH, engine_stats)
    return asyncio.run(_run_server(app, worker, "127.0.0.1", args.port))


if __name__ == "__main__":
    sys.exit(main())
