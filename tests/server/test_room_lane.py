"""The room lane's HTTP routes (myna.server.room_lane) on a worker without a LiveKit server."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from myna.server.room_lane import add_room_lane


async def test_a_worker_without_a_livekit_url_says_so_and_serves_the_installed_client(tmp_path, monkeypatch):
    bundle = tmp_path / "livekit-client.esm.mjs"
    bundle.write_text("export const Room = 1;")
    monkeypatch.setenv("MYNA_LIVEKIT_CLIENT", str(bundle))
    app = web.Application()
    add_room_lane(app, worker=None, url=None)
    async with TestClient(TestServer(app)) as client:
        got = await client.get("/api/room")
        assert got.status == 200 and await got.json() == {"available": False, "error": {
            "code": "no_livekit", "message": "this worker has no LiveKit server (myna serve --livekit-url URL)"}}
        got = await client.post("/api/room")
        assert got.status == 404 and (await got.json())["error"]["code"] == "no_livekit"
        got = await client.get("/vendor/livekit-client.mjs")
        assert got.status == 200 and await got.text() == "export const Room = 1;"
        assert got.headers["Content-Type"].startswith("text/javascript")
        monkeypatch.setenv("MYNA_LIVEKIT_CLIENT", str(tmp_path / "missing.mjs"))
        got = await client.get("/vendor/livekit-client.mjs")
        assert got.status == 404 and (await got.json())["error"]["code"] == "no_livekit_client"


def test_a_livekit_url_needs_the_api_key_and_secret(monkeypatch):
    import pytest

    monkeypatch.delenv("LIVEKIT_API_KEY", raising=False)
    with pytest.raises(SystemExit, match="LIVEKIT_API_KEY"):
        add_room_lane(web.Application(), worker=None, url="ws://127.0.0.1:7880")


async def test_a_room_request_with_session_defaults_that_break_the_contract_is_400(tmp_path, monkeypatch):
    """The page sends its session defaults ({"phrase_cache": false}) with POST /api/room; a body
    that is not such an object is refused before any room is opened."""
    import types

    bundle = tmp_path / "livekit-client.esm.mjs"
    bundle.write_text("export const Room = 1;")
    monkeypatch.setenv("MYNA_LIVEKIT_CLIENT", str(bundle))
    monkeypatch.setenv("LIVEKIT_API_KEY", "key")
    monkeypatch.setenv("LIVEKIT_API_SECRET", "a-secret-that-is-long-enough-for-livekit-32")
    opened = []
    worker = types.SimpleNamespace(
        authorize=lambda request: None, draining=False, ready=True, default_engine="piper",
        engines=types.SimpleNamespace(voice_for=lambda name: None, __getitem__=None))
    app = web.Application()
    add_room_lane(app, worker=worker, url="ws://127.0.0.1:1")

    async def fake_open(self, defaults=None):
        opened.append(defaults)
        return {"room": "r"}

    monkeypatch.setattr("myna.server.room_lane.RoomLanes.open", fake_open)
    async with TestClient(TestServer(app)) as client:
        for body, code in ((b"{", "bad_json"), (b"[1]", "bad_request"), (b'{"phrase_cache": "no"}', "bad_config")):
            got = await client.post("/api/room", data=body, headers={"Content-Type": "application/json"})
            assert got.status == 400 and (await got.json())["error"]["code"] == code, body
        assert opened == []
        got = await client.post("/api/room", json={"phrase_cache": False})
        assert got.status == 200 and opened[-1].phrase_cache is False
        got = await client.post("/api/room")  # no body: the defaults, cache on
        assert got.status == 200 and opened[-1].phrase_cache is True
