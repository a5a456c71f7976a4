"""Myna: real-time speech for voice agents.

Text arrives in token-sized chunks (from an LLM, over a WebRTC data channel or a WebSocket),
is normalised and cut into words (:mod:`myna.text`), synthesised by a streaming engine
(:mod:`myna.engines`: the embedded Piper voice, or the DSM frame loop of :mod:`myna.dsm`),
paced into 20 ms, 48 kHz frames (:mod:`myna.audio`) and sent as Opus over WebRTC
(:mod:`myna.rtc`). :mod:`myna.server` is the aiohttp worker; ``myna`` is the CLI.
"""

__version__ = "0.1.0"

# In a checkout without an install (PYTHONPATH=plugin:server:web), myna.server and myna.web live in
# server/myna/ and web/myna/: let this package span them (an install maps them in pyproject.toml).
__path__ = __import__("pkgutil").extend_path(__path__, __name__)
