"""A short soak in the suite: what sessions take is given back (``myna bench soak`` runs the long one)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inprocess import ToneEngine
from myna.bench.soak import idle_cost, serve_in_process, soak_cycles
from myna.server.app import Worker

pytestmark = pytest.mark.network


SOAK_CHILD = """
import asyncio, json, sys
sys.path.insert(0, {tests!r})
from inprocess import ToneEngine
from myna.bench.soak import serve_in_process, soak_cycles
from myna.server.app import Worker

async def main():
    worker = Worker(engines={{"tone": ToneEngine()}})
    async with serve_in_process(worker) as url:
        print(json.dumps(await soak_cycles(worker, url, cycles=100, warmup=20, concurrency=4)))

asyncio.run(main())
"""


@pytest.mark.slow
def test_100_cycles_over_webrtc_and_the_websocket_leave_every_count_at_its_baseline():
    """In a fresh process: the suite's own heap (models, other tests' leftovers) would blur RSS."""
    code = SOAK_CHILD.format(tests=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["failures"] == 0
    assert result["back_to_baseline"] == {"rss": True, "fds": True, "tasks": True, "threads": True,
                                          "peer_connections": True}, (result["baseline"], result["end"])
    assert result["end"]["peer_connections"] == 0
    assert result["rss_growth_mb"] < 10, result


@pytest.mark.slow
async def test_an_idle_session_costs_a_small_fraction_of_a_core():
    """The target is 1 % of a core (``myna bench soak`` reports it: 0.6 % on this machine when
    quiet); CPU time inflates when other work shares the cores (2.12 % once, in a full
    sequential run, where it passes alone), so the suite allows 2.5 %, which still fails the
    3.3-3.7 % an idle session once cost."""
    worker = Worker(engines={"tone": ToneEngine()})
    async with serve_in_process(worker) as url:
        result = await idle_cost(worker, url, sessions=8, seconds=3.0, windows=3)
    assert result["sessions"] == 8
    assert result["cpu_percent_per_session"] <= 2.5, result
