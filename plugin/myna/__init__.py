"""Myna: real-time speech for voice agents.

Text arrives in token-sized chunks (from an LLM) through one of four doors: a WebRTC data
channel (:mod:`myna.server.webrtc`), a WebSocket (:mod:`myna.server.tts_stream`), a LiveKit room
(:mod:`myna.room`) or an in-process plug-in (:mod:`myna.integrations`). Every door hands typed
messages (:mod:`myna.messages`) to the same core, a :class:`~myna.session.Session` opened from
the process's :class:`~myna.sessions.Sessions`: the text is normalised and cut into words
(:mod:`myna.text`), synthesised by a streaming engine (:mod:`myna.engines`, built by
:mod:`myna.engines.build`: the embedded Piper voice, or the DSM frame loop of :mod:`myna.dsm`),
and queued on the door's output (:mod:`myna.audio`: paced 20 ms, 48 kHz frames for a track,
or PCM as it is made); typed events (:mod:`myna.events`) go back to the door. ``myna`` is the
CLI; :mod:`myna.bench` is tooling (benchmarks, test servers, fault injection).
"""


def __getattr__(name: str):
    """``myna.__version__``: pyproject.toml's ``version``, its one source: read from the file when
    this package runs from a checkout (so a bumped version shows before any reinstall), else from
    the installed distribution's metadata; read on first use (importlib.metadata costs tens of ms,
    which a plain ``import myna`` does not pay)."""
    if name == "__version__":
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        if pyproject.is_file():
            import tomllib

            value = tomllib.loads(pyproject.read_text())["project"]["version"]
        else:
            from importlib.metadata import PackageNotFoundError, version

            try:
                value = version("myna")
            except PackageNotFoundError:
                value = "0+unknown"
        globals()["__version__"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# In a checkout without an install (PYTHONPATH=plugin:server:web), myna.server and myna.web live in
# server/myna/ and web/myna/: let this package span them (an install maps them in pyproject.toml).
__path__ = __import__("pkgutil").extend_path(__path__, __name__)
