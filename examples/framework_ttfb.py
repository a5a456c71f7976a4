"""TTFB of Myna as each framework measures it, in-process and against a worker on loopback.

- Pipecat: ``TTFBMetricsData`` from ``MynaTTSService`` (first text into ``run_tts`` → first
  audio frame of the context), one pipeline per reply, ``PipelineParams(enable_metrics=True)``.
- LiveKit Agents: ``TTSMetrics.ttfb`` (``_mark_started()`` at the first text sent → first
  audio frame out of the ``AudioEmitter``), one ``stream()`` per reply.

Each reply is pushed as LLM-like token chunks (``myna.rtc.client.token_chunks``) all at once
(an LLM faster than the TTS; use ``--token-rate`` for a paced LLM). The remote mode starts ``myna serve`` on 127.0.0.1 itself.
Like is compared with like: both modes synthesise every reply afresh (the worker runs with
``--phrase-cache-mb 0``; the in-process engine has no phrase cache), so the remote figures differ
from the in-process ones by the transport alone, not by replies served from a cache.
Needs the ``pipecat`` and ``livekit`` extras (``bash scripts/setup.sh pipecat livekit``).
Run it in the loopback-only namespace, e.g.::

    unshare -n sh -c 'ip link set lo up; .venv/bin/python examples/framework_ttfb.py'

Prints a table, p50 / min / max in ms over ``--n`` replies per framework and mode, a row as
each is measured; the frameworks' own logs are kept to warnings (``--verbose``: all of them,
Pipecat's DEBUG lines included). The machine is shared and noisy: compare figures from one run only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import subprocess
import sys
import time
import urllib.request

from myna.engines.piper import PiperEngine
from myna.extras import require_or_exit
from myna.rtc.client import token_chunks

SENTENCES = [
    "The weather today is sunny with a light breeze from the west.",
    "Please remember to bring your notebook to the meeting tomorrow morning.",
    "Our train leaves at seven, so we should pack tonight.",
    "She painted the old fence green and planted roses along it.",
    "Thank you for calling, your order will arrive on Friday.",
]


async def pipecat_ttfb(kwargs: dict, text: str, token_rate: float) -> float:
    from pipecat.frames.frames import LLMFullResponseEndFrame, LLMFullResponseStartFrame, LLMTextFrame, MetricsFrame
    from pipecat.metrics.metrics import TTFBMetricsData
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.tests.utils import SleepFrame, run_test

    from myna.integrations.pipecat import MynaTTSService

    frames = [LLMFullResponseStartFrame()]
    for t in token_chunks(text):
        frames.append(LLMTextFrame(t))
        if token_rate:
            frames.append(SleepFrame(sleep=1.0 / token_rate))
    frames.append(LLMFullResponseEndFrame())
    params = PipelineParams(enable_metrics=True, audio_out_sample_rate=24_000)
    down, _ = await run_test(MynaTTSService(**kwargs), frames_to_send=frames, pipeline_params=params, start_timeout=15)
    values = [d.value for f in down if isinstance(f, MetricsFrame) for d in f.data if isinstance(d, TTFBMetricsData) and d.value]
    return values[0]


async def livekit_ttfb(tts, text: str, token_rate: float) -> float:
    got: list[float] = []
    tts.on("metrics_collected", lambda m: got.append(m.ttfb))
    async with tts.stream() as stream:
        for t in token_chunks(text):
            stream.push_text(t)
            if token_rate:
                await asyncio.sleep(1.0 / token_rate)
        stream.end_input()
        async for _ in stream:
            pass
    await asyncio.sleep(0)
    return got[-1]


def start_worker(port: int) -> subprocess.Popen:
    # No phrase cache, as in process: every reply is synthesised afresh on both sides.
    proc = subprocess.Popen([sys.executable, "-m", "myna.cli", "--log-level", "warning", "serve", "--port", str(port),
                             "--phrase-cache-mb", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("myna serve did not become ready")


def summary(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):7.0f} {min(ms):7.0f} {max(ms):7.0f} {len(ms):4d}"


def quiet_logs() -> None:
    """Warnings and errors only: Pipecat logs through loguru at DEBUG by default (some 50 lines
    per reply), LiveKit Agents and Myna through logging at INFO."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    logging.basicConfig(level=logging.WARNING)


async def main(args) -> None:
    from myna.integrations import livekit as myna_livekit

    texts = [SENTENCES[i % len(SENTENCES)] for i in range(args.n)]
    print(f"TTFB as each framework measures it, ms: {args.n} replies each, "
          f"{f'{args.token_rate:g} tokens/s' if args.token_rate else 'tokens all at once'}, no phrase cache", flush=True)
    print(f"{'framework':9s} {'mode':10s} {'p50':>7s} {'min':>7s} {'max':>7s} {'n':>4s}", flush=True)
    engine = PiperEngine()
    await engine.start()
    worker = start_worker(args.port)
    url = f"http://127.0.0.1:{args.port}"
    try:
        for mode, kwargs in (("in-process", {"engine": engine}), ("remote", {"url": url})):
            values = [await pipecat_ttfb(kwargs, t, args.token_rate) for t in texts]
            print(f"{'pipecat':9s} {mode:10s} {summary(values)}", flush=True)
            tts = myna_livekit.TTS(**kwargs, sample_rate=24_000)
            await livekit_ttfb(tts, "Warm up.", 0)  # loads nothing, but opens the pooled connection
            values = [await livekit_ttfb(tts, t, args.token_rate) for t in texts]
            await tts.aclose()
            print(f"{'livekit':9s} {mode:10s} {summary(values)}", flush=True)
    finally:
        worker.terminate()
        worker.wait()
        await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="TTFB of Myna as Pipecat and LiveKit Agents measure it.")
    parser.add_argument("--n", type=int, default=10, help="replies per framework and mode (default: %(default)s)")
    parser.add_argument("--token-rate", type=float, default=0.0, help="tokens/s of the simulated LLM (0: all at once)")
    parser.add_argument("--port", type=int, default=8091, help="port of the worker started for the remote mode")
    parser.add_argument("--verbose", action="store_true", help="the frameworks' own logs too (Pipecat's DEBUG lines)")
    args = parser.parse_args()
    require_or_exit("pipecat", "livekit")
    if not args.verbose:
        quiet_logs()
    asyncio.run(main(args))
