"""One way to build engines, for every entry point: the engine flags and the engines they make.

``myna serve``, ``say``, ``room``, ``worker``, the benchmark workers and the in-process plug-ins
all build their engines here, so each takes the same flags (:func:`add_engine_arguments`) and
gets the same composition:

- ``--engine a,b,...``: engines to load (:data:`~myna.engines.ENGINE_NAMES`), the first the
  default; the ``piper*`` strategies share one loaded voice and its threads;
- ``--piper-voice FILE.onnx|NAME``: more Piper voices, files or Piper voice names fetched once
  into ``--voice-cache`` (:mod:`myna.engines.piper_hub`);
- ``--voice``: a DSM voice file (``.safetensors``), the DSM engine's default voice; or a voice
  name of the default engine, used by every session that does not choose one;
- ``--dsm-checkpoint``, ``--n-q``, ``--guidance``: the DSM engine's checkpoint and settings;
- ``--fallback ENGINE`` (``--fallback-after-ms``, ``--fallback-stall-ms``): every other engine
  is wrapped in a :class:`~myna.engines.fallback.FallbackEngine` in front of ENGINE (loaded too,
  after the others, when not listed);
- ``--phrase-cache-mb``, ``--phrase-cache-warm``: the phrase cache every engine that takes part
  shares, warmed with common openings before the process is ready.

:func:`build_engines` turns :class:`EngineOptions` into :class:`Engines`: start them, measure,
warm the cache, close them.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from myna.engines import ENGINE_NAMES, Engine
from myna.engines.fallback import AFTER_MS, STALL_MS, FallbackEngine
from myna.engines.phrase_cache import DEFAULT_MB, PhraseCache, read_phrases, warm_up
from myna.extras import require

log = logging.getLogger(__name__)

#: ``myna serve``'s engines: the embedded voice in its three streaming strategies (the race page's lanes).
SERVE_ENGINES = "piper,piper-sentence,piper-whole"


class EngineOptionsError(ValueError):
    """Engine flags that cannot be built (an unknown engine, a fallback with nothing to back,
    DSM without a checkpoint, an unreadable warm-up list); ``str()`` is one line for the user."""


@dataclass
class EngineOptions:
    """What to load (the engine flags, :func:`add_engine_arguments`).

    Attributes:
        engines: engine names, comma-separated; the first is the default.
        voice: a DSM voice file, or a voice name of the default engine (None: the engines' own).
        dsm_checkpoint: DSM checkpoint folder or Hugging Face repo id.
        n_q: DSM codebooks generated (clamped to the model's).
        guidance: DSM CFG-distilled guidance value (None: the model's).
        fallback: engine every other falls back to (None: none).
        fallback_after_ms: a turn's first audio is late this long after its first word (ms).
        fallback_stall_ms: silence mid-turn, while words wait, before the switch (ms).
        phrase_cache_mb: the phrase cache's bound (MB; 0: off).
        phrase_cache_warm: its warm-up list (None: the package's; "none": no warm-up).
        piper_voice: more Piper voices loaded beside the bundled one: files (``.onnx``, with
            their ``.onnx.json``) or Piper voice names (:func:`myna.engines.piper_hub.resolve`).
        voice_cache: the folder Piper voices given by name are fetched into (None:
            :func:`myna.engines.piper_hub.default_cache`).
        lexicon: a pronunciation lexicon file (:mod:`myna.text.lexicon`), made the process's.
        piper_seed: seeds the Piper voices' noise, per sentence (None: a fresh draw on every run).
    """

    engines: str = "piper"
    voice: str | None = None
    dsm_checkpoint: str | None = None
    n_q: int = 32
    guidance: str | None = None
    fallback: str | None = None
    fallback_after_ms: float = AFTER_MS
    fallback_stall_ms: float = STALL_MS
    phrase_cache_mb: float = 0.0
    phrase_cache_warm: str | None = None
    workers: int | None = None
    piper_voice: list[str] | None = None
    voice_cache: str | None = None
    lexicon: str | None = None
    piper_seed: int | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "EngineOptions":
        """The options of a command line parsed with :func:`add_engine_arguments`."""
        return cls(**{name: getattr(args, name) for name in cls.__dataclass_fields__})

    @property
    def names(self) -> list[str]:
        """The engines to load, in order: the listed ones, then the fallback if it is not listed."""
        listed = [n.strip() for n in self.engines.split(",") if n.strip()]
        if self.fallback and self.fallback not in listed:
            listed.append(self.fallback)  # loaded after the others: the first stays the default
        return listed

    @property
    def dsm_voice(self) -> str | None:
        """``voice`` when it names a DSM voice file."""
        return self.voice if self.voice and _is_voice_file(self.voice) else None

    @property
    def voice_name(self) -> str | None:
        """``voice`` when it names a voice of the default engine."""
        return self.voice if self.voice and not _is_voice_file(self.voice) else None


def _piper(options: EngineOptions):
    """The shared Piper engine with the voices ``options`` name (those given by name fetched first).

    Raises:
        EngineOptionsError: a ``--piper-voice`` file or its config is missing or unreadable; a
            voice name is malformed, not on the hub or cannot be fetched.
        MissingExtra: a voice name must be fetched and the ``hub`` extra is not installed.
    """
    from myna.engines.piper import PiperEngine

    files = [_piper_voice_file(voice, options.voice_cache) for voice in options.piper_voice or ()]
    try:
        return PiperEngine(workers=options.workers, more_voices=files, seed=options.piper_seed)
    except ValueError as exc:
        raise EngineOptionsError(f"--piper-voice: {exc}") from None


def _piper_voice_file(voice: str, cache: str | None) -> str:
    """A ``--piper-voice``'s ``.onnx``: the file given (a name ending in ``.onnx`` or with a
    folder in it), else a Piper voice name's file in ``cache``, fetched there if missing."""
    if voice.endswith(".onnx") or "/" in voice or os.sep in voice:
        if not voice.endswith(".onnx") or not Path(voice).is_file() or not Path(f"{voice}.json").is_file():
            raise EngineOptionsError(f"--piper-voice {voice}: needs an existing FILE.onnx with FILE.onnx.json beside it")
        return voice
    from myna.engines.piper import bundled_voice
    from myna.engines.piper_hub import HubVoiceError, resolve

    if voice == bundled_voice()[0].stem:
        raise EngineOptionsError(f"--piper-voice {voice}: that is the bundled voice, loaded already")
    try:
        return str(resolve(voice, cache))
    except HubVoiceError as exc:
        raise EngineOptionsError(f"--piper-voice {exc}") from None


def _is_voice_file(voice: str) -> bool:
    return voice.endswith(".safetensors")  # DSM voices (speaker_wavs) are safetensors files


def add_engine_arguments(parser: argparse.ArgumentParser, *, engines: str | None = "piper",
                         phrase_cache_mb: float = DEFAULT_MB, engines_help: str = "%(default)s",
                         engine_flags: tuple[str, ...] = ("--engine",)) -> None:
    """The engine flags (see the module docstring), with this command's defaults.

    Args:
        engines: the default of ``--engine``.
        phrase_cache_mb: the default of ``--phrase-cache-mb`` (0: off).
        engines_help: what ``--help`` says the default of ``--engine`` is.
        engine_flags: the spellings of ``--engine`` (a command may keep an older one).
    """
    g = parser.add_argument_group("engines (the same flags for every command)")
    g.add_argument(*engine_flags, dest="engines", default=engines, metavar="NAME[,NAME...]",
                   help=f"engines to load, comma-separated; the first is the default ({', '.join(ENGINE_NAMES)}; "
                        f"the piper-* strategies share one loaded voice; default: {engines_help})")
    g.add_argument("--voice", default=None, metavar="NAME_OR_FILE",
                   help="a DSM voice file (.safetensors, speaker_wavs), or a voice name of the default engine for "
                        "sessions that do not choose one (default: the engines' own)")
    g.add_argument("--piper-voice", action="append", default=None, metavar="FILE.onnx|NAME",
                   help="another Piper voice loaded beside the bundled one (repeatable): a file (its FILE.onnx.json "
                        "beside it), named by its stem; or a Piper voice name such as en_GB-alan-medium, fetched once "
                        "from the Hugging Face repo rhasspy/piper-voices (the 'hub' extra; HF_ENDPOINT names another "
                        "hub) into --voice-cache, later loaded from there without a network; a turn or a session "
                        "chooses it by that name")
    g.add_argument("--voice-cache", default=None, metavar="DIR",
                   help="where --piper-voice NAME fetches voices to: plain files in the repo's layout, each .onnx "
                        "beside its .onnx.json, that --piper-voice FILE.onnx also takes, where Hugging Face's own "
                        "cache keeps symlinks in a folder per commit (default: $XDG_CACHE_HOME/myna/voices, "
                        "~/.cache/myna/voices)")
    g.add_argument("--piper-seed", type=_seed, default=None, metavar="N",
                   help="seed the Piper voices' noise, so a text renders the same way whatever was said before it, in "
                        "every process (tests, A/B listening; default: a fresh draw on every run, as Piper does)")
    g.add_argument("--lexicon", metavar="FILE",
                   help="pronunciation lexicon: one 'word = respelling' a line (any case; '#' comments), applied to "
                        "every turn on every engine; captions keep the written word")
    g.add_argument("--dsm-checkpoint", metavar="PATH_OR_REPO", help="DSM TTS checkpoint folder or Hugging Face repo id")
    g.add_argument("--n-q", type=int, default=32, help="DSM codebooks generated (default: %(default)s; clamped to the model's)")
    g.add_argument("--guidance", default=None, metavar="VALUE",
                   help="DSM CFG-distilled guidance value, e.g. 2.0 (default: the model's)")
    g.add_argument("--fallback", metavar="ENGINE", choices=ENGINE_NAMES,
                   help="every other loaded engine falls back to ENGINE (loaded too if not in --engine) when it "
                        "fails, starts late or stalls mid-turn; the rest of the turn is spoken by ENGINE")
    g.add_argument("--fallback-after-ms", type=milliseconds, default=AFTER_MS, metavar="MS",
                   help="switch when a turn's first audio has not come MS after its first word (default: %(default)s)")
    g.add_argument("--fallback-stall-ms", type=milliseconds, default=STALL_MS, metavar="MS",
                   help="silence mid-turn, while words wait, before the switch (default: %(default)s)")
    g.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="Piper synthesis threads shared by every session (default: one per core, each at a lower "
                        "priority than the event loop that paces the packets)")
    g.add_argument("--phrase-cache-mb", type=megabytes, default=phrase_cache_mb, metavar="MB",
                   help="memory bound of the phrase cache (synthesised units kept in memory), MB; 0 turns it off "
                        "(default: %(default)s)")
    g.add_argument("--phrase-cache-warm", metavar="FILE",
                   help="phrases to synthesise into the cache at start-up, one per line, before the process is ready "
                        "(default: the package's list of common openings; 'none': no warm-up)")


def positive_int(value: str) -> int:
    """argparse type: an integer of at least 1."""
    return _whole_number(value, 1)


def _seed(value: str) -> int:
    """argparse type: a noise seed, a whole number of 0 or more (numpy's seeds are)."""
    return _whole_number(value, 0)


def _whole_number(value: str, least: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"{value} is less than {least}")
    return n


def milliseconds(value: str) -> float:
    """argparse type: milliseconds from 0 to 10000."""
    try:
        ms = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of milliseconds: {value!r}") from None
    if not 0.0 <= ms <= 10_000.0:
        raise argparse.ArgumentTypeError("must be from 0 to 10000 ms")
    return ms


def megabytes(value: str) -> float:
    """argparse type: a memory size in MB, 0 (off) or at least one byte."""
    try:
        mb = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of megabytes: {value!r}") from None
    if not (mb == 0.0 or 1e-6 <= mb <= 1_000_000.0):  # a size under one byte would be no cache
        raise argparse.ArgumentTypeError("must be 0 (off) or from 0.000001 (one byte) to 1000000 MB")
    return mb


class Engines:
    """The engines of one process by name (the first is the default), and the phrase cache they share.

    Args:
        engines: loaded (not yet started) engines by name.
        voice: the default engine's voice for sessions that do not choose one (None: its own).
        phrase_cache: shared by the engines that take part (None: off).
        warm_phrases: spoken into the cache by :meth:`warm_up`.
    """

    def __init__(self, engines: dict[str, Engine], *, voice: str | None = None, phrase_cache: PhraseCache | None = None,
                 warm_phrases: list[str] | None = None):
        if not engines:
            raise EngineOptionsError("no engine to load")
        self._engines = dict(engines)
        self.voice = voice
        self.phrase_cache = phrase_cache
        self.warm_phrases = list(warm_phrases or [])

    @classmethod
    def of(cls, engines: "Engines | dict[str, Engine]") -> "Engines":
        """``engines`` as :class:`Engines` (a dict: engines built by hand, e.g. in tests)."""
        return engines if isinstance(engines, Engines) else cls(engines)

    @property
    def default(self) -> str:
        """The default engine's name."""
        return next(iter(self._engines))

    def __getitem__(self, name: str) -> Engine:
        return self._engines[name]

    def __contains__(self, name: object) -> bool:
        return name in self._engines

    def __iter__(self) -> Iterator[str]:
        return iter(self._engines)

    def __len__(self) -> int:
        return len(self._engines)

    def items(self):
        return self._engines.items()

    def values(self):
        return self._engines.values()

    def voice_for(self, name: str) -> str | None:
        """The voice a session of engine ``name`` speaks in when it chooses none."""
        return self.voice if name == self.default else None

    async def start(self) -> None:
        """Load and warm up every engine, in order."""
        for engine in self._engines.values():
            await engine.start()

    async def warm_up(self) -> int:
        """Attach the phrase cache to the engines that take part and fill it (after :meth:`start`;
        a process measures its capacity between the two, without the cache). Returns how many
        engines use it."""
        if self.phrase_cache is None:
            return 0
        return await warm_up(self._engines.values(), self.phrase_cache, self.warm_phrases)

    def breakers(self) -> dict[str, str]:
        """The circuit breaker state of each engine behind one, by name."""
        states = {name: engine.breaker_state() for name, engine in self._engines.items()}
        return {name: state for name, state in states.items() if state is not None}

    async def close(self) -> None:
        for engine in self._engines.values():
            await engine.close()


def build_engines(options: EngineOptions) -> Engines:
    """The engines ``options`` name, composed (strategies sharing one voice, fallbacks, the cache).

    Raises:
        EngineOptionsError: see the class.
        MissingExtra: an engine's extra is not installed (``dsm``), before anything loads.
    """
    from myna.engines.piper import VARIANT_NAMES, PiperEngine

    if options.lexicon:
        from myna.text import lexicon

        try:
            lexicon.use(lexicon.Lexicon.load(options.lexicon))
        except ValueError as exc:
            raise EngineOptionsError(f"--lexicon: {exc}") from None
    names = options.names
    if not names:
        raise EngineOptionsError("--engine names no engine")
    if options.fallback and not set(names) - {options.fallback}:
        raise EngineOptionsError(f"--fallback {options.fallback}: no other engine in --engine to fall back from")
    engines: dict[str, Engine] = {}
    piper = None  # the Piper strategies share one loaded voice and its threads
    for name in names:
        if name not in ENGINE_NAMES:
            raise EngineOptionsError(f"unknown engine {name!r} (available: {', '.join(ENGINE_NAMES)})")
        if name in VARIANT_NAMES:
            piper = piper or _piper(options)
            engines[name] = piper if name == "piper" else piper.variant(name, VARIANT_NAMES[name])
        elif name == "dsm":
            require("dsm")
            from myna.engines.dsm import DSMEngine

            if not options.dsm_checkpoint:
                raise EngineOptionsError("the dsm engine needs --dsm-checkpoint PATH_OR_REPO")
            engines[name] = DSMEngine(options.dsm_checkpoint, voice=options.dsm_voice, n_q=options.n_q,
                                      guidance=options.guidance)
    if options.fallback:
        engines = with_fallback(engines, options.fallback, options.fallback_after_ms, options.fallback_stall_ms)
    if options.dsm_voice and "dsm" not in engines:
        raise EngineOptionsError(f"--voice {options.dsm_voice}: a voice file is the dsm engine's, and --engine does not load it")
    voice = options.voice_name
    default = engines[names[0]]
    if voice is not None and voice not in default.voices:
        raise EngineOptionsError(f"{default.name} has no voice {voice!r}; available: {', '.join(default.voices)}")
    cache, phrases = _phrase_cache(options)
    return Engines(engines, voice=voice, phrase_cache=cache, warm_phrases=phrases)


def with_fallback(engines: dict[str, Engine], fallback: str, after_ms: float = AFTER_MS,
                  stall_ms: float = STALL_MS) -> dict[str, Engine]:
    """``engines`` with every engine but ``fallback`` in a
    :class:`~myna.engines.fallback.FallbackEngine` in front of ``engines[fallback]``."""
    behind = engines[fallback]
    return {name: engine if name == fallback else FallbackEngine(engine, behind, after_ms=after_ms, stall_ms=stall_ms)
            for name, engine in engines.items()}


def _phrase_cache(options: EngineOptions) -> tuple[PhraseCache | None, list[str]]:
    """The phrase cache and its warm-up phrases: ``(None, [])`` when off."""
    if not options.phrase_cache_mb:
        return None, []
    warm = options.phrase_cache_warm
    try:
        phrases = [] if warm == "none" else read_phrases(warm)
    except (OSError, UnicodeDecodeError) as exc:
        raise EngineOptionsError(f"cannot read --phrase-cache-warm {warm}: {getattr(exc, 'strerror', None) or exc}") from None
    return PhraseCache(int(options.phrase_cache_mb * 1e6)), phrases
