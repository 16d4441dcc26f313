"""raftgate/byte_queue.py: the byte budget every buffer a slow reader fills counts against (a
DoStream's outbox, the audit log's queue, a proxy watch's unanswered creates), and the FIFO bounded
in bytes that watch streams (proxy and store) fill."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftgate.byte_queue import ByteBudget, ByteQueue

# --- ByteBudget ----------------------------------------------------------------------------------

#: a producer adding an item (of 0..300 bytes) when the budget ``fits`` it or while there is
#: ``room`` (the two ways the budget's users ask), and a consumer taking the oldest item held
_ops = st.lists(st.one_of(st.tuples(st.sampled_from(("fits", "room")), st.integers(0, 300)),
                          st.tuples(st.just("take"), st.just(0))), max_size=80)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 1000), st.data(), _ops)
def test_a_budget_never_goes_negative_nor_past_its_bound_and_one_item(pause_at: int, data: st.DataObject,
                                                                       ops: list[tuple[str, int]]) -> None:
    resume_at = data.draw(st.integers(0, pause_at - 1))
    budget = ByteBudget(pause_at, resume_at)
    held: collections.deque[int] = collections.deque()
    room = True  # the model: cleared at pause_at, set at resume_at, kept in between
    for op, size in ops:
        if op == "take":
            if held:
                budget.release(held.popleft())
        elif budget.fits(size) if op == "fits" else budget.room.is_set():
            before = budget.bytes
            budget.charge(size)
            held.append(size)
            assert budget.bytes < pause_at + size  # the bound and this one item at most
            if op == "fits":
                assert before == 0 or budget.bytes < pause_at
        assert budget.bytes == sum(held) >= 0
        if budget.bytes >= pause_at:
            room = False
        elif budget.bytes <= resume_at:
            room = True
        assert budget.room.is_set() is room
        assert budget.fits(10**9) is (budget.bytes == 0)  # nothing held takes any one item


def test_a_budget_pauses_at_its_bound_and_resumes_at_resume_at() -> None:
    budget = ByteBudget(100, resume_at=30)
    budget.charge(99)
    assert budget.room.is_set() and budget.fits(0) and not budget.fits(1)
    budget.charge(1)
    assert budget.bytes == 100 and not budget.room.is_set()
    budget.release(60)
    assert budget.bytes == 40 and not budget.room.is_set()  # not yet down to resume_at
    budget.release(10)
    assert budget.room.is_set()
    budget.charge(50)  # 80: below the bound again, the room stays
    assert budget.room.is_set()


def test_resume_one_below_the_bound_gives_room_back_at_once() -> None:
    budget = ByteBudget(100, resume_at=99)
    budget.charge(150)
    assert not budget.room.is_set()
    budget.release(51)
    assert budget.room.is_set() and budget.bytes == 99


def test_a_producer_waiting_on_a_budget_is_woken_when_enough_is_released() -> None:
    async def scenario() -> None:
        budget = ByteBudget(100)
        budget.charge(100)
        woken = asyncio.get_running_loop().create_task(budget.room.wait())
        budget.release(40)
        await asyncio.sleep(0)
        assert not woken.done()  # 60 held: above half
        budget.release(10)
        await asyncio.wait_for(woken, 5)

    asyncio.run(scenario())


def test_a_budget_shared_by_threads_takes_a_threading_event() -> None:
    """The audit log's budget: the writer thread releases what it wrote (under the log's lock)."""
    budget = ByteBudget(100, resume_at=99, room=threading.Event())
    budget.charge(100)
    assert not budget.room.is_set()
    writer = threading.Thread(target=budget.release, args=(100,))
    writer.start()
    writer.join()
    assert budget.room.is_set() and budget.bytes == 0


@pytest.mark.parametrize(("pause_at", "resume_at"), [(0, None), (10, 10), (10, -1)])
def test_budget_bounds_that_make_no_sense_are_refused(pause_at: int, resume_at: int | None) -> None:
    with pytest.raises(ValueError):
        ByteBudget(pause_at, resume_at)


# --- ByteQueue -----------------------------------------------------------------------------------


def test_it_counts_bytes_not_items_and_pauses_at_the_bound() -> None:
    async def scenario() -> None:
        q: ByteQueue[bytes] = ByteQueue(pause_at=100)
        q.put_nowait(b"a" * 60)
        assert q.bytes == 60 and q.room.is_set() and q.fits(39) and not q.fits(40)
        q.put_nowait(b"b" * 40)  # reaches the bound: the producer must wait
        assert q.bytes == 100 and not q.room.is_set()
        q.put_nowait(b"c" * 500)  # a put is never refused: the producer asks fits/room first
        assert q.bytes == 600 and q.qsize() == 3

    asyncio.run(scenario())


def test_it_is_first_in_first_out_and_gives_room_back_at_resume_at() -> None:
    async def scenario() -> None:
        q: ByteQueue[bytes] = ByteQueue(pause_at=100, resume_at=30)
        for part in (b"1" * 50, b"2" * 50, b"3" * 20):
            q.put_nowait(part)
        assert not q.room.is_set()
        assert await q.get() == b"1" * 50 and q.bytes == 70 and not q.room.is_set()  # not yet down to 30
        assert q.get_nowait() == b"2" * 50 and q.bytes == 20 and q.room.is_set()
        assert await q.get() == b"3" * 20 and q.bytes == 0 and q.empty()

    asyncio.run(scenario())


def test_resume_at_is_half_the_bound_unless_given() -> None:
    async def scenario() -> None:
        q: ByteQueue[bytes] = ByteQueue(pause_at=100)
        assert q.resume_at == 50
        q.put_nowait(b"x" * 49)
        q.put_nowait(b"y" * 51)
        assert not q.room.is_set()
        q.get_nowait()  # 51 left: still above half
        assert not q.room.is_set()
        q.put_nowait(b"z")
        q.get_nowait()  # 1 left
        assert q.room.is_set()

    asyncio.run(scenario())


def test_items_that_are_not_bytes_count_nothing_and_always_get_in() -> None:
    async def scenario() -> None:
        q: ByteQueue[bytes | BaseException | None] = ByteQueue(pause_at=10)
        q.put_nowait(b"x" * 10)
        assert not q.room.is_set()
        error = RuntimeError("the stream failed")
        q.put_nowait(error)
        q.put_nowait(None)
        assert q.bytes == 10 and q.qsize() == 3
        assert await q.get() == b"x" * 10 and q.room.is_set()
        assert await q.get() is error and await q.get() is None and q.bytes == 0

    asyncio.run(scenario())


def test_an_empty_queue_takes_any_one_item() -> None:
    async def scenario() -> None:
        q: ByteQueue[bytes] = ByteQueue(pause_at=10)
        assert q.fits(1_000_000)  # a stream always moves, however large its next answer
        q.put_nowait(b"x")
        assert not q.fits(9) and q.fits(8)

    asyncio.run(scenario())


def test_a_producer_waiting_for_room_is_woken_when_the_reader_takes_enough() -> None:
    async def scenario() -> None:
        q: ByteQueue[bytes] = ByteQueue(pause_at=100)
        q.put_nowait(b"x" * 100)
        woken = asyncio.get_running_loop().create_task(q.room.wait())
        await asyncio.sleep(0)
        assert not woken.done()
        await q.get()
        await asyncio.wait_for(woken, 5)

    asyncio.run(scenario())


@pytest.mark.parametrize(("pause_at", "resume_at"), [(0, None), (10, 10), (10, -1)])
def test_bounds_that_make_no_sense_are_refused(pause_at: int, resume_at: int | None) -> None:
    with pytest.raises(ValueError):
        ByteQueue(pause_at=pause_at, resume_at=resume_at)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=40), st.integers(0, 300), st.none(), st.just("take")), max_size=60))
def test_a_size_function_charges_each_item_and_gives_all_of_it_back(ops: list[object]) -> None:
    """The proxy's watch queue charges the memory an answer takes (``size``): whatever is put and
    taken in any order, the count is what the items still queued are charged, never below zero, and
    ``peek`` leaves the next item in place."""

    def size(item: object) -> int:
        if isinstance(item, int) and not isinstance(item, bool):
            return item
        return len(item) + 16 if isinstance(item, bytes) else 0

    async def scenario() -> None:
        q: ByteQueue[object] = ByteQueue(pause_at=200, resume_at=50, size=size)
        held: collections.deque[object] = collections.deque()
        for op in ops:
            if op == "take":
                if held:
                    assert q.peek() is held[0] and q.qsize() == len(held)
                    assert q.get_nowait() is held.popleft()
            else:
                q.put_nowait(op)
                held.append(op)
            assert q.bytes == sum(size(x) for x in held) >= 0
        while held:
            assert await q.get() is held.popleft()
        assert q.bytes == 0 and q.room.is_set() and q.peek() is None

    asyncio.run(scenario())
