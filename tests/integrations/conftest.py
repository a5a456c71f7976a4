"""Fixtures for the framework plug-in tests: one in-process engine, one worker on loopback."""

from __future__ import annotations

import pytest
import pytest_asyncio

from myna.engines.piper import PiperEngine


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    """The embedded Piper voice, loaded once per module (~3 s).

    It lives on the module's event loop, which every test of the module shares
    (``pytest.mark.asyncio(loop_scope="module")``): the engine's executor hands results back
    on the loop that submitted a job, so it must not outlive that loop.
    """
    e = PiperEngine(workers=1, seed=0)
    await e.start()
    yield e
    await e.close()


@pytest.fixture(params=["local", pytest.param("remote", marks=pytest.mark.network)])
def mode(request):
    """Run a test in-process and against the session's worker on loopback."""
    return request.param


@pytest.fixture
def myna_kwargs(mode, request, engine):
    """Plug-in constructor arguments for ``mode``."""
    if mode == "local":
        return {"engine": engine}
    return {"url": request.getfixturevalue("worker").url}
