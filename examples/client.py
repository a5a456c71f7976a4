"""Speak a sentence through a running Myna worker and save what came back.

    python examples/client.py --server http://127.0.0.1:8080 "Hello from Myna." -o out.wav

Streams the text as token-sized chunks (like an LLM at 30 tokens/s) over a WebRTC data
channel, records the Opus track, and prints the server and perceived TTFA. Needs only the main
install (``bash scripts/serve.sh`` in another terminal runs the worker). A worker with keys
needs ``--token`` (or ``MYNA_TOKEN``; ``myna token`` mints one).
"""

import argparse
import asyncio
import wave

from myna.rtc.client import MynaClient, wait_until_ready


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text")
    parser.add_argument("--server", default="http://127.0.0.1:8080")
    parser.add_argument("-o", "--output", default="out.wav")
    parser.add_argument("--token-rate", type=float, default=30.0)
    parser.add_argument("--token", default=None, help="access token for a worker with keys (default: env MYNA_TOKEN)")
    args = parser.parse_args()

    try:
        # Fails at once when nothing is listening; waits only while the worker is still loading.
        await wait_until_ready(args.server, timeout=60.0, starting=False)
        async with MynaClient(args.server, token=args.token) as client:
            result = await client.speak(args.text, tokens_per_s=args.token_rate)
    except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
        raise SystemExit(f"client.py: {exc}") from None
    with wave.open(args.output, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48_000)
        w.writeframes(result.pcm.tobytes())
    for event in result.events:
        print(event)
    print(f"server TTFA {_ms(result.server_ttfa_ms)}, perceived TTFA {_ms(result.perceived_ttfa_ms)} -> {args.output}")


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


if __name__ == "__main__":
    asyncio.run(main())
