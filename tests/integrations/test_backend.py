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


async def test_a_remote_turn_coalesces_tokens_and_the_worker_speaks_every_word(monkeypatch):
    """An LLM writing 1,000 tokens in about a second: the remote turn sends what has accumulated,
    at most one message per COALESCE_S (not a message per token), and every word is spoken."""
    import re

    from inprocess import ToneEngine
    from myna.integrations import backend as backend_module
    from myna.limits import Limits
    from myna.server.app import Worker
    from myna.bench.soak import serve_in_process

    sent: list[dict] = []
    real_send = backend_module._Connection.send

    async def counting_send(self, message):
        sent.append(message)
        await real_send(self, message)

    monkeypatch.setattr(backend_module._Connection, "send", counting_send)
    text = " ".join(f"word{i}" for i in range(200)) + "."
    tokens = [text[i:i + 1] for i in range(0, len(text))][:1000]
    tokens.append(text[1000:])
    w = Worker(engines={"tone": ToneEngine(word_ms=5.0)}, limits=Limits(max_sessions_per_client=None, offer_rate=None))
    async with serve_in_process(w) as url:
        backend = RemoteBackend(url, credentials=None)
        await backend.start()
        try:
            turn = await backend.open_turn()
            t0 = asyncio.get_running_loop().time()
            for token in tokens:
                await turn.push_text(token)
                await asyncio.sleep(0.001)  # ~1,000 tokens a second
            await turn.end_input()
            words = [i.word async for i in turn if isinstance(i, Word)]
            elapsed = asyncio.get_running_loop().time() - t0
        finally:
            await backend.aclose()
    texts = [m for m in sent if m["type"] == "text"]
    assert "".join(m["text"] for m in texts) == "".join(tokens)
    assert len(texts) <= elapsed / backend_module.COALESCE_S + 2, (len(texts), elapsed)
    assert [m["type"] for m in sent][-1] == "end_turn"
    assert [w.rstrip(".") for w in words] == re.findall(r"word\d+", text)


async def test_cancel_sends_cancel_for_its_own_turn_and_frees_the_connection_even_before_any_text_went_out(
        monkeypatch):
    """``Turn.cancel`` is the contract's ``cancel {turn_id}`` (that turn only), never the
    session-wide ``interrupt``; a turn cancelled before its first coalesced text went out (the
    worker answers ``unknown_turn``) frees its connection too, instead of waiting for a
    ``turn_done`` that cannot come."""
    from inprocess import ToneEngine
    from myna.integrations import backend as backend_module
    from myna.limits import Limits
    from myna.server.app import Worker
    from myna.bench.soak import serve_in_process

    sent: list[dict] = []
    real_send = backend_module._Connection.send

    async def recording_send(self, message):
        sent.append(message)
        await real_send(self, message)

    async def idle_again(backend) -> bool:
        for _ in range(100):
            if backend._idle:
                return True
            await asyncio.sleep(0.02)
        return False

    monkeypatch.setattr(backend_module._Connection, "send", recording_send)
    w = Worker(engines={"tone": ToneEngine()}, limits=Limits(max_sessions_per_client=None, offer_rate=None))
    async with serve_in_process(w) as url:
        backend = RemoteBackend(url, credentials=None)
        await backend.start()
        try:
            turn = await backend.open_turn()  # mid-speech
            await turn.push_text(" ".join(["word"] * 200) + ".")
            await turn.end_input()
            async for item in turn:
                if isinstance(item, Audio):
                    break
            await turn.cancel()
            assert await idle_again(backend)
            assert sent[-1] == {"type": "cancel", "turn_id": turn.turn_id}

            turn = await backend.open_turn()  # before its text left
            await turn.push_text("Never sent.")
            await turn.cancel()
            assert [item async for item in turn] == []
            assert await idle_again(backend)  # the worker's unknown_turn ended it

            turn = await backend.open_turn()
            await turn.push_text("Next.")
            await turn.end_input()
            assert b"".join([i.pcm async for i in turn if isinstance(i, Audio)])
            assert len(backend._all) == 1  # one connection throughout
        finally:
            await backend.aclose()
    assert "interrupt" not in {m["type"] for m in sent}
