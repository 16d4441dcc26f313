"""raftgate/fair_lane.py on its own: the order of service, the bound, and what a caller who gives
up or a job that fails leaves behind. Workers are held by jobs that wait for the test to let go,
so who runs when is decided by the lane alone (no sleeps, no timing)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future

import pytest

from raftgate.errors import Err, EtcdError
from raftgate.fair_lane import FairLane


class Held:
    """Jobs that record their name when they run, and wait for ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.ran: list[str] = []
        self.running = threading.Semaphore(0)

    def job(self, name: str) -> Callable[[], str]:
        def run() -> str:
            self.ran.append(name)
            self.running.release()
            assert self.release.wait(timeout=50)
            return name
        return run


def _too_many(f: Future[str]) -> bool:
    return f.done() and not f.cancelled() and isinstance(f.exception(), EtcdError) \
        and f.exception().err is Err.TOO_MANY_REQUESTS  # type: ignore[union-attr]


@pytest.fixture
def held() -> Held:
    h = Held()
    yield h
    h.release.set()


def test_waiting_jobs_are_served_round_robin(held: Held) -> None:
    lane = FairLane("t", 1, 10, 0)
    first = lane.submit("A", held.job("A0"))
    assert held.running.acquire(timeout=30)
    jobs = [lane.submit(p, held.job(f"{p}{i}")) for p, n in (("A", 3), ("B", 2), ("C", 1)) for i in range(1, n + 1)]
    held.release.set()
    assert [f.result(timeout=30) for f in [first, *jobs]]
    assert held.ran == ["A0", "A1", "B1", "C1", "A2", "B2", "A3"]
    assert lane.pending == 0
    lane.close()


def test_a_caller_that_gives_up_frees_its_place(held: Held) -> None:
    lane = FairLane("t", 1, 1, 0)
    running = lane.submit("A", held.job("run"))
    waiting = lane.submit("A", held.job("gave up"))
    with pytest.raises(EtcdError):
        lane.submit("A", held.job("refused"))
    assert waiting.cancel()
    assert lane.pending == 1
    after = lane.submit("A", held.job("after"))
    held.release.set()
    assert (running.result(timeout=30), after.result(timeout=30)) == ("run", "after")
    assert "gave up" not in held.ran and "refused" not in held.ran
    lane.close()


def test_a_failing_job_reaches_its_caller_and_the_worker_goes_on(held: Held) -> None:
    lane = FairLane("t", 1, 4, 0)

    def boom() -> str:
        raise ValueError("no")

    running = lane.submit("A", held.job("run"))
    failing = lane.submit("A", boom)
    after = lane.submit("B", held.job("after"))
    held.release.set()
    with pytest.raises(ValueError, match="no"):
        failing.result(timeout=30)
    assert (running.result(timeout=30), after.result(timeout=30)) == ("run", "after")
    assert lane.pending == 0
    lane.close()


def test_close_cancels_waiting_jobs_and_refuses_new_ones(held: Held) -> None:
    lane = FairLane("t", 1, 4, 0)
    running = lane.submit("A", held.job("run"))
    waiting = lane.submit("B", held.job("waits"))
    lane.close()
    with pytest.raises(CancelledError):
        waiting.result(timeout=30)
    with pytest.raises(RuntimeError):
        lane.submit("A", held.job("late"))
    held.release.set()
    assert running.result(timeout=30) == "run"


def test_a_job_bigger_than_a_place_is_refused() -> None:
    lane = FairLane("t", 1, 4, 100)
    with pytest.raises(ValueError):
        lane.submit("A", lambda: "x", 101)
    assert lane.submit("A", lambda: "x", 100).result(timeout=30) == "x"
    lane.close()


def test_the_run_coroutine_frees_the_place_of_a_cancelled_caller(held: Held) -> None:
    async def go() -> None:
        lane = FairLane("t", 1, 1, 0)
        running = asyncio.ensure_future(lane.run("A", held.job("run")))
        await asyncio.to_thread(held.running.acquire, True, 30)
        waiting = asyncio.ensure_future(lane.run("A", held.job("waits")))
        for _ in range(5):
            await asyncio.sleep(0)
        assert lane.pending == 2
        waiting.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        assert lane.pending == 1
        held.release.set()
        assert await running == "run"
        assert lane.pending == 0
        lane.close()

    asyncio.run(go())


@pytest.mark.parametrize("seed", range(20))
def test_random_floods_keep_the_bound_and_the_shares(seed: int, held: Held) -> None:
    """Random submissions and give-ups from a few addresses while every worker is held: the queue
    never holds more than its bound; a refusal only ever meets an address that holds, less one, as
    many waiting places as the most any address holds; a newcomer's job is taken only by
    refusing the newest job of the address holding the most; every job admitted and kept runs."""
    rng = random.Random(seed)
    workers, limit = rng.randint(1, 3), rng.randint(0, 12)
    lane = FairLane("t", workers, limit, 0)
    running = [lane.submit("held", held.job("held")) for _ in range(workers)]
    jobs: dict[Future[str], str] = {}
    seen: set[Future[str]] = set()  # jobs already found refused
    for i in range(200):
        peer = rng.choice("ABCDE")
        if rng.random() < 0.2 and jobs:
            f = rng.choice(list(jobs))
            f.cancel()
            continue
        holding = {p: sum(1 for f, q in jobs.items() if q == p and not f.done()) for p in "ABCDE"}
        most = max(holding.values())
        try:
            f = lane.submit(peer, held.job(f"{peer}{i}"))
        except EtcdError as e:
            assert e.err is Err.TOO_MANY_REQUESTS
            assert sum(holding.values()) >= limit and holding[peer] >= most - 1
            continue
        jobs[f] = peer
        now = [f for f in jobs if not f.done()]
        assert len(now) == lane.waiting <= limit
        refused = [f for f in jobs if _too_many(f) and f not in seen]
        seen.update(refused)
        if refused:
            (victim,) = refused
            assert holding[jobs[victim]] == most and holding[peer] < most - 1
    held.release.set()
    for f in running:
        assert f.result(timeout=30) == "held"
    for f, _peer in jobs.items():
        if not f.cancelled() and not _too_many(f):
            assert f.result(timeout=30)
    assert lane.pending == 0
    lane.close()
