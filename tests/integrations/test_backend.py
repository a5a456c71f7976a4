"""The plug-ins' shared backends: errors surface as MynaError with the contract's codes."""

from __future__ import annotations

import asyncio
import socket

import pytest

from inprocess import app_client
from myna.integrations.backend import Audio, MynaError, RemoteBackend, Word, create_backend

pytestmark = pytest.mark.network


async def test_remote_settings_the_worker_rejects_fail_at_start():
    async with app_client() as worker:  # tone engine, in this process
        for kwargs, code in (({"engine_name": "nope"}, "unknown_engine"), ({"voice": "nobody"}, "unknown_voice")):
            backend = RemoteBackend(str(worker.make_url("/")), **kwargs)
            with pytest.raises(MynaError) as err:
                await backend.start()
            assert err.value.code == code
            await backend.aclose()


async def test_an_unreachable_worker_is_a_connection_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = RemoteBackend(f"http://127.0.0.1:{port}")
    with pytest.raises(MynaError) as err:
        await backend.start()
    assert err.value.code == "connection_failed"
    await backend.aclose()


async def test_a_cancelled_remote_turn_frees_its_connection_for_the_next(worker):
    backend = create_backend(url=worker.url, sample_rate=16_000)
    await backend.start()
    try:
        turn = await backend.open_turn()
        await turn.push_text("This sentence is long enough to still be speaking, when it is cut off by the caller. ")
        await turn.end_input()
        async for item in turn:
            assert isinstance(item, (Audio, Word))
            if isinstance(item, Audio):
                break
        await turn.cancel()
        for _ in range(100):  # the worker confirms with turn_done(interrupted); then it is idle
            if backend._idle:
                break
            await asyncio.sleep(0.02)
        turn = await backend.open_turn()
        await turn.push_text("Next.")
        await turn.end_input()
        audio = b"".join([i.pcm async for i in turn if isinstance(i, Audio)])
        assert len(audio) / 2 / 16_000 > 0.2
        assert len(backend._all) == 1  # one connection, reused
    finally:
        await backend.aclose()
