"""``myna room`` and ``myna worker`` as processes, against a real livekit-server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from livekit import api

from myna.bench.room_client import RoomClient
from myna.bench.livekit_server import DEV_KEY, DEV_SECRET, LiveKitServer, media_address
from tests.e2e.test_serve import SENTENCES
from tests.room.support import Myna, room_name, token

pytestmark = [pytest.mark.network, pytest.mark.asyncio(loop_scope="module")]


async def participants(node, room: str) -> list[str]:
    async with api.LiveKitAPI(node.http_url, DEV_KEY, DEV_SECRET) as lk:
        try:
            answer = await lk.room.list_participants(api.ListParticipantsRequest(room=room))
        except api.TwirpError:
            return []
        return [p.identity for p in answer.participants]


async def test_myna_room_joins_speaks_and_exits_when_the_room_is_deleted(livekit_node):
    room = room_name()
    myna = Myna("room", "--url", livekit_node.url, "--room", room, "--identity", "bot")
    try:
        await myna.wait_for("myna: in room")
        async with RoomClient(livekit_node.url, token(room, "alice"), myna_identity="bot") as client:
            result = await client.speak(SENTENCES[0], tokens_per_s=30)
            assert result.perceived_ttfa_ms is not None and result.events[-1]["type"] == "turn_done"
            async with api.LiveKitAPI(livekit_node.http_url, DEV_KEY, DEV_SECRET) as lk:
                await lk.room.delete_room(api.DeleteRoomRequest(room=room))
        assert await myna.exit_code() == 0
        assert "(ROOM_DELETED)" in myna.output()
    finally:
        myna.stop()


async def test_myna_room_refuses_an_expired_token_and_missing_credentials(livekit_node):
    room = room_name()
    expired = Myna("room", "--url", livekit_node.url, "--room", room, "--token", token(room, "bot", ttl_s=-60))
    assert await expired.exit_code(timeout=60) == 1
    assert "could not join" in expired.output()
    missing = Myna("room", "--url", livekit_node.url, "--room", room, env={"LIVEKIT_API_KEY": ""})
    assert await missing.exit_code() == 1
    assert "set LIVEKIT_API_KEY and LIVEKIT_API_SECRET" in missing.output()


async def test_myna_worker_serves_an_explicit_dispatch_and_leaves_when_the_room_empties(livekit_node):
    worker = Myna("worker", "--url", livekit_node.url, "--agent-name", "myna-cli")
    try:
        await worker.wait_for("registered as agent 'myna-cli'")
        room = room_name()
        async with api.LiveKitAPI(livekit_node.http_url, DEV_KEY, DEV_SECRET) as lk:
            await lk.agent_dispatch.create_dispatch(api.CreateAgentDispatchRequest(agent_name="myna-cli", room=room))
        async with RoomClient(livekit_node.url, token(room, "alice")) as client:
            assert client.myna().attributes["myna.worker"].startswith("AW_")
            result = await client.speak(SENTENCES[3], tokens_per_s=30)
            assert result.perceived_ttfa_ms is not None and result.events[-1]["type"] == "turn_done"
        deadline = time.monotonic() + 20  # LiveKit announces a non-publisher's leave within 3 s
        while await participants(livekit_node, room):
            assert time.monotonic() < deadline, await participants(livekit_node, room)
            await asyncio.sleep(0.2)
        assert "has no one left to speak to" in worker.output()
        assert worker.proc.poll() is None  # the worker keeps serving
    finally:
        assert worker.stop() == 0


async def test_myna_worker_reconnects_after_the_server_dies_mid_turn(tmp_path):
    node = LiveKitServer(node_ip=media_address(), log_dir=tmp_path).start()
    worker = Myna("worker", "--url", node.url, "--agent-name", "myna-re")
    try:
        await worker.wait_for("registered as agent")
        room = room_name()
        async with RoomClient(node.url, token(room, "alice", agent_dispatch="myna-re")) as client:
            await client.start_turn(" ".join(SENTENCES), tokens_per_s=None)
            await client.next_event("first_audio")
            node.kill()
            await worker.wait_for("left room", timeout=90)  # the job ends cleanly
        node.start()  # same ports
        await worker.wait_for("registered as agent", count=2, timeout=90)
        room = room_name()
        async with RoomClient(node.url, token(room, "bob", agent_dispatch="myna-re")) as client:
            result = await client.speak(SENTENCES[2], tokens_per_s=None)
        assert result.perceived_ttfa_ms is not None
    finally:
        worker.stop()
        node.stop()


async def test_without_the_livekit_extra_the_commands_say_what_to_install():
    """No server needed: the commands stop at once with one line."""
    code = ("import sys; sys.modules['livekit.agents'] = None; from myna.cli import main; "
            "sys.exit(main(['room', '--url', 'ws://127.0.0.1:1', '--room', 'r']))")
    done = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "myna: myna room needs the livekit extra (livekit.agents is missing): "
        "bash scripts/setup.sh livekit, or pip install -e '.[livekit]'")
