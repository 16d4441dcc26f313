"""raftgate/byte_queue.py: the FIFO bounded in bytes that watch streams (proxy and store) fill."""

from __future__ import annotations

import asyncio

import pytest

from raftgate.byte_queue import ByteQueue


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
