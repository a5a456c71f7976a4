"""``myna bench prepare``: ``prepare`` then ``commit`` after a wait → first audio, server side.

In this process: one session on the chosen engine (Piper by default, phrase cache off), with
the paced output (:class:`~myna.audio.playout.Playout`) driven by a 20 ms pacer on the real
clock, as a WebRTC track drives it. Each round prepares one reply (``prepare`` + ``end_turn``),
lets the pacer run for ``--wait`` seconds, sends ``commit`` and measures, server side, from the
commit to the instant the pacer hands out the first frame with the turn's audio in it (what a
track sends next). It also reports whether the turn's synthesis had ended before the commit,
and ``first_audio.server_ttfa_ms`` (which counts from the commit for a prepared turn).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

REPLY = "Sure, your order ships tomorrow morning."


def add_parser(subparsers) -> None:
    """Register ``prepare`` on the ``myna bench`` sub-command parser."""
    p = subparsers.add_parser("prepare", help="prepare then commit: first audio after the commit (server side)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="turns (default: %(default)s)")
    p.add_argument("--wait", type=float, default=2.0, help="seconds between prepare and commit (default: %(default)s)")
    p.add_argument("--engine", default="piper", help="engine (default: %(default)s)")
    p.add_argument("--text", default=REPLY, help="the reply (default: one sentence)")
    p.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


async def measure(engine, rounds: int, wait: float, text: str) -> list[dict]:
    """``rounds`` prepare/commit turns on one paced session; per round: ``commit_to_frame_ms``
    (commit → first audible frame handed out), ``synthesis_done`` (its synthesis had ended at
    the commit) and ``server_ttfa_ms``."""
    from myna.audio.playout import FRAME_SECONDS, Playout
    from myna.messages import Commit, EndTurn, Text
    from myna.metrics import Metrics
    from myna.session import Session

    sent: list = []
    session = Session(engine, Playout.for_session, sent.append, Metrics())
    out: list[dict] = []
    state: dict = {}

    async def pacer() -> None:
        due = time.monotonic()
        while True:
            due += FRAME_SECONDS
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            frame = session.output.next_frame(due=due)
            if "commit" in state and "frame" not in state and frame.any():
                state["frame"] = time.monotonic()

    task = asyncio.get_running_loop().create_task(pacer())
    try:
        for i in range(rounds):
            turn_id = f"p{i}"
            state.clear()
            session.handle(Text(turn_id, text, prepare=True))
            session.handle(EndTurn(turn_id))
            await asyncio.sleep(wait)
            turn = session.output._by_id.get(turn_id)
            done = turn is not None and turn.ended
            state["commit"] = time.monotonic()
            session.handle(Commit(turn_id))
            while not any(getattr(e, "turn_id", None) == turn_id and e.type == "turn_done" for e in sent):
                await asyncio.sleep(0.05)
            ttfa = [e.server_ttfa_ms for e in sent if e.type == "first_audio" and e.turn_id == turn_id]
            out.append({"commit_to_frame_ms": round(1000.0 * (state["frame"] - state["commit"]), 2),
                        "synthesis_done": done, "server_ttfa_ms": ttfa[0] if ttfa else None})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await session.close()
    return out


def run(args) -> int:
    """Load the engine, run the rounds, print p50/p95/max; 0 on success."""
    from myna.engines.build import EngineOptions, build_engines

    async def main() -> list[dict]:
        engines = build_engines(EngineOptions(engines=args.engine, phrase_cache_mb=0.0))
        await engines.start()
        await engines.warm_up()
        return await measure(engines[args.engine], args.rounds, args.wait, args.text)

    rows = asyncio.run(main())
    lags = [r["commit_to_frame_ms"] for r in rows]
    print(f"prepare → wait {args.wait:g} s → commit, {len(rows)} turns, engine {args.engine}")
    print(f"commit → first audio frame handed out: p50 {statistics.median(lags):.1f} ms, "
          f"p95 {percentile(lags, 0.95):.1f} ms, max {max(lags):.1f} ms")
    print(f"synthesis ended before commit: {sum(r['synthesis_done'] for r in rows)}/{len(rows)}; "
          f"server_ttfa_ms p95 {percentile([r['server_ttfa_ms'] for r in rows], 0.95):.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0
