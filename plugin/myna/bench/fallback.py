"""``myna bench fallback``: how fast and how cleanly a turn moves to the fallback engine.

In process, on the engines' own streams (no network): the primary is the embedded Piper voice
behind an injected fault (:mod:`myna.bench.faulty`; the released DSM weights are not
available here), the fallback is the same loaded Piper voice. Per trial, interleaved:

- ``alone``: the fallback by itself: its own TTFA (text in → first audio chunk out);
- ``fails at once``: the primary raises before any audio → first audio from the fallback
  (target: ≤ the fallback's own TTFA + 50 ms, p50 against p50);
- ``never starts``: the primary hangs before any audio → first audio after the late deadline
  (target: ≤ ``--fallback-after-ms`` + the fallback's TTFA + 50 ms);
- ``fails mid-turn`` / ``stalls mid-turn``: the primary raises / hangs after ``--at-word`` words;
  Whisper tiny.en WER of the whole turn (target ≤ 0.15) and whether any word was spoken
  twice or lost (the turn's word events against the text's words; target: none).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import numpy as np

from myna.engines.base import AudioChunk, FallbackEvent, WordEvent, spoken_word

DEFAULT_TEXT = ("Thanks for calling! Your table for four is booked at seven tonight. "
                "Please arrive ten minutes early, and call us if your plans change.")
#: (case, fault, whether the fault comes mid-turn), in the order each trial runs them.
CASES = (("alone", None, False), ("fails at once", "raise", False), ("never starts", "hang", False),
         ("fails mid-turn", "raise", True), ("stalls mid-turn", "hang", True))
MARGIN_MS = 50.0
MAX_WER = 0.15


def add_parser(subparsers) -> None:
    """Register ``fallback`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("fallback", help="fallback engine: first audio after a failing or late primary, "
                                               "WER and repeated words of a turn switched mid-way",
                              description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--trials", type=int, default=8, help="turns per case (default: %(default)s)")
    p.add_argument("--text", default=DEFAULT_TEXT, help="the reply spoken in every turn")
    p.add_argument("--at-word", type=int, default=8, help="words the primary speaks before a mid-turn fault (default: %(default)s)")
    p.add_argument("--fallback-after-ms", type=float, default=500.0, help="late deadline (default: %(default)s)")
    p.add_argument("--fallback-stall-ms", type=float, default=1000.0, help="stall deadline (default: %(default)s)")
    p.add_argument("--no-wer", dest="wer", action="store_false", help="skip Whisper (WER needs the dev extra)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trials < 1 or args.at_word < 1 or len(args.text.split()) <= args.at_word:
        raise SystemExit("bench fallback: need --trials ≥ 1 and 1 ≤ --at-word < the text's words")
    whisper = None
    if args.wer:  # before the trials: a missing extra is said at once
        from myna.bench.wer import load_whisper

        whisper = load_whisper()
    result = asyncio.run(measure(args.text, args.trials, args.at_word, args.fallback_after_ms, args.fallback_stall_ms))
    if whisper is not None:
        add_wer(result, args.text, whisper)
    for case in result["cases"].values():
        case.pop("pcm")
    result["targets"] = targets(result)
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


async def measure(text: str, trials: int, at_word: int, after_ms: float, stall_ms: float) -> dict:
    """Run every case ``trials`` times, interleaved; per case the TTFA of each turn (ms), its
    word events' problems and its audio (float32 at the fallback's rate, for WER)."""
    from myna.engines.fallback import FallbackEngine
    from myna.bench.faulty import FaultyEngine
    from myna.engines.piper import PiperEngine

    piper = PiperEngine()
    await piper.start()
    expected = [spoken_word(w) for w in text.split()]
    cases = {name: {"ttfa_ms": [], "word_errors": 0, "switches": [], "pcm": []} for name, _, _ in CASES}
    try:
        for trial in range(trials + 1):  # the first round warms every path up and is not counted
            for name, fault, mid in CASES:
                engine = piper if fault is None else FallbackEngine(
                    FaultyEngine(piper, fault, at_word if mid else 0), piper, after_ms=after_ms, stall_ms=stall_ms)
                ttfa_ms, words, pcm, switches = await _turn(engine, text)
                if trial == 0:
                    continue
                case = cases[name]
                case["ttfa_ms"].append(ttfa_ms)
                case["word_errors"] += words != expected
                case["switches"] += [f"{s.reason}@{s.at_word}" for s in switches]
                case["pcm"].append(pcm)
    finally:
        await piper.close()
    return {"primary": "piper behind an injected fault (myna.bench.faulty), in process",
            "fallback": "piper (the same loaded voice)", "text": text, "trials": trials, "at_word": at_word,
            "fallback_after_ms": after_ms, "fallback_stall_ms": stall_ms, "sample_rate": piper.sample_rate,
            "cpus": os.cpu_count(), "cases": cases}


async def _turn(engine, text: str) -> tuple[float, list[str], np.ndarray, list[FallbackEvent]]:
    """One turn, the text given at once: (TTFA ms, words, audio, switches)."""
    t0 = time.perf_counter()
    stream = engine.stream()
    stream.push_text(text)
    stream.end_input()
    ttfa_ms, words, pcm, switches = None, [], [], []
    async for item in stream:
        if isinstance(item, AudioChunk):
            ttfa_ms = ttfa_ms if ttfa_ms is not None else 1000.0 * (time.perf_counter() - t0)
            pcm.append(item.pcm)
        elif isinstance(item, WordEvent):
            words.append(item.word)
        elif isinstance(item, FallbackEvent):
            switches.append(item)
    return ttfa_ms, words, np.concatenate(pcm) if pcm else np.zeros(0, np.float32), switches


def add_wer(result: dict, text: str, model) -> None:
    """Whisper tiny.en WER of every case's turns (together per case); ``model`` from
    :func:`myna.bench.wer.load_whisper`."""
    import soxr

    from myna.bench.wer import transcribe, word_error_rate

    for case in result["cases"].values():
        heard = [transcribe(model, (32767 * soxr.resample(pcm, result["sample_rate"], 48_000)).astype(np.int16))
                 for pcm in case["pcm"]]
        case["wer"] = word_error_rate([text] * len(heard), heard)
        case["heard"] = heard[0]


def _p50(values: list[float]) -> float:
    return float(np.median(values))


def targets(result: dict) -> list[dict]:
    """The issue's targets against the measured values (p50 against p50)."""
    cases = result["cases"]
    alone = _p50(cases["alone"]["ttfa_ms"])
    rows = [
        {"target": "fails at once: first audio ≤ fallback TTFA + 50 ms", "measured": _p50(cases["fails at once"]["ttfa_ms"]),
         "limit": alone + MARGIN_MS},
        {"target": "never starts: first audio ≤ after-ms + fallback TTFA + 50 ms",
         "measured": _p50(cases["never starts"]["ttfa_ms"]), "limit": result["fallback_after_ms"] + alone + MARGIN_MS},
    ]
    for name in ("fails mid-turn", "stalls mid-turn"):
        if "wer" in cases[name]:
            rows.append({"target": f"{name}: WER ≤ {MAX_WER}", "measured": cases[name]["wer"], "limit": MAX_WER})
        rows.append({"target": f"{name}: turns with a word twice or lost = 0", "measured": cases[name]["word_errors"],
                     "limit": 0})
    for row in rows:
        row["met"] = row["measured"] <= row["limit"]
    return rows


def format_table(result: dict) -> str:
    lines = [f"primary: {result['primary']}; fallback: {result['fallback']}",
             f"{result['trials']} trials per case, mid-turn faults after word {result['at_word']}, "
             f"--fallback-after-ms {result['fallback_after_ms']:g}, --fallback-stall-ms {result['fallback_stall_ms']:g}, "
             f"{result['cpus']} CPUs", "",
             f"{'case':<16} {'TTFA p50':>9} {'min':>7} {'max':>7} {'WER':>6} {'words≠':>7}  switches"]
    for name, case in result["cases"].items():
        t = case["ttfa_ms"]
        wer = f"{case['wer']:.3f}" if "wer" in case else "—"
        switches = ", ".join(sorted(set(case["switches"]))) or "—"
        lines.append(f"{name:<16} {_p50(t):>9.0f} {min(t):>7.0f} {max(t):>7.0f} {wer:>6} {case['word_errors']:>7}  {switches}")
    lines += ["", f"{'target':<62} {'measured':>9} {'limit':>8}  met"]
    for row in result["targets"]:
        fmt = (lambda v: f"{v:.0f} ms") if "TTFA" in row["target"] else (lambda v: f"{v:.3g}")
        lines.append(f"{row['target']:<62} {fmt(row['measured']):>9} {fmt(row['limit']):>8}  {'yes' if row['met'] else 'NO'}")
    return "\n".join(lines)
