"""Fixtures of the engine tests."""

from __future__ import annotations

import pytest_asyncio

from myna.engines.piper import PiperEngine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    """The bundled Piper voice, loaded once per module on one synthesis thread (a module that
    tests another engine defines its own ``engine``). Its noise is seeded: what Whisper hears
    of a module's renders is the same on every run."""
    e = PiperEngine(workers=1, seed=0)
    await e.start()
    yield e
    await e.close()
