"""``myna bench dsm-step``: DSM frame-loop step times, ours against the reference, side by side.

For each batch size it times, for our port (:mod:`myna.dsm`) and for the reference (``moshi``
0.2.13, imported lazily, same config and the same random weights, in the same run):

- **text step**: a step without the depformer (the first ``delay_steps`` steps of a stream):
  temporal transformer, text sampling, token-cache update;
- **full step**: the same plus the depformer chain over every codebook with sampling;
- **mimi frame**: streaming Mimi decode of one 80 ms frame of codes.

Step time does not depend on weight values (the same kernels run whatever the numbers), so
random weights time the real loop.
Times are medians over interleaved rounds (ours, then reference, alternately), in ms; the
``ratio`` is ours / reference (below 1 means we are faster). Absolute times only mean something
on a GPU run with the GPU named. The reference's lazy ``torch.compile`` is turned off
(``NO_TORCH_COMPILE=1``) unless ``--ref-compile``; its CUDA graphs follow ``NO_CUDA_GRAPH``.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

CONFIGS = ("tiny", "small", "1.6b")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``dsm-step`` on an argparse ``subparsers``; sets ``func`` to :func:`run`."""
    p = subparsers.add_parser("dsm-step", help="DSM step time (text step, full step, Mimi frame), ours vs reference",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=CONFIGS, default="tiny", help="model size preset (random weights)")
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (default 1,8)")
    p.add_argument("--device", default=None, help="torch device (default cuda if available, else cpu)")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="LM dtype (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (default 5)")
    p.add_argument("--iters", type=int, default=None, help="steps per round (default: by config)")
    p.add_argument("--no-ref", action="store_true", help="time only our implementation")
    p.add_argument("--ref-compile", action="store_true", help="let the reference torch.compile its kernels")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads on CPU")
    p.set_defaults(func=run)
    return p


# ------------------------------------------------------------------------------------------ models


def _lm_kwargs(cfg) -> dict[str, Any]:
    raw = cfg.to_json()
    for key in ("moshi_name", "mimi_name", "tokenizer_name", "mimi_config_name", "lora_name", "model_type",
                "lm_gen_config", "tts_config", "stt_config", "model_id"):
        raw.pop(key, None)
    return copy.deepcopy(raw)


def build_pair(cfg, device, dtype, with_ref: bool, seed: int = 0):
    """Our (lm, mimi) with random weights and, if asked, the reference's (lm, mimi) with the same weights."""
    import torch

    from myna.dsm.checkpoint import codebook_names, mimi_checkpoint_name
    from myna.dsm.lm import DSMLM
    from myna.dsm.mimi import MimiDecoder
    from myna.bench.tiny_dsm import randomize

    with torch.device("meta"):
        lm = DSMLM(cfg)
        mimi = MimiDecoder(cfg.mimi)
    lm = lm.to_empty(device=device)
    mimi = mimi.to_empty(device=device)
    randomize(lm, seed)
    randomize(mimi, seed + 1)
    with torch.no_grad():
        mimi.codebooks.normal_(generator=torch.Generator(device=device).manual_seed(seed + 2))
    lm = lm.to(dtype)
    if lm.condition_provider is not None:
        lm.condition_provider.float()
    lm.eval()
    mimi.eval()
    if not with_ref:
        return (lm, mimi), None

    from moshi.models import loaders  # the reference, imported lazily (test/bench only)

    with torch.device("meta"):
        ref_lm = loaders.get_moshi_lm(None, lm_kwargs=_lm_kwargs(cfg), device="meta", dtype=dtype)
    ref_lm = ref_lm.to_empty(device=device)
    missing, unexpected = ref_lm.load_state_dict(lm.state_dict(), strict=False)
    missing = [k for k in missing if k != "depformer_text_emb.low_rank.weight"]
    if missing or unexpected:
        raise RuntimeError(f"reference LM does not take our weights: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    ref_lm.eval()
    ref_mimi = loaders.get_mimi(None, mimi_config=cfg.mimi.to_json(), device=device, num_codebooks=cfg.n_q)
    sd = {mimi_checkpoint_name(mimi, k): v for k, v in mimi.state_dict().items() if k != "codebooks"}
    for q, (emb, usage) in enumerate(codebook_names(cfg.mimi.n_q, cfg.mimi.n_q_semantic)):
        sd[emb] = mimi.codebooks[q].clone()
        sd[usage] = torch.ones(cfg.mimi.bins, device=device)
        sd[emb.replace("embedding_sum", "_initialized")] = torch.ones(1, device=device)
    missing, unexpected = ref_mimi.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.startswith(("encoder", "downsample", "quantizer.rvq_first.input_proj",
                                                         "quantizer.rvq_rest.input_proj"))]
    if missing or unexpected:
        raise RuntimeError(f"reference Mimi does not take our weights: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    ref_mimi.set_num_codebooks(cfg.n_q)
    ref_mimi.eval()
    return (lm, mimi), (ref_lm, ref_mimi)


def estimate_bytes(cfg, dtype_bytes: int, batch: int, with_ref: bool) -> int:
    """Rough memory need: LM weights (×2 with the reference) + KV caches + Mimi."""
    from myna.dsm.lm import DSMLM

    import torch

    with torch.device("meta"):
        n = sum(p.numel() for p in DSMLM(cfg).parameters())
    kv = 2 * cfg.num_layers * cfg.context * cfg.dim * dtype_bytes * batch
    mimi = 100_000_000 * 4
    return (n * dtype_bytes + kv + mimi) * (2 if with_ref else 1)


def available_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


# ------------------------------------------------------------------------------------------ steps


def ours_steps(lm, mimi, cfg, B: int, device):
    """Our three timed callables for batch B (fresh state, random conditions): kind → fn(). The
    steps are :class:`myna.dsm.frame.FrameStep` with sampling, their noise drawn on the device."""
    import torch

    from myna.dsm.frame import FrameState, FrameStep, Sampling

    cross_len = cfg.max_speakers * 125 if cfg.cross_attention else 0
    fs = FrameState.new(lm, B, cross_len)
    cond_sum = torch.randn(B, 1, cfg.dim, device=device)
    cross = torch.randn(B, cross_len, cfg.dim, device=device) if cross_len else None
    lm.set_conditions(fs.temporal, slice(None), cond_sum, cross)
    step = FrameStep(lm, fs, Sampling(temperature=0.6, top_k_text=25, top_k_audio=250))
    mstate = mimi.new_state(B)
    codes = torch.randint(0, cfg.card, (B, cfg.n_q, 1), device=device)

    @torch.no_grad()
    def text_step():
        step.text_noise.exponential_()
        step.text_in.copy_(step.text())
        step.commit()

    @torch.no_grad()
    def full_step():
        step.text_noise.exponential_()
        step.text_in.copy_(step.text())
        step.audio_noise.exponential_()
        step.audio()

    @torch.no_grad()
    def mimi_frame():
        mimi.decode(codes, mstate)

    return {"text_step": text_step, "full_step": full_step, "mimi_frame": mimi_frame}


def ref_steps(ref_lm, ref_mimi, cfg, B: int, device, dtype):
    """The reference's three timed callables for batch B (its LMGen and streaming Mimi): kind → fn()."""
    import torch
    from moshi.conditioners import ConditionAttributes, TensorCondition
    from moshi.models.lm import LMGen

    attrs = []
    for _ in range(B):
        tensors = {}
        if cfg.cross_dim:
            x = torch.randn(1, cfg.max_speakers * 125, cfg.cross_dim, device=device)
            mask = torch.ones(1, cfg.max_speakers * 125, dtype=torch.bool, device=device)
            tensors["speaker_wavs"] = TensorCondition(x, mask)
        text = {name: ("ok" if name == "control" else "2.0" if name == "cfg" else None)
                for name, c in cfg.conditioners.items() if c["type"] == "lut"}
        attrs.append(ConditionAttributes(text=text, tensor=tensors))
    ct = ref_lm.condition_provider.prepare_and_provide(attrs) if ref_lm.condition_provider is not None else None
    gen = LMGen(ref_lm, temp=0.6, temp_text=0.6, top_k=250, top_k_text=25, condition_tensors=ct)
    gen.streaming_forever(B)
    ref_mimi.streaming_forever(B)
    user = torch.zeros(B, 0, 1, dtype=torch.long, device=device)
    no_dep = torch.full((B, cfg.dep_q, 1), -1, dtype=torch.long, device=device)
    codes = torch.randint(0, cfg.card, (B, cfg.n_q, 1), device=device)

    @torch.no_grad()
    def text_step():
        gen.step(user, depformer_replace_tokens=no_dep)

    @torch.no_grad()
    def full_step():
        gen.step(user)

    @torch.no_grad()
    def mimi_frame():
        ref_mimi.decode(codes)

    return {"text_step": text_step, "full_step": full_step, "mimi_frame": mimi_frame}


def _time(fn: Callable[[], None], iters: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters * 1000.0


def bench_batch(ours: dict, ref: dict | None, iters: int, rounds: int, sync) -> dict[str, Any]:
    """Interleaved timing of each kind; medians in ms and the ours/ref ratio."""
    out: dict[str, Any] = {"ours": {}, "ref": {}, "ratio": {}}
    for kind in ("text_step", "full_step", "mimi_frame"):
        for fn in [ours[kind]] + ([ref[kind]] if ref else []):
            _time(fn, max(2, iters // 4), sync)  # warm-up
        mine, theirs = [], []
        for _ in range(rounds):
            mine.append(_time(ours[kind], iters, sync))
            if ref:
                theirs.append(_time(ref[kind], iters, sync))
        out["ours"][kind] = statistics.median(mine)
        if ref:
            out["ref"][kind] = statistics.median(theirs)
            out["ratio"][kind] = out["ours"][kind] / out["ref"][kind]
    return out


def run(args: argparse.Namespace) -> int:
    """Run the benchmark described by ``args`` (see :func:`add_parser`); print a table, write JSON."""
    if not args.ref_compile:
        os.environ.setdefault("NO_TORCH_COMPILE", "1")
    import torch

    from myna.dsm.config import DSMConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    default_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype or "", default_dtype)
    batches = [int(b) for b in str(args.batch).split(",") if b.strip()]
    cfg = DSMConfig.from_name(args.config)
    with_ref = not args.no_ref
    if with_ref:
        try:
            import moshi  # noqa: F401
        except ImportError:
            print("dsm-step: the reference implementation is not installed; install it with\n"
                  "  pip install --no-deps moshi==0.2.13 einops sphn\n"
                  "or pass --no-ref to time only ours.", file=sys.stderr)
            return 2
    need = estimate_bytes(cfg, torch.finfo(dtype).bits // 8, max(batches), with_ref)
    have = available_bytes(device)
    result: dict[str, Any] = {
        "benchmark": "dsm-step", "config": args.config, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).replace("torch.", ""), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "n_q": cfg.n_q, "reference": "moshi 0.2.13" if with_ref else None,
        "ref_cuda_graphs": device.type == "cuda" and os.environ.get("NO_CUDA_GRAPH", "") in ("", "0", "no", "n"),
        "ref_torch_compile": bool(args.ref_compile), "results": [],
    }
    if need > 0.9 * have:
        msg = (f"dsm-step: skipping config {args.config}: needs about {need / 2**30:.1f} GiB on {device}, "
               f"{have / 2**30:.1f} GiB available")
        print(msg)
        result["skipped"] = msg
        _write(args.json_out, result)
        return 0
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    iters = args.iters or {"tiny": 20, "small": 5, "1.6b": 3 if device.type == "cpu" else 10}[args.config]
    t0 = time.perf_counter()
    (lm, mimi), ref_models = build_pair(cfg, device, dtype, with_ref)
    result["build_s"] = round(time.perf_counter() - t0, 2)
    for B in batches:
        ours = ours_steps(lm, mimi, cfg, B, device)
        ref = ref_steps(*ref_models, cfg, B, device, dtype) if ref_models else None
        row = bench_batch(ours, ref, iters, args.rounds, sync)
        row["batch"] = B
        result["results"].append(row)
        if ref_models:
            stop_streaming(ref_models)
    print(format_table(result))
    _write(args.json_out, result)
    return 0


def stop_streaming(ref_models) -> None:
    """Leave the reference's streaming mode (entered with ``streaming_forever``) before the next batch."""
    for m in ref_models:
        for sub in m.modules():
            if hasattr(sub, "_streaming_state"):
                sub._streaming_state = None


def _write(path: str | None, result: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2))


def format_table(result: dict[str, Any]) -> str:
    """The results as a plain-text table (ms; ratio = ours / reference)."""
    head = (f"dsm-step  config={result['config']}  device={result['device_name']}  dtype={result['dtype']}  "
            f"n_q={result['n_q']}  threads={result['threads']}")
    lines = [head, f"{'batch':>5}  {'kind':<10}  {'ours ms':>10}  {'ref ms':>10}  {'ours/ref':>8}"]
    for row in result["results"]:
        for kind in ("text_step", "full_step", "mimi_frame"):
            ref = row["ref"].get(kind)
            ratio = row["ratio"].get(kind)
            lines.append(f"{row['batch']:>5}  {kind:<10}  {row['ours'][kind]:>10.3f}  "
                         f"{(f'{ref:.3f}' if ref is not None else '-'):>10}  "
                         f"{(f'{ratio:.2f}' if ratio is not None and math.isfinite(ratio) else '-'):>8}")
    return "\n".join(lines)
