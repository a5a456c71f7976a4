#!/usr/bin/env python
"""One prepared GPU check of the DSM port, printing one JSON object.

The random-weight models of the config (default 1.6b) are built once, on the meta device then
initialised in place on the target device (nothing is written to disk), ours and the reference
(moshi 0.2.13) with the same weights, and serve every section:

1. ``parity`` (TF32 off): bf16 parity against the reference (dsm-inference §8.5; the released weights
   are not reachable here): conditions, teacher-forced text/audio logits (max abs diff, cosine),
   streaming temporal steps, greedy frame agreement of the step loop over the first steps, and
   Mimi decode (fp32) max abs diff and SNR, batch and streaming.
2. ``timing`` (TF32 on): step times at batch 1, 8 and 32: text step, full step and Mimi frame, ours
   and the reference side by side (see ``myna bench dsm-step``).
3. ``graphs`` (TF32 on, CUDA only): our greedy frame step (text phase, the sampled token fed back,
   audio phase) captured as one CUDA graph per batch size; whether replays give the same tokens
   as eager steps, and both step times.
4. ``loop`` (TF32 on): the live frame loop (``myna bench dsm-loop``: CUDA graphs unless
   ``NO_CUDA_GRAPH=1``, continuous batching) at 1, 8 and 32 sessions against the reference's own
   generation loop.

Each section reports its wall time, its TF32 setting and the peak host (RSS) and device memory
while it ran; a failing section reports its error and the others still run.

Usage on the GPU machine (about 5 minutes for 1.6b on one H200-class GPU, estimated):

    python scripts/gpu_dsm.py                      # 1.6b, cuda, bf16, batches 1,8,32
    python scripts/gpu_dsm.py --config small --device cpu --batch 1,2 --loop-sessions 1,2   # CPU run

Needs the reference installed: ``pip install --no-deps moshi==0.2.13 einops sphn``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before moshi is imported
_REPO = Path(__file__).resolve().parent.parent  # run from a checkout: the package folders first
sys.path[:0] = [str(_REPO / folder) for folder in ("plugin", "server", "web")]

import torch  # noqa: E402


def _stats(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.double().flatten(), b.double().flatten()
    ok = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[ok], b[ok]
    return {"max_abs": (a - b).abs().max().item(), "mean_abs": (a - b).abs().mean().item(),
            "ref_max_abs": b.abs().max().item(),
            "cosine": torch.nn.functional.cosine_similarity(a, b, dim=0).item()}


def _snr_db(ours: torch.Tensor, ref: torch.Tensor) -> float:
    noise = (ours - ref).float().pow(2).sum().item()
    signal = ref.float().pow(2).sum().item()
    return float("inf") if noise == 0 else 10 * torch.log10(torch.tensor(signal / noise)).item()


def _greedy_step(lm, fs, delay_steps: int | None = None):
    """Our greedy frame step with the sampled text fed back as is (no state machine): fn() → frame."""
    from myna.dsm.frame import FrameStep, Sampling

    step = FrameStep(lm, fs, Sampling(greedy=True), delay_steps=delay_steps)

    def full() -> torch.Tensor:
        step.text_in.copy_(step.text())
        return step.audio()

    return full


# ------------------------------------------------------------------------------------------ memory and sections


def _host_peak_bytes() -> int:
    """Peak resident set size since the last :func:`_reset_host_peak` (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_host_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS
        return True
    except OSError:
        return False


@contextlib.contextmanager
def section(report: dict, name: str, device: torch.device, tf32: bool):
    """Time a section, set TF32 for it, record its peak host and device memory and any error
    (the error is kept in the report and the run goes on)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    entry: dict = {"tf32": tf32}
    report.setdefault("sections", {})[name] = entry
    entry["host_peak_is_section_peak"] = _reset_host_peak()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    try:
        yield entry
    except Exception as exc:  # keep the rest of the one call
        entry["error"] = "".join(traceback.format_exception(exc))[-2000:]
    finally:
        entry["wall_s"] = round(time.perf_counter() - t0, 2)
        entry["peak_host_gib"] = round(_host_peak_bytes() / 2**30, 2)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            entry["peak_device_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        print(f"gpu_dsm: {name} done in {entry['wall_s']} s", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ sections


@torch.no_grad()
def parity(cfg, models, ref_models, device, dtype, steps: int) -> dict:
    from moshi.conditioners import ConditionAttributes, TensorCondition
    from moshi.models.lm import LMGen

    from myna.dsm.frame import FrameState

    lm, mimi = models
    ref_lm, ref_mimi = ref_models
    out: dict = {}
    gen = torch.Generator(device=device).manual_seed(0)
    B = 2
    S = cfg.max_speakers * 125
    # Conditions through both conditioner stacks (fp32), voice in slot 0, cfg "2.0".
    voice = torch.randn(1, cfg.cross_dim, 125, device=device, generator=gen)
    x = torch.zeros(1, S, cfg.cross_dim, device=device)
    x[:, :125] = voice.transpose(1, 2)
    mask = torch.zeros(1, S, dtype=torch.bool, device=device)
    mask[:, :125] = True
    values = {"control": ["ok"] * B, "cfg": ["2.0"] * B}
    cond_sum = lm.condition_provider.condition_sum(values)
    cross = lm.condition_provider.cross_source({"speaker_wavs": (x.expand(B, -1, -1), mask.expand(B, -1))})
    attrs = [ConditionAttributes(text={"control": "ok", "cfg": "2.0"},
                                 tensor={"speaker_wavs": TensorCondition(x, mask)}) for _ in range(B)]
    ct = ref_lm.condition_provider.prepare_and_provide(attrs)
    out["cond_sum"] = _stats(cond_sum, ref_lm.fuser.get_sum(ct))
    out["cross_source"] = _stats(cross, ref_lm.fuser.get_cross(ct))

    # Teacher-forced forward.
    T = 32
    codes = torch.randint(0, cfg.card, (B, cfg.n_q + 1, T), device=device, generator=gen)
    codes[:, 0] = torch.randint(0, cfg.text_in_card * 3, (B, T), device=device, generator=gen)
    logits, text = lm(codes, cond_sum, cross)
    ref = ref_lm(codes, ct)
    out["teacher_forced_audio_logits"] = _stats(logits, ref.logits)
    out["teacher_forced_text_logits"] = _stats(text, ref.text_logits)
    del logits, text, ref

    # Streaming temporal steps.
    state = lm.new_state(B, S)
    lm.set_conditions(state, slice(None), cond_sum, cross)
    worst_h, worst_l, cos = 0.0, 0.0, 1.0
    ref_sum, ref_cross = ref_lm.fuser.get_sum(ct).to(dtype), ref_lm.fuser.get_cross(ct).to(dtype)
    with ref_lm.streaming(B):
        for _ in range(8):
            tokens = torch.randint(0, cfg.card, (B, cfg.n_q + 1), device=device, generator=gen)
            h, l1 = lm.forward_text(state, tokens)
            rh, rl = ref_lm.forward_text(tokens[:, :, None], ref_sum, ref_cross)
            s = _stats(l1, rl[:, 0, 0])
            worst_h = max(worst_h, _stats(h, rh)["max_abs"])
            worst_l, cos = max(worst_l, s["max_abs"]), min(cos, s["cosine"])
    out["temporal_steps"] = {"h_max_abs": worst_h, "text_logits_max_abs": worst_l, "text_logits_min_cosine": cos}
    del state

    # Greedy step loop without the state machine (the sampled text is fed back as is), B = 1;
    # the reference's plain LMGen neither skips the depformer nor masks audio: delay_steps 0.
    fs = FrameState.new(lm, 1, S)
    lm.set_conditions(fs.temporal, slice(None), cond_sum[:1], cross[:1])
    full = _greedy_step(lm, fs, delay_steps=0)
    ours_frames = []
    for t in range(steps):
        frame = full()
        if t >= cfg.max_delay:
            ours_frames.append(frame.clone())
    rgen = LMGen(ref_lm, use_sampling=False, condition_tensors=ref_lm.condition_provider.prepare_and_provide(attrs[:1]))
    ref_frames = []
    with rgen.streaming(1):
        for t in range(steps):
            f = rgen.step(torch.zeros(1, 0, 1, dtype=torch.long, device=device))
            if f is not None:
                ref_frames.append(f[:, :, 0].clone())
    a, b = torch.stack(ours_frames), torch.stack(ref_frames)
    same = (a == b).all(dim=-1).all(dim=-1)
    first_diff = int((~same).nonzero()[0, 0]) if (~same).any() else None
    out["greedy_frames"] = {"frames": int(a.shape[0]), "identical_frames": int(same.sum()),
                            "first_differing_frame": first_diff, "token_agreement": (a == b).float().mean().item()}
    del fs, full

    # Mimi, fp32.
    mcodes = torch.randint(0, cfg.card, (B, cfg.n_q, 40), device=device, generator=gen)
    whole, rwhole = mimi.decode(mcodes), ref_mimi.decode(mcodes)
    mstate = mimi.new_state(B)
    stream = torch.cat([mimi.decode(mcodes[:, :, i:i + 1], mstate) for i in range(40)], dim=-1)
    with ref_mimi.streaming(B):
        rstream = torch.cat([ref_mimi.decode(mcodes[:, :, i:i + 1]) for i in range(40)], dim=-1)
    out["mimi_whole"] = {**_stats(whole, rwhole), "snr_db": _snr_db(whole, rwhole)}
    out["mimi_streaming"] = {**_stats(stream, rstream), "snr_db": _snr_db(stream, rstream)}
    out["mimi_streaming_vs_whole_ours"] = _stats(stream, whole)["max_abs"]
    return out


def timing(cfg, models, ref_models, device, dtype, batches: list[int], iters: int, rounds: int) -> list[dict]:
    from myna.bench.dsm_step import bench_batch, ours_steps, ref_steps, stop_streaming

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rows = []
    for B in batches:
        t0 = time.perf_counter()
        try:
            ours = ours_steps(*models, cfg, B, device)
            ref = ref_steps(*ref_models, cfg, B, device, dtype)
            row = bench_batch(ours, ref, iters, rounds, sync)
        except torch.cuda.OutOfMemoryError as exc:
            row = {"error": f"out of memory: {exc}"[:300]}
        ours = ref = None  # this batch's states (KV caches) go before the next batch's
        stop_streaming(ref_models)
        row["batch"] = B
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        rows.append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


@torch.no_grad()
def graph_check(cfg, lm, device, B: int, steps: int = 8, iters: int = 20) -> dict:
    """Capture our greedy frame step as one CUDA graph; compare replays with eager steps; time both."""
    from myna.dsm.frame import FrameState

    S = cfg.max_speakers * 125 if cfg.cross_attention else 0
    gen = torch.Generator(device=device).manual_seed(3)
    cond = torch.randn(B, 1, cfg.dim, device=device, generator=gen)
    cross = torch.randn(B, S, cfg.dim, device=device, generator=gen) if S else None

    def new_step():
        fs = FrameState.new(lm, B, S)
        lm.set_conditions(fs.temporal, slice(None), cond, cross)
        return _greedy_step(lm, fs)

    graphed, eager = new_step(), new_step()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            graphed()
    torch.cuda.current_stream(device).wait_stream(side)
    for _ in range(3):
        eager()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        static_out = graphed()
    same = 0
    for _ in range(steps):
        graph.replay()
        same += int(torch.equal(static_out, eager()))
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize(device)
    graph_ms = (time.perf_counter() - t0) / iters * 1000
    t0 = time.perf_counter()
    for _ in range(iters):
        eager()
    torch.cuda.synchronize(device)
    eager_ms = (time.perf_counter() - t0) / iters * 1000
    return {"batch": B, "captured": True, "identical_steps": same, "steps": steps,
            "graph_full_step_ms": graph_ms, "eager_full_step_ms": eager_ms}


def loop(config: str, cfg, models, ref_models, counts: list[int]) -> dict:
    """The live frame loop (myna bench dsm-loop) on the same models, ours against the reference's
    own generation loop: the table and the figures."""
    from myna.bench import dsm_loop

    with tempfile.TemporaryDirectory(prefix="gpu-dsm-loop-") as tmp:
        tts, ref, voice = dsm_loop.wrap(cfg, *models, ref_models, Path(tmp))
        result = dsm_loop.measure(tts, ref, voice, counts, config=config)
    return {"table": dsm_loop.format_table(result), "results": result["results"],
            "cuda_graphs": result["cuda_graphs"]}


# ------------------------------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="1.6b", choices=("tiny", "small", "1.6b"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=("bf16", "fp32"))
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--steps", type=int, default=24, help="greedy steps compared frame by frame")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--loop-sessions", default="1,8,32",
                    help="the frame loop (myna bench dsm-loop) at these session counts, ours and the "
                         "reference's loop, after the step timings; empty to skip")
    args = ap.parse_args()

    from myna.bench.dsm_step import build_pair
    from myna.dsm.config import DSMConfig

    t_start = time.perf_counter()
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype or "", torch.bfloat16)
    cfg = DSMConfig.from_name(args.config)
    batches = [int(b) for b in args.batch.split(",") if b.strip()]
    report: dict = {"config": args.config, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "n_q": cfg.n_q}
    models = ref_models = None
    with section(report, "build", device, tf32=False):
        models, ref_models = build_pair(cfg, device, dtype, with_ref=True)
    if models is None:
        print(json.dumps(report, indent=2))
        return 1
    if not args.skip_parity:
        from myna.bench.dsm_step import stop_streaming

        with section(report, "parity", device, tf32=False) as entry:
            try:
                entry.update(parity(cfg, models, ref_models, device, dtype, args.steps))
            finally:
                stop_streaming(ref_models)
    with section(report, "timing", device, tf32=True) as entry:
        iters = args.iters or (10 if device.type == "cuda" else 3)
        entry["rows_ms"] = timing(cfg, models, ref_models, device, dtype, batches, iters, args.rounds)
    if device.type == "cuda":
        with section(report, "graphs", device, tf32=True) as entry:
            entry["rows"] = []
            for B in batches:
                try:
                    entry["rows"].append(graph_check(cfg, models[0], device, B))
                except Exception as exc:  # report, do not lose the other batch sizes
                    entry["rows"].append({"batch": B, "captured": False,
                                          "error": "".join(traceback.format_exception(exc))[-1500:]})
                torch.cuda.empty_cache()
    counts = [int(s) for s in args.loop_sessions.split(",") if s.strip()]
    if counts:
        with section(report, "loop", device, tf32=True) as entry:
            entry.update(loop(args.config, cfg, models, ref_models, counts))
    models = ref_models = None
    report["total_s"] = round(time.perf_counter() - t_start, 2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
