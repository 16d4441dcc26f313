"""The store's worker thread (ports.ThreadWorker): results in order, errors to the caller, and
results that finish together reach the loop with one wake-up."""

from __future__ import annotations

import asyncio
import threading

import pytest

from authstore.node.ports import ThreadWorker


def test_jobs_run_in_order_and_results_and_errors_reach_their_callers() -> None:
    worker = ThreadWorker("t")
    seen: list[int] = []

    def job(i: int) -> int:
        seen.append(i)
        if i == 3:
            raise ValueError("three")
        return i * 10

    async def main() -> list[object]:
        futs = [worker.run(job, i) for i in range(6)]
        return await asyncio.gather(*futs, return_exceptions=True)

    got = asyncio.run(main())
    worker.shutdown()
    assert seen == list(range(6))
    assert got[:3] == [0, 10, 20] and isinstance(got[3], ValueError) and got[4:] == [40, 50]


def test_results_that_finish_together_take_one_wake_up(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = ThreadWorker("t")
    gate = threading.Event()

    async def main() -> int:
        loop = asyncio.get_running_loop()
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(*args: object) -> object:
            nonlocal wakes
            wakes += 1
            return real(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(loop, "call_soon_threadsafe", counting)
        first = worker.run(gate.wait)
        rest = [worker.run(lambda i=i: i) for i in range(20)]
        finished = threading.Event()
        last = worker.run(finished.set)
        gate.set()
        finished.wait()  # the loop is busy (blocked here) while every result lands
        await asyncio.gather(first, *rest, last)
        return wakes

    wakes = asyncio.run(main())
    worker.shutdown()
    assert wakes == 1
