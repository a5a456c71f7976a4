"""Optional parts of Myna and the extra that installs each.

The main job (``myna serve`` with the embedded voice) needs only the core dependencies; the DSM
engine (PyTorch, several GB), the framework plug-ins and plotting are extras
(``[project.optional-dependencies]`` in pyproject.toml). Code that needs one calls
:func:`require` first, so a missing extra is one line saying what to install, not a traceback.
"""

from __future__ import annotations

import importlib.util
import sys

#: extra → (what it is for, the top-level modules it provides that Myna imports).
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "dsm": ("the dsm engine (PyTorch)", ("torch", "safetensors", "sentencepiece")),
    "pipecat": ("the Pipecat plug-in", ("pipecat", "loguru")),
    "race": ("racing Pipecat on the race page", ("pipecat", "piper")),
    "livekit": ("Myna in LiveKit rooms (and the LiveKit Agents plug-in)", ("livekit.agents", "livekit.rtc")),
    "bench": ("myna bench soak (and bench ttfa --plot)", ("psutil", "matplotlib")),
    "hub": ("fetching from Hugging Face (Piper voices by name, DSM checkpoints by repo id)", ("huggingface_hub",)),
}


class MissingExtra(ModuleNotFoundError):
    """An optional dependency is not installed; ``str()`` is the one-line install hint.

    Attributes:
        extra: the extra's name in pyproject.toml (``"dsm"``, ``"pipecat"`` …).
    """

    def __init__(self, extra: str, missing: str):
        self.extra = extra
        super().__init__(f"{EXTRAS[extra][0]} needs the '{extra}' extra ({missing} is not installed); "
                         f"install it with `{install_command(extra)}` (or pip install 'myna[{extra}]')", name=missing)


def install_command(extra: str) -> str:
    """The command that installs ``extra`` into a clone's ``.venv`` (scripts/setup.sh)."""
    return f"bash scripts/setup.sh {extra}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken stub in sys.modules
        return False


def require(extra: str) -> None:
    """Check that ``extra``'s modules can be imported (without importing them).

    Raises:
        MissingExtra: the first missing module, with the install hint as its message.
        KeyError: ``extra`` is not one of :data:`EXTRAS`.
    """
    for module in EXTRAS[extra][1]:
        if not _installed(module):
            raise MissingExtra(extra, module)


def extra_for(module: str | None) -> str | None:
    """The extra that provides top-level module ``module`` (``"torch"`` → ``"dsm"``), or None."""
    for extra, (_, modules) in EXTRAS.items():
        if module and any(module == m or module.startswith(m + ".") or m.startswith(module + ".") for m in modules):
            return extra
    return None


def require_or_exit(*extras: str) -> None:
    """:func:`require` for scripts (the examples): print the one-line hint and exit (status 1)."""
    try:
        for extra in extras:
            require(extra)
    except MissingExtra as exc:
        raise SystemExit(f"{sys.argv[0]}: {exc}") from None
