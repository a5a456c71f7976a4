"""A real phone call: baresip dials LiveKit's SIP service, the call's dispatch rule sends
``myna worker`` into the call's room, and the caller hears what the agent's text says.

Everything is real and on this host, inside the tests' loopback-only namespace: Redis,
``livekit-server``, ``livekit-sip`` (built by ``scripts/setup.sh dev``), Debian's ``baresip``
(:mod:`myna.bench.sip_caller`), ``myna worker``. The agent's side is a LiveKit participant of
kind agent, as an LLM agent is.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
import urllib.request

import pytest
import pytest_asyncio

from myna.bench.livekit_server import find_livekit_server
from myna.bench.livekit_sip import find_livekit_sip, missing_livekit_sip
from myna.bench.phone import AGENT_NAME, PhoneRig, _transcribe
from myna.bench.processes import free_port
from myna.bench.sip_caller import missing_baresip
from myna.bench.wer import word_error_rate
from tests.room.support import ARTIFACTS, Myna

pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

#: Sentences the caller must hear; one is picked per run, so nothing can be tuned to one of them.
SENTENCES = [  # (no numbers: Whisper writes them as digits)
    "Thanks for calling the corner bakery. Your birthday cake is ready, and you can pick it up this afternoon.",
    "Hello, this is the front desk. Your room is ready, and breakfast is served in the garden until noon.",
    "Good morning, this is the pharmacy. Your prescription is ready, and we are open until late tonight.",
]


@pytest.fixture(scope="module")
def rig():
    """Redis, livekit-server, livekit-sip and the phone line's server side."""
    if find_livekit_server() is None or find_livekit_sip() is None:
        message = missing_livekit_sip()
        pytest.fail(message) if shutil.which("go") else pytest.skip(message)
    if (missing := missing_baresip()) is not None:
        pytest.fail(missing)
    ARTIFACTS.mkdir(exist_ok=True)
    rig = PhoneRig(ARTIFACTS).start()
    yield rig
    rig.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(rig):
    """``myna worker`` on the rig's server, with a departure grace period a hang-up must not wait for."""
    await rig.open_line()
    http_port = free_port()
    w = Myna("worker", "--url", rig.node.url, "--agent-name", AGENT_NAME, "--departure-timeout", "30",
             "--http-port", str(http_port))
    w.http_port = http_port
    try:
        await w.wait_for("registered as agent")
        yield w
    finally:
        w.stop()


async def released(w, timeout: float = 5.0) -> bool:
    """Whether the worker's load (livekit-agents refreshes it every 0.5 s) is back to 0 within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{w.http_port}/worker", timeout=5) as r:
            if float(json.loads(r.read()).get("worker_load", 0.0)) == 0.0:
                return True
        await asyncio.sleep(0.1)
    return False


async def test_a_caller_hears_the_agents_text_and_hanging_up_ends_myna_at_once(rig, worker, whisper):
    sentence = random.choice(SENTENCES)
    digits = []
    call = await rig.call(sentence, dtmf="5", on_dtmf=lambda d: digits.append(d.digit))

    heard = _transcribe(whisper, call.heard)
    assert word_error_rate([sentence], [heard]) <= 0.15, heard
    assert call.caller_ttfa_ms is not None and call.listener_ttfa_ms is not None
    # The key the caller pressed reached the agent's side as a room event (LiveKit's SipDTMF).
    assert digits == ["5"]
    # A hang-up is not a listener who may come back: Myna left at once, not after its 30 s grace.
    assert call.gone_ms is not None and call.gone_ms <= 2000, call.gone_ms
    log = worker.output()
    assert f"room '{call.room}': the call with 'sip_caller' ended; leaving" in log
    assert f"left room '{call.room}'" in log
    # Myna joined while the phone rang (the bridge answers once Myna's track is subscribed) and held
    # its audio until the call was up.
    assert log.index(f"room '{call.room}': holding Myna's audio") < log.index(f"room '{call.room}': the call is up")
    # Nothing of the call is left running: the worker counts no room.
    assert await released(worker)


async def test_a_caller_who_hangs_up_mid_reply_stops_it(rig, worker):
    """Hung up while Myna speaks: the turn ends there and Myna leaves (no turn left running)."""
    long_reply = " ".join(SENTENCES * 3)
    call = await rig.call(long_reply, hang_up_after=0.8)
    assert call.gone_ms is not None and call.gone_ms <= 2000, call.gone_ms
    assert f"room '{call.room}': the call with 'sip_caller' ended; leaving" in worker.output()
    assert await released(worker)
