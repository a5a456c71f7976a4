"""Piper voices by name, fetched once from the Hugging Face hub (the ``hub`` extra).

``--piper-voice en_GB-alan-medium`` names a voice of the `rhasspy/piper-voices
<https://huggingface.co/rhasspy/piper-voices>`_ repo, where a voice
``<lang>_<REGION>-<speaker>-<quality>`` is two files,
``<lang>/<lang>_<REGION>/<speaker>/<quality>/<NAME>.onnx`` and its ``.onnx.json``.
:func:`resolve` turns the name into the local ``.onnx``, loaded like any ``--piper-voice FILE.onnx``:

- both files already in the cache folder: that file, without the network (and without the
  extra: an offline restart loads what an earlier run fetched);
- else both are fetched into the cache folder with ``huggingface_hub.hf_hub_download`` (its
  progress bars on stderr, one log line first saying what, from where and how big), from the hub
  that ``HF_ENDPOINT`` names (huggingface.co by default).

The cache folder (:func:`default_cache`, ``--voice-cache``) holds the repo's own layout as plain
files (``DIR/en/en_GB/alan/medium/en_GB-alan-medium.onnx``), each ``.onnx`` beside its
``.onnx.json``: a user can pass them as files, copy or delete them. (Hugging Face's own cache
keeps each file as a symlink in a folder per commit, so a voice's two files fetched across an
update of the repo would not lie side by side.)
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from myna.extras import require

log = logging.getLogger(__name__)

#: The Hugging Face repo of the Piper voices.
REPO = "rhasspy/piper-voices"

#: A Piper voice name: ``<lang>_<REGION>-<speaker>-<quality>``, e.g. ``en_GB-alan-medium``.
NAME = re.compile(r"(?P<lang>[a-z]{2,3})_(?P<region>[A-Z]{2})-(?P<speaker>[A-Za-z0-9_]+)-"
                  r"(?P<quality>x_low|low|medium|high)")


class HubVoiceError(ValueError):
    """A voice name that is malformed, not in :data:`REPO`, or that cannot be fetched (the hub
    unreachable, an HTTP error, the cache folder not writable); ``str()`` is one line that
    starts with the name."""


def repo_path(name: str) -> str:
    """The path of voice ``name``'s ``.onnx`` in :data:`REPO` (``en_GB-alan-medium`` →
    ``en/en_GB/alan/medium/en_GB-alan-medium.onnx``).

    Raises:
        HubVoiceError: ``name`` is not a Piper voice name (:data:`NAME`).
    """
    match = NAME.fullmatch(name)
    if match is None:
        raise HubVoiceError(f"{name}: neither a FILE.onnx nor a Piper voice name LANG_REGION-SPEAKER-QUALITY "
                            "(e.g. en_GB-alan-medium; quality x_low, low, medium or high)")
    lang, region, speaker, quality = match.group("lang", "region", "speaker", "quality")
    return f"{lang}/{lang}_{region}/{speaker}/{quality}/{name}.onnx"


def default_cache() -> Path:
    """The cache folder when none is given: ``$XDG_CACHE_HOME/myna/voices``, by default
    ``~/.cache/myna/voices``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "myna" / "voices"


def resolve(name: str, cache: str | Path | None = None, endpoint: str | None = None) -> Path:
    """The local ``.onnx`` of Piper voice ``name`` (its ``.onnx.json`` beside it), fetched into
    ``cache`` first unless both files are there.

    Args:
        name: a Piper voice name (:data:`NAME`).
        cache: the cache folder (None: :func:`default_cache`); created when a voice is fetched.
        endpoint: the hub's URL (None: huggingface_hub's, ``HF_ENDPOINT`` or https://huggingface.co).

    Raises:
        HubVoiceError: see the class.
        MissingExtra: the voice must be fetched and the ``hub`` extra is not installed.
    """
    path = repo_path(name)
    folder = Path(cache).expanduser() if cache is not None else default_cache()
    model = folder / path
    if model.is_file() and Path(f"{model}.json").is_file():  # (a download lands whole: moved in once complete)
        return model
    require("hub")
    import httpx
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

    where = f"{(endpoint or constants.ENDPOINT).rstrip('/')}/{REPO}"
    try:
        # A HEAD of our own first: it fails at once when the hub cannot be reached, where
        # hf_hub_download retries for about half a minute, and it gives the size for the log line.
        size = get_hf_file_metadata(hf_hub_url(REPO, path, endpoint=endpoint), endpoint=endpoint).size
        log.info("fetching Piper voice %s (%s and its .onnx.json, %s) from %s into %s", name, path,
                 f"{size / 1e6:.1f} MB" if size is not None else "size unknown", where, folder)
        hf_hub_download(REPO, f"{path}.json", local_dir=folder, endpoint=endpoint)
        return Path(hf_hub_download(REPO, path, local_dir=folder, endpoint=endpoint))
    except LocalEntryNotFoundError as exc:  # (the connection lost between our HEAD and the download)
        raise HubVoiceError(f"{name}: cannot fetch it from {where}: {_first_line(exc)}") from None
    except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError):
        raise HubVoiceError(f"{name}: no such voice in {where} (its voices are listed there)") from None
    except HfHubHTTPError as exc:
        raise HubVoiceError(f"{name}: {where} answered HTTP {exc.response.status_code} for {path}") from None
    except (httpx.HTTPError, OfflineModeIsEnabled) as exc:  # (HF_HUB_OFFLINE=1 is the latter)
        raise HubVoiceError(f"{name}: cannot reach {where} ({exc}); a voice is fetched once, later runs "
                            f"load it from {folder} without a network") from None
    except OSError as exc:
        raise HubVoiceError(f"{name}: cannot fetch it into {folder}: {exc.strerror or exc}") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
