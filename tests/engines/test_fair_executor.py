"""FairExecutor: groups take turns on the engine's threads."""

import asyncio
import time

from myna.engines.piper import FairExecutor


def job(name, log):
    time.sleep(0.02)
    log.append(name)
    return name


async def test_a_late_group_runs_after_at_most_one_job_of_a_busy_group():
    executor = FairExecutor(1, "test")
    log: list[str] = []
    busy = [asyncio.ensure_future(executor.run("a", job, f"a{i}", log)) for i in range(20)]
    await asyncio.sleep(0.005)
    assert await executor.run("b", job, "b", log) == "b"
    assert log.index("b") <= 2
    await asyncio.gather(*busy)
    assert [x for x in log if x != "b"] == [f"a{i}" for i in range(20)]  # a group keeps its order
    executor.shutdown()


async def test_cancelled_jobs_are_skipped_and_errors_reach_the_caller():
    executor = FairExecutor(1, "test")
    log: list[str] = []
    first = asyncio.ensure_future(executor.run("a", job, "first", log))
    dropped = [asyncio.ensure_future(executor.run("a", job, f"x{i}", log)) for i in range(5)]
    await asyncio.sleep(0.005)
    for d in dropped:
        d.cancel()
    await first

    def boom():
        raise RuntimeError("engine failed")

    try:
        await executor.run("a", boom)
        raise AssertionError("no error")
    except RuntimeError as exc:
        assert "engine failed" in str(exc)
    assert log == ["first"]
    executor.shutdown()
