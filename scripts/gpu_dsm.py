#!/usr/bin/env python
"""One prepared GPU check of the DSM port (issue 3), printing one JSON object.

1. bf16 parity against the reference (moshi 0.2.13) on the same random weights (dsm_spec §8.5;
   the released weights are not reachable here): teacher-forced text/audio logits (max abs diff,
   cosine), streaming temporal steps with conditions, greedy frame agreement of the step loop over
   the first steps, and Mimi decode (fp32) max abs diff and SNR, batch and streaming.
2. Step times of the given config (default 1.6b) at batch 1, 8 and 32: text step, full step and
   Mimi frame, ours and the reference side by side (see ``myna bench dsm-step``).
3. On CUDA: whether our greedy full step (temporal + depformer + commit) captures as one CUDA graph,
   whether replays give the same tokens as eager steps, and the replayed step time per batch size.

Usage on the GPU machine (well under 8 minutes for 1.6b on one H200-class GPU):

    python scripts/gpu_dsm.py                      # 1.6b, cuda, bf16, batches 1,8,32
    python scripts/gpu_dsm.py --config tiny --device cpu --batch 1,2   # CPU smoke test

Needs the reference installed: ``pip install --no-deps moshi==0.2.13 einops sphn``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("NO_TORCH_COMPILE", "1")  # before moshi is imported
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # noqa: E402 (run from a checkout)

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


@torch.no_grad()
def parity(cfg, models, ref_models, device, dtype, steps: int) -> dict:
    from moshi.conditioners import ConditionAttributes, TensorCondition
    from moshi.models.lm import LMGen

    from myna.dsm.frame import FrameState, step_commit, step_depformer, step_text
    from myna.dsm.sampling import sample_token

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

    # Greedy step loop without the state machine (the sampled text is fed back as is), B = 1.
    fs = FrameState(lm, 1, S)
    lm.set_conditions(fs.temporal, slice(None), cond_sum[:1], cross[:1])
    ours_frames = []
    for t in range(steps):
        h, lg = step_text(lm, fs)
        txt = sample_token(lg, greedy=True)
        audio = step_depformer(lm, fs, txt, h, greedy=True)
        frame = step_commit(lm, fs, txt, audio, 0)
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


@torch.no_grad()
def graph_check(cfg, lm, device, B: int, steps: int = 8, iters: int = 20) -> dict:
    """Capture our greedy full step as one CUDA graph; compare replays with eager steps; time both."""
    from myna.dsm.frame import FrameState, step_commit, step_depformer, step_text
    from myna.dsm.sampling import sample_token

    S = cfg.max_speakers * 125 if cfg.cross_attention else 0
    gen = torch.Generator(device=device).manual_seed(3)
    cond = torch.randn(B, 1, cfg.dim, device=device, generator=gen)
    cross = torch.randn(B, S, cfg.dim, device=device, generator=gen) if S else None

    def new_state():
        fs = FrameState(lm, B, S)
        lm.set_conditions(fs.temporal, slice(None), cond, cross)
        return fs

    def full(fs):
        h, lg = step_text(lm, fs)
        txt = sample_token(lg, greedy=True)
        audio = step_depformer(lm, fs, txt, h, greedy=True)
        return step_commit(lm, fs, txt, audio, 0)

    graphed, eager = new_state(), new_state()
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            full(graphed)
    torch.cuda.current_stream(device).wait_stream(side)
    for _ in range(3):
        full(eager)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = full(graphed)
    same = 0
    for _ in range(steps):
        graph.replay()
        same += int(torch.equal(static_out, full(eager)))
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize(device)
    graph_ms = (time.perf_counter() - t0) / iters * 1000
    t0 = time.perf_counter()
    for _ in range(iters):
        full(eager)
    torch.cuda.synchronize(device)
    eager_ms = (time.perf_counter() - t0) / iters * 1000
    return {"batch": B, "captured": True, "identical_steps": same, "steps": steps,
            "graph_full_step_ms": graph_ms, "eager_full_step_ms": eager_ms}


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

    from myna.bench.dsm_step import bench_batch, build_pair, ours_steps, ref_steps, stop_streaming
    from myna.dsm.config import DSMConfig

    t_start = time.perf_counter()
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(args.dtype or "", torch.bfloat16)
    cfg = DSMConfig.from_name(args.config)
    report: dict = {"config": args.config, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
                    "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "torch": torch.__version__, "n_q": cfg.n_q}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    models, ref_models = build_pair(cfg, device, dtype, with_ref=True)
    report["build_s"] = round(time.perf_counter() - t0, 2)
    if not args.skip_parity:
        t0 = time.perf_counter()
        try:
            report["parity"] = parity(cfg, models, ref_models, device, dtype, args.steps)
        except Exception as exc:  # keep the timing part of the one call
            report["parity_error"] = "".join(traceback.format_exception(exc))[-2000:]
        stop_streaming(ref_models)
        report["parity_s"] = round(time.perf_counter() - t0, 2)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    iters = args.iters or (10 if device.type == "cuda" else 3)
    report["timing_ms"] = []
    for B in [int(b) for b in args.batch.split(",")]:
        t0 = time.perf_counter()
        try:
            ours = ours_steps(*models, cfg, B, device)
            ref = ref_steps(*ref_models, cfg, B, device, dtype)
            row = bench_batch(ours, ref, iters, args.rounds, sync)
        except torch.cuda.OutOfMemoryError as exc:
            row = {"error": f"out of memory: {exc}"[:300]}
        stop_streaming(ref_models)
        row["batch"] = B
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        report["timing_ms"].append(row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if device.type == "cuda":
        report["cuda_graph"] = []
        for B in [int(b) for b in args.batch.split(",")]:
            try:
                report["cuda_graph"].append(graph_check(cfg, models[0], device, B))
            except Exception as exc:  # report, do not lose the rest of the run
                report["cuda_graph"].append({"batch": B, "captured": False,
                                             "error": "".join(traceback.format_exception(exc))[-1500:]})
            torch.cuda.empty_cache()
        report["max_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    if args.loop_sessions:
        models = ref_models = None  # free the step benchmark's device memory first
        report["loop"] = _loop(args)
    report["total_s"] = round(time.perf_counter() - t_start, 2)
    print(json.dumps(report, indent=2))
    return 0


def _loop(args) -> dict:
    """The live frame loop on the same device (myna bench dsm-loop), CUDA graphs on unless
    NO_CUDA_GRAPH=1, ours against the reference's own generation loop."""
    import argparse as _argparse
    import contextlib
    import io

    from myna.bench import dsm_loop

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    loop_args = _argparse.Namespace(config=args.config, sessions=args.loop_sessions, text=dsm_loop.TEXT,
                                    device=args.device, threads=None, n_q=None, rounds=1, no_ref=False,
                                    json_out=None)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            dsm_loop.run(loop_args)
        return {"table": out.getvalue()}
    except Exception as exc:  # keep the rest of the report
        return {"error": "".join(traceback.format_exception(exc))[-1500:], "table": out.getvalue()}


if __name__ == "__main__":
    sys.exit(main())
