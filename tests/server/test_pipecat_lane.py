"""The Pipecat lanes' HTTP routes (myna.server.pipecat_lane): availability, the relay's refusals,
and a real offer relayed to Pipecat's own peer process, answered with its SDP."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from myna.errors import HTTPError
from myna.extras import MissingExtra, require
from myna.server import pipecat_lane
from myna.server.pipecat_lane import add_pipecat_lane


class _Worker:
    """What the routes ask of a worker: its token check, drain and readiness."""

    def __init__(self, ready=True, draining=False, token=None):
        self.ready, self.draining, self.token = ready, draining, token

    def authorize(self, request):
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise HTTPError(401, "unauthorized", "a token is needed")

    def refuse_while_draining(self):
        if self.draining:
            raise HTTPError(503, "draining", "the worker is shutting down; connect to another")


def _peers() -> list:
    """This process's running Pipecat peer children."""
    import psutil

    return [c for c in psutil.Process().children() if c.is_running() and c.status() != psutil.STATUS_ZOMBIE
            and "myna.bench.pipecat_peer" in " ".join(c.cmdline())]


def _app(worker) -> web.Application:
    @web.middleware
    async def errors(request, handler):  # the worker app's JSON errors (myna.server.app)
        try:
            return await handler(request)
        except HTTPError as exc:
            headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else None
            return web.json_response({"error": {"code": exc.code, "message": exc.message}}, status=exc.status,
                                     headers=headers)

    app = web.Application(middlewares=[errors])
    add_pipecat_lane(app, worker, loopback=True)
    return app


async def test_without_pipecat_the_lanes_say_what_installs_them(monkeypatch):
    def missing(extra):
        raise MissingExtra(extra, "piper")

    monkeypatch.setattr(pipecat_lane, "require", missing)
    async with TestClient(TestServer(_app(_Worker()))) as client:
        got = await (await client.get("/api/pipecat")).json()
        assert got["available"] is False and got["error"]["code"] == "no_pipecat"
        assert "bash scripts/setup.sh race" in got["error"]["message"]
        res = await client.post("/api/pipecat/offer", json={"sdp": "", "type": "offer"})
        assert res.status == 404 and (await res.json())["error"]["code"] == "no_pipecat"


@pytest.mark.parametrize("worker, status, code", [
    (_Worker(token="k"), 401, "unauthorized"),
    (_Worker(draining=True), 503, "draining"),
    (_Worker(ready=False), 503, "not_ready"),
])
async def test_an_offer_is_refused_as_the_workers_own_would_be(worker, status, code):
    async with TestClient(TestServer(_app(worker))) as client:
        res = await client.post("/api/pipecat/offer", json={"sdp": "", "type": "offer"})
        assert res.status == status and (await res.json())["error"]["code"] == code


async def test_a_body_that_is_not_an_offer_is_400_and_starts_nothing():
    async with TestClient(TestServer(_app(_Worker()))) as client:
        for body in (b"{", b"[1]"):
            res = await client.post("/api/pipecat/offer", data=body, headers={"Content-Type": "application/json"})
            assert res.status == 400 and (await res.json())["error"]["code"] in ("bad_json", "bad_request")


@pytest.mark.network
@pytest.mark.slow
async def test_an_offer_is_answered_by_pipecats_own_peer_and_the_peer_stops_with_the_worker(monkeypatch):
    """A real aiortc offer through the relay: Pipecat's SmallWebRTC answers it (the peer process
    is started on this first offer), and closing the app stops that process."""
    try:
        require("race")
    except MissingExtra as exc:
        pytest.skip(str(exc))
    from aiortc import RTCPeerConnection

    from myna.rtc.ice import enable_loopback_candidates

    enable_loopback_candidates()
    app = _app(_Worker())
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="recvonly")
        pc.createDataChannel("myna")
        await pc.setLocalDescription(await pc.createOffer())
        async with TestClient(TestServer(app)) as client:
            res = await client.post("/api/pipecat/offer", json={
                "sdp": pc.localDescription.sdp, "type": "offer", "request_data": {"engine": "token"}})
            answer = await res.json()
            assert res.status == 200, answer
            assert answer["type"] == "answer" and "m=audio" in answer["sdp"] and answer.get("pc_id")
            res = await client.post("/api/pipecat/offer", json={"sdp": "", "type": "offer", "request_data": {"engine": "nope"}})
            assert res.status == 400 and (await res.json())["error"]["code"] == "unknown_engine"
            assert _peers(), "the peer process was not started"
            monkeypatch.setattr(pipecat_lane, "MAX_CONNECTIONS", 1)  # the one running pipeline fills it
            res = await client.post("/api/pipecat/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"})
            assert res.status == 503 and (await res.json())["error"]["code"] == "full" and res.headers["Retry-After"]
        assert not _peers(), "the peer process outlived the worker"
    finally:
        await pc.close()


@pytest.mark.slow
async def test_the_peer_process_ends_when_the_worker_does_however_it_ends():
    """The worker holds the peer's stdin: when the worker process ends (a second Ctrl-C exits at
    once, a crash), the pipe closes and the peer stops by itself."""
    try:
        require("race")
    except MissingExtra as exc:
        pytest.skip(str(exc))
    peer = pipecat_lane.PipecatPeer(loopback=True)
    try:
        await peer._running()
        proc = peer._proc
        proc.stdin.close()  # what the worker's death does to the pipe
        await asyncio.wait_for(proc.wait(), 30)
        assert proc.returncode is not None
    finally:
        await peer.close()
