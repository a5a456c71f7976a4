"""``myna bench dsm-loop``: the frame loop (:class:`myna.dsm.loop.FrameLoop`) against the reference's
own generation loop (``moshi`` 0.2.13 ``TTSModel.generate`` with streaming Mimi decode in its
``on_frame`` callback), on the same random-weight checkpoint of a config preset, in the same run.

For each session count S, S turns of the same text start together (all words at once, no
backpressure) and run to the end. Reported per side: steps per second (batched steps / wall),
per-session RTF (wall seconds from start to the session's end / its audio seconds; lower is
better), steps to first audio (model steps until the first kept 80 ms frame) and milliseconds to
first audio (turn start → that frame decoded). Ratios are ours / reference; for
steps/s: above 1 means ours steps faster; RTF and ms: below 1 means ours is faster.

Both sides also report **CPU ms per step**: the process's CPU time over the run divided by its
steps. On a shared machine, wall-clock steps/s moves with whatever else runs (two intra-op threads
that wait for each other suffer most); CPU time does not, so with ``--threads 1`` its ratio is the
steadier comparison.

``--join`` adds, per session count S, a session that opens while S − 1 others are running (past
their first audio): the steps it waits for a slot, and its first-audio ms beside a lone
session's (measured in the same round).

``--profile`` runs our loop once more per round, its thread under cProfile timed in that
thread's CPU time (so other processes on a shared machine do not count; the figures above come
from the runs without it), and adds, per batched step, the host time of a step split by phase (:data:`PHASES`: the text state machines, token insertion, conditioning, the
temporal transformer, the depformer's codebook loop, sampling, the token commit, Mimi decoding,
noise draws, hand-offs to sessions, and the rest of the loop's own work), and the part spent in
noise draws (``exponential_``) and copies (``copy_``, ``to``, ``cpu``, ``numpy``, ``tolist``),
and the loop's **own work**: every phase but the model's (:data:`MODEL_PHASES`).
Profiling inflates Python-heavy phases (each call is counted), so compare phases within one run.
On a GPU the step's kernels run asynchronously, so this host time is what stands between two
launches; on the CPU it also holds the compute.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
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
    p.add_argument("--join", action="store_true",
                   help="also time a session joining S - 1 running ones: steps it waits, first-audio ms")
    p.add_argument("--profile", action="store_true",
                   help="profile our loop thread: host ms per step by phase, noise draws and copies")
    p.add_argument("--json", dest="json_out", default=None, metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)
    return p


#: Host-side calls counted as noise draws and as copies in ``--profile``.
NOISE_CALLS = ("exponential_",)
COPY_CALLS = ("copy_", "to", "cpu", "numpy", "tolist")

#: ``--profile``'s phases of a loop turn: (phase, the functions whose cumulative time it is, as
#: (module file, function name)). They do not nest in one another; "loop" is the rest of
#: ``FrameLoop.tick`` (slot bookkeeping, exec masks, launching the phases).
PHASES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("state machines", (("state_machine.py", "process"),)),
    ("token insertion", (("loop.py", "_intake"),)),
    ("conditioning", (("loop.py", "_admit"),)),
    ("temporal", (("lm.py", "forward_text"),)),
    ("depformer", (("lm.py", "depformer_logits"),)),
    ("sampling", (("sampling.py", "sample_token"),)),
    ("commit", (("frame.py", "_commit"),)),
    ("mimi", (("mimi.py", "decode"),)),
    ("noise", (("loop.py", "_draw_noise"),)),
    ("hand-offs", (("loop.py", "_deliver"), ("loop.py", "_publish"))),
)


def _loop_class(profile: cProfile.Profile | None):
    from myna.dsm.loop import FrameLoop

    if profile is None:
        return FrameLoop

    class ProfiledLoop(FrameLoop):
        def _run(self) -> None:  # the loop thread's body, under the profiler
            profile.enable()
            try:
                super()._run()
            finally:
                profile.disable()

    return ProfiledLoop


#: The phases that run the model (on a GPU: kernel launches); the rest is the loop's own work.
MODEL_PHASES = ("temporal", "depformer", "sampling", "commit", "mimi")

#: What :func:`host_profile` adds to a run's figures.
PROFILE_KEYS = ("host_ms_per_step", "own_ms_per_step", "noise_ms_per_step", "copy_ms_per_step", "phases_ms")


def host_profile(profile: cProfile.Profile) -> dict[str, Any]:
    """Per batched step, from the loop thread's profile (thread CPU time): ms of the loop's turns
    (``FrameLoop.tick``, which holds ``_step``), ``phases_ms`` split by :data:`PHASES` (cumulative
    ms of their functions; "loop" is the rest of ``tick``), ``own_ms_per_step`` (all but
    :data:`MODEL_PHASES`), and the ms spent drawing noise and
    copying (tottime of :data:`NOISE_CALLS`, :data:`COPY_CALLS`)."""
    stats = pstats.Stats(profile).stats
    owner = {fn: phase for phase, fns in PHASES for fn in fns}
    steps, tick_s, noise_s, copy_s = 0, 0.0, 0.0, 0.0
    phase_s = dict.fromkeys([phase for phase, _ in PHASES], 0.0)
    for (path, _, name), (_, ncalls, tottime, cumtime, _) in stats.items():
        method = name.split("'")[1] if name.startswith("<method '") else None
        if name == "_step" and path.endswith("loop.py"):
            steps += ncalls
        elif name == "tick" and path.endswith("loop.py"):
            tick_s += cumtime
        elif method in NOISE_CALLS or name in NOISE_CALLS:
            noise_s += tottime
        elif method in COPY_CALLS:
            copy_s += tottime
        phase = owner.get((Path(path).name, name))
        if phase is not None:
            phase_s[phase] += cumtime
    per = 1000 / max(steps, 1)
    phases = {k: v * per for k, v in phase_s.items()}
    phases["loop"] = max(0.0, tick_s * per - sum(phases.values()))
    own = sum(ms for phase, ms in phases.items() if phase not in MODEL_PHASES)
    return {"host_ms_per_step": tick_s * per, "own_ms_per_step": own, "noise_ms_per_step": noise_s * per,
            "copy_ms_per_step": copy_s * per, "phases_ms": phases}


def ours_run(tts, voice, text: str, S: int, profile: bool = False) -> dict[str, Any]:
    """S concurrent sessions through a fresh FrameLoop with S slots."""
    prof = cProfile.Profile(time.thread_time) if profile else None
    loop = _loop_class(prof)(tts, max_batch=S, max_ahead_s=math.inf)
    loop.start()
    try:
        audio = [0] * S
        ended = [0.0] * S
        sessions = []
        t0, cpu0 = time.perf_counter(), time.process_time()
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
        for s in sessions:
            s.done.wait()
        wall = max(ended) - t0
        cpu = time.process_time() - cpu0
        steps = loop.steps - steps0
    finally:
        loop.close()
    rate = tts.sample_rate
    out = _summary(wall, steps, [(ended[i] - t0) / max(audio[i] / rate, 1e-9) for i in range(S)],
                   [s.first_audio_step + 1 for s in sessions if s.first_audio_step is not None],
                   [1000 * (s.first_audio_time - s.opened_at) for s in sessions if s.first_audio_time], cpu)
    if prof is not None:
        out.update(host_profile(prof))
    return out


def join_run(tts, voice, text: str, S: int) -> dict[str, Any]:
    """A session opening while S − 1 others run past their first audio (their text said four
    times, so they outlast it): the steps it waits for a slot (loop steps between its ``open`` and
    its first step, counting the step that was running when it opened) and its first-audio ms
    (open → first frame handed out)."""
    import threading

    loop = _loop_class(None)(tts, max_batch=S, max_ahead_s=math.inf)
    loop.start()
    try:
        running = []
        for i in range(S - 1):
            heard = threading.Event()
            s = loop.open(voice=voice, seed=i, on_audio=lambda pcm, heard=heard: heard.set())
            s.push_words(text.split() * 4)
            s.end_input()
            running.append((s, heard))
        for _, heard in running:
            heard.wait()
        steps_at_open = loop.steps
        joiner = loop.open(voice=voice, seed=S)
        joiner.push_words(text.split())
        joiner.end_input()
        joiner.done.wait()
        for s, _ in running:
            s.cancel()
        for s, _ in running:
            s.done.wait()
    finally:
        loop.close()
    return {"join_wait_steps": joiner.admitted_step - steps_at_open,
            "join_first_audio_ms": 1000 * (joiner.first_audio_time - joiner.opened_at)}


def on_own_thread(fn, *args):
    """``fn(*args)`` on a thread that ends with it: its result, or its exception re-raised.

    Our loop computes on a thread of its own, so the reference does too, and so does the build:
    a thread that has run a parallel op keeps an OpenMP team until it ends, and libgomp shortens
    every team's spin-wait once the process holds more OpenMP threads than cores, so a team left
    on the main thread would slow whichever side runs next (see :meth:`FrameLoop.start`)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="dsm-loop-bench") as pool:  # (its exit joins the thread)
        return pool.submit(fn, *args).result()


def ref_run(ref, voice, text: str, S: int, cfg_value: float | None) -> dict[str, Any]:
    """The reference's generate() for S entries, decoding each frame with its streaming Mimi (run
    it with :func:`on_own_thread`)."""
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

    cpu0 = time.process_time()
    with ref.mimi.streaming(S), torch.no_grad():
        result = ref.generate(entries, attrs, on_frame=on_frame)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    steps = len(result.frames) + max(ref.lm.delays)
    frame_s = 1 / ref.mimi.frame_rate
    rtf = [wall / max((end or 0) * frame_s, 1e-9) for end in result.end_steps]
    first_ms = [1000 * (state["first"] - t0)] * S if state["first"] else []
    return _summary(wall, steps, rtf, [state["first_step"]] * S if state["first_step"] else [], first_ms, cpu)


def _median(runs: list[dict]) -> dict:
    """Key-wise median of the runs' results (nested dicts key by key)."""
    out = {}
    for k in runs[0]:
        if isinstance(runs[0][k], dict):
            out[k] = _median([r[k] for r in runs])
            continue
        vals = [r[k] for r in runs if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def _summary(wall: float, steps: int, rtf: list[float], first_steps: list[int], first_ms: list[float],
             cpu_s: float) -> dict:
    return {"wall_s": wall, "steps": steps, "steps_per_s": steps / wall if wall else float("nan"),
            "cpu_ms_per_step": 1000 * cpu_s / max(steps, 1),
            "rtf_mean": statistics.mean(rtf) if rtf else float("nan"),
            "rtf_max": max(rtf) if rtf else float("nan"),
            "first_audio_steps": statistics.median(first_steps) if first_steps else None,
            "first_audio_ms": statistics.median(first_ms) if first_ms else None}


def build(config: str, folder: Path, device: str, with_ref: bool, n_q: int | None):
    """Ours and (``with_ref``) the reference's TTS on the same random weights of a config preset,
    built in memory on the device (no checkpoint is written): see :func:`wrap`."""
    import torch

    from myna.bench.dsm_step import build_pair
    from myna.dsm.config import DSMConfig

    cfg = DSMConfig.from_name(config)
    dev = torch.device(device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    (lm, mimi), ref_models = build_pair(cfg, dev, dtype, with_ref)
    return wrap(cfg, lm, mimi, ref_models, folder, n_q)


def wrap(cfg, lm, mimi, ref_models, folder: Path, n_q: int | None = None):
    """(our :class:`~myna.dsm.tts.DSMTTS`, the reference's ``TTSModel`` or None, the voice file or
    None) around models from :func:`myna.bench.dsm_step.build_pair`, with a SentencePiece model
    and a random voice written to ``folder``."""
    import sentencepiece
    import torch
    from safetensors.torch import save_file

    from myna.dsm import DSMTTS
    from myna.dsm.state_machine import INITIAL_PADDING
    from myna.bench.tiny_dsm import train_tokenizer

    tokenizer_path = folder / "tokenizer.model"
    train_tokenizer(tokenizer_path, cfg.text_card)
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=str(tokenizer_path))
    voice = None
    if cfg.cross_dim:
        voice = folder / "voice.safetensors"
        save_file({"speaker_wavs": torch.randn(1, cfg.cross_dim, 125, generator=torch.Generator().manual_seed(0))},
                  str(voice))
    # As load() and the reference's loader leave them: ours frozen, the reference's not (matmul
    # takes another path for weights that require grad; the step benchmark keeps both unfrozen).
    lm.requires_grad_(False)
    mimi.requires_grad_(False)
    tts = DSMTTS(lm, mimi, tokenizer, cfg)
    if n_q:
        tts.n_q = max(1, min(n_q, cfg.n_q))
    ref = None
    if ref_models is not None:
        from moshi.models.tts import StateMachine, TokenIds, TTSModel

        ref_lm, ref_mimi = ref_models
        ref_mimi.set_num_codebooks(tts.n_q)
        machine = StateMachine(token_ids=TokenIds(ref_lm.text_card + 1), second_stream_ahead=cfg.second_stream_ahead,
                               max_padding=8, initial_padding=INITIAL_PADDING)
        ref = TTSModel(lm=ref_lm, mimi=ref_mimi, tokenizer=tokenizer, voice_suffix="", voice_repo="",
                       machine=machine, delay_steps=cfg.delay_steps, n_q=tts.n_q)
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
        tts, ref, voice = on_own_thread(build, args.config, Path(tmp), device, with_ref, args.n_q)
        build_s = time.perf_counter() - t0
        result = measure(tts, ref, voice, counts, args.text, args.rounds, args.profile, config=args.config,
                         join=args.join)
        result["build_s"] = round(build_s, 2)
    print(format_table(result))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


def measure(tts, ref, voice, counts: list[int], text: str = TEXT, rounds: int = 1, profile: bool = False,
            config: str = "", join: bool = False) -> dict[str, Any]:
    """Ours (and the reference's, unless ``ref`` is None) at each session count, ``rounds``
    interleaved runs each (medians), and with ``join`` a joining session beside a lone one
    (:func:`join_run`): the result dict :func:`format_table` prints."""
    import torch

    device = tts.lm.device
    result: dict[str, Any] = {
        "benchmark": "dsm-loop", "config": config, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "n_q": tts.n_q, "text": text, "profile": profile, "join": join,
        "reference": "moshi 0.2.13 TTSModel.generate" if ref is not None else None,
        "cuda_graphs": device.type == "cuda" and os.environ.get("NO_CUDA_GRAPH", "") in ("", "0"),
        "results": []}
    cfg_value = float(tts.cfg_value) if tts.cfg_value else None
    for S in counts:
        mine, theirs, joins = [], [], []
        for _ in range(max(1, rounds)):  # interleaved: this machine is shared and noisy
            mine.append(ours_run(tts, voice, text, S))
            if profile:  # a run of its own: the profiler slows the loop, not the figures above
                profiled = ours_run(tts, voice, text, S, profile=True)
                mine[-1].update({k: profiled[k] for k in PROFILE_KEYS})
            if ref is not None:
                theirs.append(on_own_thread(ref_run, ref, voice, text, S, cfg_value))
            if join:
                lone, joined = join_run(tts, voice, text, 1), join_run(tts, voice, text, S)
                joins.append({**joined, "lone_first_audio_ms": lone["join_first_audio_ms"],
                              "first_audio_ratio": joined["join_first_audio_ms"] / lone["join_first_audio_ms"]})
        row: dict[str, Any] = {"sessions": S, "ours": _median(mine)}
        if joins:
            row["join"] = _median(joins)
        if ref is not None:
            row["ref"] = _median(theirs)
            row["ratio"] = {k: row["ours"][k] / row["ref"][k]
                            for k in ("rtf_mean", "first_audio_ms", "steps_per_s", "cpu_ms_per_step")
                            if row["ours"][k] and row["ref"][k]}
        result["results"].append(row)
        print(f"dsm-loop: {S} sessions done ({row['ours']['wall_s']:.1f} s ours"
              + (f", {row['ref']['wall_s']:.1f} s ref)" if ref is not None else ")"), file=sys.stderr, flush=True)
    return result


def _f(v, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def format_table(result: dict[str, Any]) -> str:
    """The results as plain-text tables (RTF: compute s per audio s, lower is better): one row per
    session count and side, then (``--profile``) host ms per step by phase with each phase's
    growth per added session, then (``--join``) the joining session beside a lone one."""
    head = (f"dsm-loop  config={result['config']}  device={result['device_name']}  n_q={result['n_q']}  "
            f"threads={result['threads']}  reference={result['reference']}")
    cols = (f"{'sess':>4}  {'side':<4}  {'steps/s':>8}  {'CPU ms':>8}  {'RTF mean':>8}  {'RTF max':>8}  "
            f"{'1st steps':>9}  {'1st ms':>8}")
    prof = result.get("profile")
    if prof:
        cols += f"  {'host ms':>8}  {'noise ms':>8}  {'copy ms':>8}"
    lines = [head, cols]
    for row in result["results"]:
        for side in ("ours", "ref"):
            r = row.get(side)
            if r is None:
                continue
            line = (f"{row['sessions']:>4}  {side:<4}  {_f(r['steps_per_s'], '8.1f')}  "
                    f"{_f(r.get('cpu_ms_per_step'), '8.2f')}  {_f(r['rtf_mean'], '8.3f')}  "
                    f"{_f(r['rtf_max'], '8.3f')}  {_f(r['first_audio_steps'], '9.0f')}  "
                    f"{_f(r['first_audio_ms'], '8.0f')}")
            if prof and "host_ms_per_step" in r:
                line += (f"  {_f(r['host_ms_per_step'], '8.2f')}  {_f(r['noise_ms_per_step'], '8.2f')}  "
                         f"{_f(r['copy_ms_per_step'], '8.2f')}")
            lines.append(line)
        if row.get("ratio"):
            q = row["ratio"]
            lines.append(f"{row['sessions']:>4}  {'o/r':<4}  {_f(q.get('steps_per_s'), '8.2f')}  "
                         f"{_f(q.get('cpu_ms_per_step'), '8.2f')}  {_f(q.get('rtf_mean'), '8.2f')}  {'':>8}  "
                         f"{'':>9}  {_f(q.get('first_audio_ms'), '8.2f')}")
    profiled = [row for row in result["results"] if "phases_ms" in row["ours"]]
    if profiled:
        counts = [row["sessions"] for row in profiled]
        lines += ["", "host ms per step by phase (ours, under the profiler)",
                  f"{'phase':<16}" + "".join(f"  {f'S={S}':>8}" for S in counts) + f"  {'per +1 S':>8}"]
        for phase in profiled[0]["ours"]["phases_ms"]:
            ms = [row["ours"]["phases_ms"][phase] for row in profiled]
            slope = (ms[-1] - ms[0]) / (counts[-1] - counts[0]) if len(counts) > 1 else None
            lines.append(f"{phase:<16}" + "".join(f"  {_f(v, '8.2f')}" for v in ms) + f"  {_f(slope, '8.3f')}")
        total = [row["ours"]["host_ms_per_step"] for row in profiled]
        slope = (total[-1] - total[0]) / (counts[-1] - counts[0]) if len(counts) > 1 else None
        lines.append(f"{'total':<16}" + "".join(f"  {_f(v, '8.2f')}" for v in total) + f"  {_f(slope, '8.3f')}")
        own = [row["ours"]["own_ms_per_step"] for row in profiled]
        slope = (own[-1] - own[0]) / (counts[-1] - counts[0]) if len(counts) > 1 else None
        lines.append(f"{'own work':<16}" + "".join(f"  {_f(v, '8.2f')}" for v in own) + f"  {_f(slope, '8.3f')}"
                     + "   (all but the model's phases)")
    joined = [row for row in result["results"] if "join" in row]
    if joined:
        lines += ["", "a session joining S - 1 running ones (ours)",
                  f"{'sess':>4}  {'waits (steps)':>13}  {'1st ms':>8}  {'lone 1st ms':>11}  {'ratio':>6}"]
        for row in joined:
            j = row["join"]
            lines.append(f"{row['sessions']:>4}  {_f(j['join_wait_steps'], '13.0f')}  "
                         f"{_f(j['join_first_audio_ms'], '8.0f')}  {_f(j['lone_first_audio_ms'], '11.0f')}  "
                         f"{_f(j['first_audio_ratio'], '6.2f')}")
    return "\n".join(lines)
