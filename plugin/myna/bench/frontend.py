"""Text front end cost per chunk (``myna bench frontend``): what the shared intake (markup, words,
scripts, lexicon, the normaliser) costs an LLM token chunk, on ordinary prose and on the agent
sentence set (phone numbers, addresses, dates, codes), with the normaliser on and off.

Chunks are cut as LLM tokens come (a word's leading space with it, long words in pieces of at
most four characters); each turn is a fresh :class:`myna.text.TextIntake` (``push`` per chunk,
then ``flush``, counted as a chunk). Figures are wall-clock per call on this machine, in ms.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

#: Ordinary agent prose: no digits, no addresses.
PROSE = ("Sure, I can help you with that. Let me check the status of your order for you. It looks like "
         "the package left our warehouse this morning and is on its way. You should receive an email with "
         "the tracking details shortly. Is there anything else I can help you with today? If you have "
         "questions about returns, I am happy to walk you through the steps, and I can also update your "
         "delivery address if you have moved recently.")
_TOKEN = re.compile(r"\s*[^\s]{1,4}")


def chunks_of(text: str) -> list[str]:
    """``text`` cut like an LLM's token stream."""
    return _TOKEN.findall(text)


def agent_sentences() -> list[str]:
    """The agent sentence set of the tests (tests/text/data/agent_sentences.json), if present."""
    path = Path(__file__).resolve().parents[3] / "tests" / "text" / "data" / "agent_sentences.json"
    return [s["text"] for s in json.loads(path.read_text())] if path.exists() else []


def measure(texts: list[str], rounds: int, normalise: bool) -> list[float]:
    """Per-call times (ms) of ``push`` for every chunk and ``flush`` per turn, ``rounds`` times."""
    from myna.text import TextIntake

    times: list[float] = []
    clock = time.perf_counter
    for _ in range(rounds):
        for text in texts:
            intake = TextIntake(normalise=normalise)
            for chunk in chunks_of(text):
                t0 = clock()
                intake.push(chunk)
                times.append(1000.0 * (clock() - t0))
            t0 = clock()
            intake.flush()
            times.append(1000.0 * (clock() - t0))
    return times


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def run(args) -> int:
    """Print p50 / p95 / max per chunk for prose and the agent set, normaliser on and off."""
    sets = {"prose": [PROSE]}
    agents = agent_sentences()
    if agents:
        sets["agent set"] = agents
    measure(sets["prose"], 3, True)  # (warm: imports, regex caches, pysbd)
    rows = []
    for name, texts in sets.items():
        for normalise in (True, False):
            t = measure(texts, args.rounds, normalise)
            rows.append({"text": name, "normalise": normalise, "chunks": len(t), "p50_ms": percentile(t, 0.5),
                         "p95_ms": percentile(t, 0.95), "max_ms": max(t)})
    print(f"{'text':<10} {'normalise':<9} {'chunks':>7} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for r in rows:
        print(f"{r['text']:<10} {str(r['normalise']):<9} {r['chunks']:>7} {r['p50_ms']:>8.3f} {r['p95_ms']:>8.3f} "
              f"{r['max_ms']:>8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def add_parser(subparsers) -> None:
    """Register ``frontend`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("frontend", help="text front end cost per LLM chunk (prose, agent sentences)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="passes over each text (default: %(default)s)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)
