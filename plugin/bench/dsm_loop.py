"""``myna bench dsm-loop``: the frame loop (:class:`myna.dsm.loop.FrameLoop`) against the reference's
own generation loop (``moshi`` 0.2.13 ``TTSModel.generate`` with streaming Mimi decode in its
``on_frame`` callback), on the same random-weight checkpoint of a config preset, in the same run.

For each session count S, S turns of the same text start together (all words at once, no
backpressure) and run to the end. Reported per side: steps per second (batched steps / wall),
per-session RTF (wall seconds from start to the session's end / its audio seconds; lower is
better), steps to first audio (model steps until the first kept 80 ms frame) and milliseconds to
first audio (turn start → that frame decoded). Ratios are ours / reference; for
steps/s: above 1 means ours steps faster; RTF and ms: below 1 means ours is faster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CONFIGS = ("tiny", "small", "1.6b")
TEXT = ("Hello there. This is a streaming speech benchmark, reading a couple of sentences "
        "so that every turn lasts a few seconds.")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("dsm-loop", help="DSM frame loop vs the reference's generation loop",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=CONFIGS, default="tiny", help="model size preset (random weights)")
    p.add_argument("--sessions", default="1,2,4,8,16", help="concurrent session counts (default: %(default)s)")
    p.add_argument("--text", default=TEXT, help="what every session says")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--n-q", type=int, default=None, help="codebooks (default: the model's)")
    p.add_argument("--rounds", type=int, default=1,
                   help="interleaved ours/ref runs per session count; medians are reported (default: %(default)s)")
    p.add_argument("--no-ref", action="store_true", help="time only ours")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)
    return p


def ours_run(tts, voice, text: str, S: int) -> dict[str, Any]:
    """S concurrent sessions through a fresh FrameLoop with S slots."""
    from myna.dsm.loop import FrameLoop

    loop = FrameLoop(tts, max_batch=S, max_ahead_s=math.inf)
    loop.start()
    try:
        audio = [0] * S
        ended = [0.0] * S
        sessions = []
        t0 = time.perf_counter()
        steps0 = loop.steps
        for i in range(S):
            def on_audio(pcm, i=i):
                audio[i] += len(pcm)

            def on_end(err, i=i):
                ended[i] = time.perf_counter()
                if err is not None:
                    print(f"dsm-loop: session {i} failed: {err}", file=sys.stderr)

            s = loop.open(voice=voice, seed=i, on_audio=on_audio, on_end=on_end)
            s.push_words(text.split())
            s.end_input()
            sessions.append(s)
        while not all(s.done.is_set() for s in sessions):
            time.sleep(0.002)
        wall = max(ended) - t0
        steps = loop.steps - steps0
    finally:
        loop.close()
    rate = tts.sample_rate
    return _summary(wall, steps, [(ended[i] - t0) / max(audio[i] / rate, 1e-9) for i in range(S)],
                    [s.first_audio_step + 1 for s in sessions if s.first_audio_step is not None],
                    [1000 * (s.first_audio_time - s.opened_at) for s in sessions if s.first_audio_time])


def ref_run(ref, voice, text: str, S: int, cfg_value: float | None) -> dict[str, Any]:
    """The reference's generate() for S entries, decoding each frame with its streaming Mimi."""
    import torch

    entries = [ref.prepare_script([text], padding_between=1) for _ in range(S)]
    attrs = [ref.make_condition_attributes([Path(voice)] if voice else [], cfg_coef=cfg_value) for _ in range(S)]
    delay = ref.delay_steps
    state = {"frames": 0, "first": None, "first_step": None}
    t0 = time.perf_counter()

    def on_frame(frame):
        state["frames"] += 1
        if state["frames"] > delay:
            ref.mimi.decode(frame[:, 1:, :])
            if state["frames"] == delay + 3 and state["first"] is None:  # first kept frame (2 skipped)
                state["first"] = time.perf_counter()
                state["first_step"] = state["frames"] + max(ref.lm.delays)

    with ref.mimi.streaming(S), torch.no_grad():
        result = ref.generate(entries, attrs, on_frame=on_frame)
    wall = time.perf_counter() - t0
    steps = len(result.frames) + max(ref.lm.delays)
    frame_s = 1 / ref.mimi.frame_rate
    rtf = [wall / max((end or 0) * frame_s, 1e-9) for end in result.end_steps]
    first_ms = [1000 * (state["first"] - t0)] * S if state["first"] else []
    return _summary(wall, steps, rtf, [state["first_step"]] * S if state["first_step"] else [], first_ms)


def _median(runs: list[dict]) -> dict:
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def _summary(wall: float, steps: int, rtf: list[float], first_steps: list[int], first_ms: list[float]) -> dict:
    return {"wall_s": wall, "steps": steps, "steps_per_s": steps / wall if wall else float("nan"),
            "rtf_mean": statistics.mean(rtf) if rtf else float("nan"),
            "rtf_max": max(rtf) if rtf else float("nan"),
            "first_audio_steps": statistics.median(first_steps) if first_steps else None,
            "first_audio_ms": statistics.median(first_ms) if first_ms else None}


def build(config: str, folder: Path, device: str, with_ref: bool, n_q: int | None):
    import torch

    from myna.dsm import build_tiny_checkpoint, load
    from myna.dsm.config import DSMConfig
    from myna.dsm.tiny import TINY_VOICE

    cfg = DSMConfig.from_name(config)
    build_tiny_checkpoint(folder, seed=0, config=cfg)
    voice = folder / TINY_VOICE if cfg.cross_dim else None
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tts = load(folder, device, dtype, progress=False)
    if n_q:
        tts.n_q = max(1, min(n_q, cfg.n_q))
    ref = None
    if with_ref:
        from moshi.models import loaders
        from moshi.models.tts import TTSModel

        raw = json.loads((folder / "config.json").read_text())
        info = loaders.CheckpointInfo.from_hf_repo(
            "local/none", moshi_weights=folder / raw["moshi_name"], mimi_weights=folder / raw["mimi_name"],
            tokenizer=folder / raw["tokenizer_name"], config_path=folder / "config.json",
            mimi_config_path=folder / raw["mimi_config_name"])
        ref = TTSModel.from_checkpoint_info(info, device=device, dtype=dtype, n_q=tts.n_q)
    return tts, ref, voice


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("NO_TORCH_COMPILE", "1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    counts = [int(s) for s in str(args.sessions).split(",") if s.strip()]
    with_ref = not args.no_ref
    if with_ref:
        try:
            import moshi  # noqa: F401
        except ImportError:
            print("dsm-loop: the reference is not installed (pip install --no-deps moshi==0.2.13 einops sphn), "
                  "or pass --no-ref", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="myna-dsm-loop-") as tmp:
        t0 = time.perf_counter()
        tts, ref, voice = build(args.config, Path(tmp), device, with_ref, args.n_q)
        result: dict[str, Any] = {
            "benchmark": "dsm-loop", "config": args.config, "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "threads": torch.get_num_threads(), "n_q": tts.n_q, "text": args.text,
            "reference": "moshi 0.2.13 TTSModel.generate" if with_ref else None,
            "cuda_graphs": device == "cuda" and os.environ.get("NO_CUDA_GRAPH", "") in ("", "0"),
            "build_s": round(time.perf_counter() - t0, 2), "results": []}
        cfg_value = float(tts.cfg_value) if tts.cfg_value else None
        for S in counts:
            mine, theirs = [], []
            for _ in range(max(1, args.rounds)):  # interleaved: this machine is shared and noisy
                mine.append(ours_run(tts, voice, args.text, S))
                if ref is not None:
                    theirs.append(ref_run(ref, voice, args.text, S, cfg_value))
            row: dict[str, Any] = {"sessions": S, "ours": _median(mine)}
            if ref is not None:
                row["ref"] = _median(theirs)
                row["ratio"] = {k: row["ours"][k] / row["ref"][k]
                                for k in ("rtf_mean", "first_audio_ms", "steps_per_s")
                                if row["ours"][k] and row["ref"][k]}
            result["results"].append(row)
            print(f"dsm-loop: {S} sessions done ({row['ours']['wall_s']:.1f} s ours"
                  + (f", {row['ref']['wall_s']:.1f} s ref)" if ref is not None else ")"), file=sys.stderr, flush=True)
    print(format_table(result))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


def _f(v, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def format_table(result: dict[str, Any]) -> str:
    """The results as a plain-text table (RTF: compute s per audio s, lower is better)."""
    head = (f"dsm-loop  config={result['config']}  device={result['device_name']}  n_q={result['n_q']}  "
            f"threads={result['threads']}  reference={result['reference']}")
    cols = (f"{'sess':>4}  {'side':<4}  {'steps/s':>8}  {'RTF mean':>8}  {'RTF max':>8}  "
            f"{'1st steps':>9}  {'1st ms':>8}")
    lines = [head, cols]
    for row in result["results"]:
        for side in ("ours", "ref"):
            r = row.get(side)
            if r is None:
                continue
            lines.append(f"{row['sessions']:>4}  {side:<4}  {_f(r['steps_per_s'], '8.1f')}  {_f(r['rtf_mean'], '8.3f')}  "
                         f"{_f(r['rtf_max'], '8.3f')}  {_f(r['first_audio_steps'], '9.0f')}  "
                         f"{_f(r['first_audio_ms'], '8.0f')}")
        if row.get("ratio"):
            q = row["ratio"]
            lines.append(f"{row['sessions']:>4}  {'o/r':<4}  {_f(q.get('steps_per_s'), '8.2f')}  "
                         f"{_f(q.get('rtf_mean'), '8.2f')}  {'':>8}  {'':>9}  {_f(q.get('first_audio_ms'), '8.2f')}")
    return "\n".join(lines)
