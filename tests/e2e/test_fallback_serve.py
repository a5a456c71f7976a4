"""``myna serve --engine dsm --fallback piper`` on a tiny DSM checkpoint: both
engines load, /healthz shows the DSM engine's breaker, and a turn is heard word for word
(by DSM, or by Piper when the tiny model on a busy CPU misses the deadline)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from myna.rtc.client import MynaClient

pytestmark = pytest.mark.network

TEXT = "Thanks for calling, your table is booked."


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_serve_dsm_with_a_piper_fallback(start_worker, tmp_path):
    from myna.bench.tiny_dsm import build_tiny_checkpoint
    from myna.bench.tiny_dsm import TINY_VOICE

    folder = build_tiny_checkpoint(tmp_path / "tiny", seed=0)
    worker = start_worker("--engine", "dsm", "--fallback", "piper", "--dsm-checkpoint", str(folder),
                          "--voice", str(folder / TINY_VOICE), "--max-sessions", "4", timeout=240,
                          env={"NO_TORCH_COMPILE": "1"})
    try:
        status, body = get(f"{worker.url}/healthz")
        health = json.loads(body)
        assert status == 200 and health["engines"] == ["dsm", "piper"] and health["breakers"] == {"dsm": "closed"}

        async def speak():
            async with MynaClient(worker.url) as client:
                return client.ready, await client.speak(TEXT, timeout=120)

        ready, result = asyncio.run(speak())
        assert ready["engine"] == "dsm"
        words = [e["word"] for e in result.events if e["type"] == "word"]
        assert words == ["Thanks", "for", "calling", "your", "table", "is", "booked"]  # each once
        switches = [e for e in result.events if e["type"] == "fallback"]
        assert all(e["from"] == "dsm" and e["to"] == "piper" and e["turn_id"] == result.turn_id for e in switches)
        assert result.event_types()[-1] == "turn_done"
        _, metrics = get(f"{worker.url}/metrics")
        assert 'myna_breaker_state{engine="dsm"}' in metrics
    finally:
        worker.stop()
