"""A LiveKit Agents agent whose TTS is Myna (``myna.integrations.livekit.TTS``).

Two ways to run it (needs the ``livekit`` extra: ``bash scripts/setup.sh livekit``):

1. **Offline, nothing but the embedded voice** (no LiveKit server, no LLM, no API key)::

       python examples/livekit_agent.py wav -o agent.wav
       python examples/livekit_agent.py wav --myna http://127.0.0.1:8080 -o agent.wav  # a running worker

   A real ``AgentSession`` runs the agent with its audio output going to a WAV file instead of
   a room. The agent speaks a reply streamed token by token (~30 tokens/s, like an LLM) with
   ``session.say(<async iterator of tokens>)``: the framework's ``tts_node`` opens
   ``TTS.stream()``, pushes the tokens, and Myna starts speaking before the reply is complete.
   The framework's TTFB metric (``TTSMetrics.ttfb``: first text sent → first audio) is printed.

2. **In a LiveKit room** (needs a LiveKit server and its credentials in ``LIVEKIT_URL``,
   ``LIVEKIT_API_KEY``, ``LIVEKIT_API_SECRET``)::

       python examples/livekit_agent.py dev        # the standard livekit-agents CLI

   The agent joins rooms it is dispatched to and greets each participant. Add your STT, LLM
   and VAD to ``AgentSession(...)`` in :func:`entrypoint` for a full voice agent.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import wave
from collections.abc import AsyncIterator

from myna.extras import require_or_exit

require_or_exit("livekit")  # before the imports below, so a missing extra is one line, not a traceback

from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.metrics import TTSMetrics
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities

from myna.integrations import livekit as myna_livekit

GREETING = ("Hi, this is a LiveKit agent speaking with a Myna voice. The words you hear were streamed "
            "to the speech engine one token at a time, the way a language model writes them.")
TOKENS_PER_S = 30.0


class Assistant(Agent):
    def __init__(self) -> None:
        super().__init__(instructions="You are a helpful voice assistant.")


async def llm_like(text: str) -> AsyncIterator[str]:
    """``text`` as an LLM would stream it: word-sized tokens at :data:`TOKENS_PER_S`."""
    for token in re.findall(r"\S+\s*", text):
        yield token
        await asyncio.sleep(1.0 / TOKENS_PER_S)


class WavOutput(AudioOutput):
    """An agent audio output that writes what the agent says to a WAV file (no pacing)."""

    def __init__(self, path: str, sample_rate: int) -> None:
        super().__init__(label="wav", capabilities=AudioOutputCapabilities(pause=False), sample_rate=sample_rate)
        self._wav = wave.open(path, "wb")
        self._wav.setnchannels(1)
        self._wav.setsampwidth(2)
        self._wav.setframerate(sample_rate)
        self._pushed = 0.0

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        self._wav.writeframes(bytes(frame.data))
        self._pushed += frame.duration

    def flush(self) -> None:
        super().flush()
        self.on_playback_finished(playback_position=self._pushed, interrupted=False)
        self._pushed = 0.0

    def clear_buffer(self) -> None:
        pass

    def close(self) -> None:
        self._wav.close()


async def speak_to_wav(path: str, myna_url: str | None) -> None:
    tts = myna_livekit.TTS(url=myna_url) if myna_url else myna_livekit.TTS()
    tts.prewarm()  # load the voice / open a connection before the first reply

    @tts.on("metrics_collected")
    def on_metrics(metrics: TTSMetrics) -> None:
        print(f"Myna TTFB (LiveKit TTSMetrics.ttfb): {metrics.ttfb * 1000:.0f} ms, "
              f"{metrics.audio_duration:.2f} s of audio")

    session = AgentSession(tts=tts)
    output = WavOutput(path, tts.sample_rate)
    session.output.audio = output
    await session.start(Assistant(), record=False)
    try:
        handle = session.say(llm_like(GREETING))
        await handle.wait_for_playout()
    finally:
        await session.aclose()
        output.close()
        await tts.aclose()
    print(f"wrote {path}")


async def entrypoint(ctx) -> None:
    """Room mode: greet whoever joins, with Myna as the agent's TTS."""
    await ctx.connect()
    session = AgentSession(tts=myna_livekit.TTS())
    await session.start(Assistant(), room=ctx.room)
    session.say(llm_like(GREETING))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "wav":
        parser = argparse.ArgumentParser(description="Speak one streamed reply through an AgentSession into a WAV file.")
        parser.add_argument("-o", "--output", default="agent.wav")
        parser.add_argument("--myna", metavar="URL", help="a running Myna worker (default: the in-process embedded voice)")
        args = parser.parse_args(sys.argv[2:])
        asyncio.run(speak_to_wav(args.output, args.myna))
        return
    from livekit.agents import WorkerOptions, cli

    cli.run_app(WorkerOptions(entrypoint_fnc=entrypoint))


if __name__ == "__main__":
    main()
