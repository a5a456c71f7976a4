"""LiveKit fixtures: a real ``livekit-server`` (one node, or two sharing Redis) on this host.

The server comes from ``scripts/setup.sh dev`` (``go install`` of v1.13.5 into ``.lk/bin``).
Where Go is present the server must be too: these tests fail rather than skip. Where Go is
missing they skip and say what to install. Media uses a veth pair inside the test namespace
(libwebrtc ignores loopback; see myna.bench.livekit_server).
"""

from __future__ import annotations

import shutil

import pytest
import pytest_asyncio

from myna.bench.livekit_server import (LiveKitServer, RedisServer, find_livekit_server, isolated_namespace, media_address,
                                   missing_livekit_server)
from tests.room.support import ARTIFACTS


def _require_server() -> None:
    if find_livekit_server() is None:
        if shutil.which("go"):
            pytest.fail(missing_livekit_server())
        pytest.skip(missing_livekit_server())
    if not isolated_namespace():
        pytest.fail("LiveKit tests must run in a loopback-only namespace: use `bash scripts/test.sh`")


@pytest.fixture(scope="session")
def livekit_node():
    """One livekit-server node with the dev key pair, ready."""
    _require_server()
    ARTIFACTS.mkdir(exist_ok=True)
    node = LiveKitServer(node_ip=media_address(), log_dir=ARTIFACTS).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def livekit_cluster():
    """Two livekit-server nodes sharing one Redis (multi-node routing), ready."""
    _require_server()
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `bash scripts/setup.sh dev` (apt-get install redis-server)")
    ARTIFACTS.mkdir(exist_ok=True)
    redis = RedisServer(log_dir=ARTIFACTS).start()
    nodes = []
    try:
        ip = media_address()
        nodes = [LiveKitServer(node_ip=ip, redis=redis, log_dir=ARTIFACTS).start() for _ in range(2)]
        yield nodes
    finally:
        for node in nodes:
            node.stop()
        redis.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine():
    """The embedded Piper voice, loaded once per module on the module's loop."""
    from myna.engines.piper import PiperEngine

    e = PiperEngine(workers=1, seed=0)
    await e.start()
    yield e
    await e.close()
