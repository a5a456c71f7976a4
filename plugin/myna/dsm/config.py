"""Model configuration: :class:`DSMConfig` (the LM, its conditioners and the TTS settings) and
:class:`MimiConfig` (the codec), with named presets and derived sizes computed in
``__post_init__`` (gpt-fast style).

The field names are the keys of the released ``config.json`` (``kyutai/tts-1.6b-en_fr``,
dsm-inference §1.1–1.2), so ``DSMConfig.from_json(json.load(...))`` reads a released config and
``to_json()`` writes one in the same layout.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

#: Keys of a released config.json that are file names or bookkeeping, not model sizes (§1.1).
FILE_KEYS = ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "lora_name")


def _default_mimi_json() -> dict[str, Any]:
    """The released Mimi codec configuration, in the reference's config layout (§4)."""
    return {
        "sample_rate": 24000,
        "channels": 1,
        "frame_rate": 12.5,
        "seanet": {
            "channels": 1, "dimension": 512, "causal": True, "n_filters": 64,
            "n_residual_layers": 1, "activation": "ELU", "compress": 2, "dilation_base": 2,
            "disable_norm_outer_blocks": 0, "kernel_size": 7, "residual_kernel_size": 3,
            "last_kernel_size": 3, "norm": "none", "pad_mode": "constant",
            "ratios": [8, 6, 5, 4], "true_skip": True,
        },
        "quantizer": {
            "dimension": 256, "n_q": 32, "bins": 2048, "input_dimension": 512,
            "output_dimension": 512,
        },
        "transformer": {
            "d_model": 512, "num_heads": 8, "num_layers": 8, "causal": True, "layer_scale": 0.01,
            "context": 250, "conv_layout": True, "max_period": 10000, "gating": "none",
            "norm": "layer_norm", "positional_embedding": "rope", "dim_feedforward": 2048,
            "input_dimension": 512, "output_dimensions": [512],
        },
    }


@dataclass
class MimiConfig:
    """Sizes of the Mimi decoder path (dsm-inference §4). Only the decode path is built.

    ``frame_size`` (samples per 80 ms frame, 1920 at 24 kHz) and ``upsample_stride`` (2: the
    transformer runs at 25 Hz) are derived.
    """

    sample_rate: int = 24000
    frame_rate: float = 12.5
    dimension: int = 512
    n_filters: int = 64
    ratios: list[int] = field(default_factory=lambda: [8, 6, 5, 4])
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    compress: int = 2
    codebook_dim: int = 256
    n_q: int = 32
    bins: int = 2048
    n_q_semantic: int = 1
    tr_dim: int = 512
    tr_heads: int = 8
    tr_layers: int = 8
    tr_ff: int = 2048
    tr_context: int = 250
    tr_max_period: float = 10000.0
    # derived
    hop_length: int = 0
    frame_size: int = 0
    upsample_stride: int = 0

    def __post_init__(self) -> None:
        self.hop_length = math.prod(self.ratios)
        self.frame_size = int(round(self.sample_rate / self.frame_rate))
        encoder_rate = self.sample_rate / self.hop_length
        stride = encoder_rate / self.frame_rate
        if stride != int(stride) or self.frame_size != self.hop_length * int(stride):
            raise ValueError(f"Mimi config: hop {self.hop_length} and frame rate {self.frame_rate} "
                             "do not give an integer upsampling stride")
        self.upsample_stride = int(stride)
        if self.tr_dim != self.dimension:
            raise NotImplementedError("Mimi transformer with input/output projections is not supported")

    @classmethod
    def from_json(cls, cfg: dict[str, Any]) -> "MimiConfig":
        """Read the reference's Mimi config dict (``seanet``/``quantizer``/``transformer``)."""
        s, q, t = cfg["seanet"], cfg["quantizer"], cfg["transformer"]
        unsupported = []
        if s.get("n_residual_layers", 1) != 1:
            unsupported.append("seanet.n_residual_layers != 1")
        if not s.get("true_skip", True):
            unsupported.append("seanet.true_skip = false")
        if s.get("activation", "ELU") != "ELU":
            unsupported.append(f"seanet.activation = {s.get('activation')}")
        if s.get("pad_mode", "constant") != "constant":
            unsupported.append(f"seanet.pad_mode = {s.get('pad_mode')}")
        if s.get("norm", "none") != "none":
            unsupported.append("seanet.norm (weight norm must be folded)")
        if t.get("gating", "none") != "none" or t.get("norm", "layer_norm") != "layer_norm":
            unsupported.append("Mimi transformer gating/norm")
        if t.get("positional_embedding", "rope") != "rope":
            unsupported.append("Mimi transformer positional embedding")
        if unsupported:
            raise NotImplementedError("Unsupported Mimi config: " + ", ".join(unsupported))
        return cls(
            sample_rate=int(cfg["sample_rate"]), frame_rate=float(cfg["frame_rate"]),
            dimension=s["dimension"], n_filters=s["n_filters"], ratios=list(s["ratios"]),
            kernel_size=s["kernel_size"], last_kernel_size=s["last_kernel_size"],
            residual_kernel_size=s["residual_kernel_size"], compress=s["compress"],
            codebook_dim=q["dimension"], n_q=q["n_q"], bins=q["bins"],
            tr_dim=t["d_model"], tr_heads=t["num_heads"], tr_layers=t["num_layers"],
            tr_ff=t["dim_feedforward"], tr_context=t["context"],
            tr_max_period=float(t.get("max_period", 10000)),
        )

    def to_json(self) -> dict[str, Any]:
        """The reference's Mimi config dict for these sizes (what ``mimi_config.json`` holds)."""
        cfg = _default_mimi_json()
        cfg["sample_rate"], cfg["frame_rate"] = self.sample_rate, self.frame_rate
        cfg["seanet"].update(dimension=self.dimension, n_filters=self.n_filters, ratios=list(self.ratios),
                             kernel_size=self.kernel_size, last_kernel_size=self.last_kernel_size,
                             residual_kernel_size=self.residual_kernel_size, compress=self.compress)
        cfg["quantizer"].update(dimension=self.codebook_dim, n_q=self.n_q, bins=self.bins,
                                input_dimension=self.dimension, output_dimension=self.dimension)
        cfg["transformer"].update(d_model=self.tr_dim, num_heads=self.tr_heads, num_layers=self.tr_layers,
                                  dim_feedforward=self.tr_ff, context=self.tr_context,
                                  max_period=self.tr_max_period, input_dimension=self.dimension,
                                  output_dimensions=[self.dimension])
        return cfg


#: config.json keys this port does not model, with the values under which ignoring them is exact.
_EXTRA_ALLOWED: dict[str, tuple] = {
    "depformer_gating": ("silu", None), "depformer_layer_scale": (None,), "depformer_norm": (None,),
    "depformer_causal": (True, None), "kv_repeat": (1, None), "depformer_kv_repeat": (1, None),
    "norm_emb": (False, None), "bias_proj": (False, None), "same_initial": (False, None),
}


def _schedule_1p6b() -> list[int]:
    return list(range(8)) + [8] * 8 + [9] * 8 + [10] * 8


def _conditioners_1p6b(dim: int, voice_dim: int = 512, cfg_dim: int = 16) -> dict[str, Any]:
    return {
        "speaker_wavs": {"type": "tensor", "tensor": {"dim": voice_dim}},
        "cfg": {"type": "lut", "lut": {"n_bins": 7, "dim": cfg_dim, "tokenizer": "noop",
                                       "possible_values": ["1.0", "1.5", "2.0", "2.5", "3.0", "3.5", "4.0"]}},
        "control": {"type": "lut", "lut": {"n_bins": 1, "dim": dim, "tokenizer": "noop",
                                           "possible_values": ["ok"]}},
    }


def _fuser_1p6b() -> dict[str, Any]:
    return {"sum": ["control", "cfg"], "cross": ["speaker_wavs"], "prepend": [],
            "cross_attention_pos_emb": True, "cross_attention_pos_emb_scale": 1}


@dataclass
class DSMConfig:
    """Hyper-parameters of a DSM TTS checkpoint (dsm-inference §1.2), plus derived sizes.

    Streams: 0 is text, 1..n_q are Mimi codebooks (1 = semantic). ``delays`` has ``n_q + 1``
    entries. Derived in ``__post_init__``: ``head_dim``, ``ff_hidden`` (gated FFN width,
    2·ff//3, §7.4), ``dep_ff_hidden``, ``n_slots`` (depformer weight sets), ``delay_steps``
    (text-to-audio delay in frames, int(audio_delay·frame_rate) = 16 for 1.6b), ``max_delay``,
    ``text_in_card`` (text vocabulary + initial token, also the mux base 8001).
    """

    card: int = 2048
    n_q: int = 32
    dep_q: int = 32
    delays: list[int] = field(default_factory=lambda: [0, 0] + [2] * 31)
    dim: int = 2048
    text_card: int = 8000
    text_card_out: int | None = None
    existing_text_padding_id: int = 3
    num_heads: int = 16
    num_layers: int = 16
    hidden_scale: float = 4.125
    causal: bool = True
    layer_scale: float | None = None
    context: int = 500
    max_period: float = 10000.0
    gating: str = "silu"
    norm: str = "rms_norm_f32"
    positional_embedding: str = "rope"
    depformer_dim: int = 1024
    depformer_num_heads: int = 16
    depformer_num_layers: int = 4
    depformer_dim_feedforward: int | None = 3072
    depformer_multi_linear: bool = True
    depformer_pos_emb: str = "none"
    depformer_weights_per_step: bool = True
    depformer_weights_per_step_schedule: list[int] | None = field(default_factory=_schedule_1p6b)
    depformer_low_rank_embeddings: int | None = 128
    demux_second_stream: bool = True
    cross_attention: bool = True
    conditioners: dict[str, Any] = field(default_factory=lambda: _conditioners_1p6b(2048))
    fuser: dict[str, Any] = field(default_factory=_fuser_1p6b)
    # TTS settings (config.json "tts_config" / "model_id").
    audio_delay: float = 1.28
    second_stream_ahead: int = 2
    max_speakers: int = 5
    model_id: dict[str, Any] = field(default_factory=lambda: {"sig": "1e68beda", "epoch": 240})
    files: dict[str, str] = field(default_factory=lambda: {
        "moshi_name": "dsm_tts_1e68beda@240.safetensors",
        "mimi_name": "tokenizer-e351c8d8-checkpoint125.safetensors",
        "tokenizer_name": "tokenizer_spm_8k_en_fr_audio.model",
    })
    mimi: MimiConfig = field(default_factory=MimiConfig)
    # Keys of config.json this port does not use, kept so to_json() round-trips.
    extra: dict[str, Any] = field(default_factory=dict)
    # derived
    head_dim: int = 0
    ff_hidden: int = 0
    dep_head_dim: int = 0
    dep_ff_hidden: int = 0
    n_slots: int = 0
    schedule: list[int] = field(default_factory=list)
    delay_steps: int = 0
    max_delay: int = 0
    text_in_card: int = 0
    text_out_card: int = 0

    def __post_init__(self) -> None:
        if len(self.delays) != self.n_q + 1:
            raise ValueError(f"delays has {len(self.delays)} entries, expected n_q + 1 = {self.n_q + 1}")
        if self.dep_q != self.n_q:
            raise NotImplementedError(f"dep_q ({self.dep_q}) != n_q ({self.n_q}): only TTS layouts are supported")
        unsupported = []
        if self.norm not in ("rms_norm_f32", "rms_norm"):
            unsupported.append(f"norm={self.norm}")
        if self.gating != "silu":
            unsupported.append(f"gating={self.gating}")
        if self.positional_embedding != "rope":
            unsupported.append(f"positional_embedding={self.positional_embedding}")
        if self.depformer_pos_emb != "none":
            unsupported.append(f"depformer_pos_emb={self.depformer_pos_emb}")
        if self.layer_scale is not None:
            unsupported.append("layer_scale")
        if not self.depformer_multi_linear or not self.depformer_weights_per_step:
            unsupported.append("depformer without multi_linear / weights_per_step")
        if not self.causal:
            unsupported.append("causal=false")
        for key, allowed in _EXTRA_ALLOWED.items():
            if key in self.extra and self.extra[key] not in allowed:
                unsupported.append(f"{key}={self.extra[key]!r}")
        if unsupported:
            raise NotImplementedError("Unsupported DSM config: " + ", ".join(unsupported))
        self.head_dim = self.dim // self.num_heads
        self.ff_hidden = _gated_hidden(self.dim, int(self.hidden_scale * self.dim))
        dep_ff = self.depformer_dim_feedforward
        if dep_ff is None:
            dep_ff = int(self.hidden_scale * self.depformer_dim)
        self.dep_head_dim = self.depformer_dim // self.depformer_num_heads
        self.dep_ff_hidden = _gated_hidden(self.depformer_dim, dep_ff)
        sched = self.depformer_weights_per_step_schedule
        self.schedule = list(sched) if sched is not None else list(range(self.dep_q))
        if len(self.schedule) != self.dep_q:
            raise ValueError(f"weights schedule has {len(self.schedule)} entries, expected dep_q = {self.dep_q}")
        self.n_slots = max(self.schedule) + 1
        self.delay_steps = int(self.audio_delay * self.mimi.frame_rate)
        self.max_delay = max(self.delays)
        self.text_in_card = self.text_card + 1
        self.text_out_card = self.text_card if self.text_card_out is None else self.text_card_out

    @property
    def norm_eps(self) -> float:
        """RMSNorm epsilon: 1e-8 for ``rms_norm_f32``, 1e-5 for ``rms_norm`` (§7.1)."""
        return 1e-8 if self.norm == "rms_norm_f32" else 1e-5

    @property
    def cross_dim(self) -> int:
        """Width of the raw voice tensor (``speaker_wavs`` dim, 512 for 1.6b), 0 if none."""
        c = self.conditioners.get("speaker_wavs")
        return int(c["tensor"]["dim"]) if c else 0

    @classmethod
    def from_name(cls, name: str) -> "DSMConfig":
        """A named preset: ``"1.6b"`` (released sizes), ``"small"`` (CPU benchmark) or ``"tiny"`` (tests)."""
        try:
            return copy.deepcopy(PRESETS[name])
        except KeyError:
            raise ValueError(f"unknown DSM preset {name!r}; choose one of {sorted(PRESETS)}") from None

    @classmethod
    def from_json(cls, raw: dict[str, Any], mimi: dict[str, Any] | None = None) -> "DSMConfig":
        """Build from a released ``config.json`` dict (§1.1); ``mimi`` is an optional Mimi config dict."""
        raw = dict(raw)
        kw: dict[str, Any] = {}
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        derived = {"head_dim", "ff_hidden", "dep_head_dim", "dep_ff_hidden", "n_slots", "schedule",
                   "delay_steps", "max_delay", "text_in_card", "text_out_card", "mimi", "extra", "files"}
        if "demux_second_text_stream" in raw:
            raw["demux_second_stream"] = raw.pop("demux_second_text_stream")
        tts = raw.pop("tts_config", {}) or {}
        kw["audio_delay"] = tts.get("audio_delay", 1.28)
        kw["second_stream_ahead"] = tts.get("second_stream_ahead", 0)
        kw["max_speakers"] = tts.get("max_speakers", 5)
        if tts.get("multistream"):
            raise NotImplementedError("multistream TTS checkpoints are not supported")
        kw["files"] = {k: raw.pop(k) for k in FILE_KEYS if k in raw}
        kw["model_id"] = raw.pop("model_id", {}) or {}
        extra = {}
        for key, value in raw.items():
            if key in names and key not in derived:
                kw[key] = value
            else:
                extra[key] = value
        kw.setdefault("conditioners", {})
        kw.setdefault("fuser", {})
        kw.setdefault("depformer_weights_per_step_schedule", None)
        kw.setdefault("depformer_low_rank_embeddings", None)
        kw.setdefault("demux_second_stream", False)
        kw.setdefault("cross_attention", False)
        kw.setdefault("depformer_dim_feedforward", None)
        kw["extra"] = extra
        kw["mimi"] = MimiConfig.from_json(mimi) if mimi is not None else MimiConfig()
        return cls(**kw)

    def to_json(self) -> dict[str, Any]:
        """The ``config.json`` dict in the released layout (the inverse of :meth:`from_json`)."""
        out: dict[str, Any] = {}
        skip = {"audio_delay", "second_stream_ahead", "max_speakers", "model_id", "files", "mimi",
                "extra", "head_dim", "ff_hidden", "dep_head_dim", "dep_ff_hidden", "n_slots",
                "schedule", "delay_steps", "max_delay", "text_in_card", "text_out_card"}
        for f in dataclasses.fields(self):
            if f.name not in skip:
                out[f.name] = copy.deepcopy(getattr(self, f.name))
        out.update(copy.deepcopy(self.extra))
        out.update(self.files)
        out["model_type"] = "tts"
        out["tts_config"] = {"audio_delay": self.audio_delay, "second_stream_ahead": self.second_stream_ahead}
        out["model_id"] = dict(self.model_id)
        return out


def _gated_hidden(dim: int, dim_feedforward: int) -> int:
    """Hidden width of the gated SiLU FFN (§7.4): 21·d//8 when ff = 4d, else 2·ff//3."""
    if dim_feedforward == 4 * dim:
        return (21 * dim) // 8
    return (2 * dim_feedforward) // 3


def _tiny() -> DSMConfig:
    mimi = MimiConfig(dimension=32, n_filters=4, codebook_dim=16, n_q=8, bins=32, tr_dim=32,
                      tr_heads=2, tr_layers=2, tr_ff=64, tr_context=50)
    return DSMConfig(
        card=32, n_q=6, dep_q=6, delays=[0, 0, 2, 2, 2, 2, 2], dim=64, text_card=128,
        num_heads=4, num_layers=2, hidden_scale=4.125, context=50,
        depformer_dim=32, depformer_num_heads=2, depformer_num_layers=2, depformer_dim_feedforward=96,
        depformer_weights_per_step_schedule=[0, 1, 2, 2, 3, 3], depformer_low_rank_embeddings=8,
        conditioners=_conditioners_1p6b(64, voice_dim=16, cfg_dim=8),
        model_id={"sig": "00000000", "epoch": 0},
        files={"moshi_name": "dsm_tts_tiny.safetensors", "mimi_name": "mimi_tiny.safetensors",
               "tokenizer_name": "tokenizer_spm_tiny.model", "mimi_config_name": "mimi_config.json"},
        mimi=mimi,
    )


def _small() -> DSMConfig:
    return DSMConfig(
        dim=512, num_heads=8, num_layers=4, n_q=16, dep_q=16, delays=[0, 0] + [2] * 15,
        depformer_dim=256, depformer_num_heads=4, depformer_num_layers=2, depformer_dim_feedforward=768,
        depformer_weights_per_step_schedule=list(range(4)) + [4] * 4 + [5] * 8,
        depformer_low_rank_embeddings=64,
        conditioners=_conditioners_1p6b(512),
        model_id={"sig": "00000001", "epoch": 0},
    )


PRESETS: dict[str, DSMConfig] = {"1.6b": DSMConfig(), "small": _small(), "tiny": _tiny()}
