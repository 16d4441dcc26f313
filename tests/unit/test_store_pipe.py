"""The proxy's batched Do stream gives each caller what a unary Store.Do would have given it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from authstore.api.interceptors import Refusal
from authstore.api.outbox import Outbox
from authstore.api.server import check_answer_size
from protos.internal import ANSWER_PART_BYTES, STREAM_BATCH_BYTES
from protos.storepb import store_pb2
from proxy.store_client import _CHANNEL_OPTIONS
from proxy.store_pipe import NotSent, OutcomeUnknown, StorePipe
from tests.support.processes import free_port

METHOD = "/raftgate.storepb.Store/DoStream"
Behaviour = Callable[[store_pb2.DoCall], Awaitable[store_pb2.DoResult | None]]


async def _serve(port: int, behaviour: Behaviour, seen: list[bytes], *, opens_after: float = 0.0,
                 refuse: grpc.StatusCode | None = None, batch_sizes: list[int] | None = None,
                 answer_sizes: list[int] | None = None, calls_per_message: list[int] | None = None) -> grpc.aio.Server:
    """A DoStream that answers every call with ``behaviour`` as its own task (None: never); it
    opens (initial metadata) after ``opens_after`` seconds, or refuses the stream with ``refuse``.
    With ``answer_sizes``, answers are written as the store writes them (large ones in parts) and
    the size of each message is recorded there; ``calls_per_message`` records each call message's count."""

    sizes = batch_sizes if batch_sizes is not None else []

    async def do_stream(batches: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        batch_sizes = sizes
        if refuse is not None:
            await context.abort(refuse, "raftgate: internal port requires proxy credentials")
        await asyncio.sleep(opens_after)
        await context.send_initial_metadata(())
        out: asyncio.Queue[store_pb2.DoResult] = asyncio.Queue()

        async def one(call: store_pb2.DoCall) -> None:
            result = await behaviour(call)
            if result is not None:
                out.put_nowait(result)

        async def read() -> None:
            async for raw in batches:
                batch_sizes.append(len(raw))
                calls = store_pb2.DoBatch.FromString(raw).calls
                if calls_per_message is not None:
                    calls_per_message.append(len(calls))
                for call in calls:
                    seen.append(call.request)
                    asyncio.get_running_loop().create_task(one(call))

        reader = asyncio.get_running_loop().create_task(read())
        outbox = Outbox()
        try:
            while True:
                result = await out.get()
                if result.message == "abort the stream":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "Socket closed")
                if answer_sizes is None:
                    yield store_pb2.DoResultBatch(results=[result]).SerializeToString()
                    continue
                while True:
                    if result.code:
                        outbox.refuse(result)
                    else:
                        outbox.answer(result.id, result.response)
                    if out.empty():
                        break
                    result = out.get_nowait()
                while outbox:
                    message = outbox.take()
                    answer_sizes.append(len(message))
                    yield message
                    while not out.empty():
                        result = out.get_nowait()
                        if result.code:
                            outbox.refuse(result)
                        else:
                            outbox.answer(result.id, result.response)
        finally:
            reader.cancel()

    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])  # as the store
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "raftgate.storepb.Store", {"DoStream": grpc.stream_stream_rpc_method_handler(do_stream)}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


def _run(behaviour: Behaviour, scenario: Callable[[StorePipe, list[bytes]], Awaitable[None]], **serve: Any) -> None:
    async def main() -> None:
        port = free_port()
        seen: list[bytes] = []
        server = await _serve(port, behaviour, seen, **serve)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_CHANNEL_OPTIONS)  # as the proxy's
        pipe = StorePipe(channel, METHOD, None)
        try:
            await scenario(pipe, seen)
        finally:
            await pipe.close()
            await channel.close()
            await server.stop(None)

    asyncio.run(main())


def test_answers_match_their_calls_in_any_order() -> None:
    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult:
        n = int(call.request)
        await asyncio.sleep(0.001 * (10 - n))  # the first sent is answered last
        if n == 3:
            return store_pb2.DoResult(id=call.id, code=grpc.StatusCode.PERMISSION_DENIED.value[0],
                                      message="etcdserver: permission denied")
        return store_pb2.DoResult(id=call.id, response=b"answer-" + call.request)

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        results = await asyncio.gather(*(pipe.do(str(n).encode(), 5.0) for n in range(10)), return_exceptions=True)
        for n, result in enumerate(results):
            if n == 3:
                assert isinstance(result, grpc.aio.AioRpcError)
                assert (result.code(), result.details()) == (grpc.StatusCode.PERMISSION_DENIED,
                                                             "etcdserver: permission denied")
            else:
                assert result == f"answer-{n}".encode()
        assert sorted(seen) == sorted(str(n).encode() for n in range(10))

    _run(behaviour, scenario)


def test_a_broken_stream_fails_what_it_carried_and_the_next_call_reconnects() -> None:
    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult | None:
        if call.request == b"slow":
            return None  # still in flight when the stream breaks
        if call.request == b"break":
            return store_pb2.DoResult(id=call.id, message="abort the stream")
        return store_pb2.DoResult(id=call.id, response=b"ok")

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        slow = asyncio.ensure_future(pipe.do(b"slow", 5.0))
        while b"slow" not in seen:
            await asyncio.sleep(0.001)
        with pytest.raises(grpc.aio.AioRpcError) as broke:
            await pipe.do(b"break", 5.0)
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await slow
        for error in (broke.value, lost.value):
            # sent, then the connection went: the outcome is unknown
            assert error.code() == grpc.StatusCode.UNAVAILABLE and isinstance(error, OutcomeUnknown)
        assert await pipe.do(b"again", 5.0) == b"ok"

    _run(behaviour, scenario)


def test_a_deadline_ends_the_call_not_the_stream() -> None:
    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult | None:
        return None if call.request == b"never" else store_pb2.DoResult(id=call.id, response=b"ok")

    async def scenario(pipe: StorePipe, _seen: list[bytes]) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pipe.do(b"never", 0.05)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await pipe.do(b"fine", 5.0) == b"ok"

    _run(behaviour, scenario)


def test_each_call_ends_at_its_own_deadline_whatever_the_others() -> None:
    """Deadlines in any order: a short one ends its call while longer ones (queued before it, and
    many answered calls besides) still wait; the calls answered meanwhile are unaffected."""

    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult | None:
        return None if call.request.startswith(b"never") else store_pb2.DoResult(id=call.id, response=b"ok")

    async def scenario(pipe: StorePipe, _seen: list[bytes]) -> None:
        long = asyncio.ensure_future(pipe.do(b"never-long", 30.0))
        middle = asyncio.ensure_future(pipe.do(b"never-middle", 20.0))
        for _ in range(3):  # more answered calls than any bookkeeping keeps for long
            assert await asyncio.gather(*(pipe.do(b"fine", 5.0) for _ in range(400))) == [b"ok"] * 400
        short = asyncio.ensure_future(pipe.do(b"never-short", 0.05))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await short
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert not long.done() and not middle.done()
        shorter = asyncio.ensure_future(pipe.do(b"never-shorter", 0.02))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await shorter
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert not long.done() and not middle.done()
        assert await pipe.do(b"fine", 5.0) == b"ok"
        long.cancel()
        middle.cancel()

    _run(behaviour, scenario)


def test_no_store_listening_reads_as_unreached() -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
        pipe = StorePipe(channel, METHOD, None)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pipe.do(b"anything", 5.0)
            assert isinstance(err.value, NotSent)  # so the client retries it elsewhere: nothing was taken
        finally:
            await pipe.close()
            await channel.close()

    asyncio.run(main())


async def _ok(call: store_pb2.DoCall) -> store_pb2.DoResult:
    await asyncio.sleep(0.0005)
    return store_pb2.DoResult(id=call.id, response=b"ok")


def test_a_store_stopping_under_load_gives_only_unavailable() -> None:
    """However gRPC reports a stream cut under writes (INTERNAL, CANCELLED...), callers see a node
    that went away: UNAVAILABLE, retryable when the call was never sent."""

    async def main() -> None:
        port = free_port()
        seen: list[bytes] = []
        server = await _serve(port, _ok, seen)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        pipe = StorePipe(channel, METHOD, None)
        outcomes: list[BaseException | bytes] = []

        async def client(n: int) -> None:
            for i in range(200):
                try:
                    outcomes.append(await pipe.do(f"{n}-{i}".encode(), 5.0))
                except grpc.aio.AioRpcError as e:
                    outcomes.append(e)
                    return

        clients = [asyncio.ensure_future(client(n)) for n in range(32)]
        while len(seen) < 200:
            await asyncio.sleep(0.001)
        await server.stop(None)
        await asyncio.gather(*clients)
        await pipe.close()
        await channel.close()
        errors = [o for o in outcomes if isinstance(o, grpc.aio.AioRpcError)]
        assert errors, "the stop came after every client finished"
        assert {e.code() for e in errors} == {grpc.StatusCode.UNAVAILABLE}

    asyncio.run(main())


def test_a_refused_stream_reaches_every_caller_as_is() -> None:
    async def scenario(pipe: StorePipe, _seen: list[bytes]) -> None:
        results = await asyncio.gather(*(pipe.do(b"x", 5.0) for _ in range(3)), return_exceptions=True)
        for result in results:
            assert isinstance(result, grpc.aio.AioRpcError)
            assert result.code() == grpc.StatusCode.UNAUTHENTICATED
            assert not isinstance(result, NotSent | OutcomeUnknown)

    _run(_ok, scenario, refuse=grpc.StatusCode.UNAUTHENTICATED)


def test_a_call_that_expires_before_it_is_sent_is_never_sent() -> None:
    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        late = asyncio.ensure_future(pipe.do(b"given up", 0.05))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await late
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await pipe.do(b"kept", 5.0) == b"ok"
        assert seen == [b"kept"]

    _run(_ok, scenario, opens_after=0.3)


def test_large_requests_travel_in_batches_bounded_in_bytes() -> None:
    """Forty 1.5 MiB writes queued together must not become one 60 MiB message (the store's
    ports take 64 MiB at most); a single item over the bound still travels, alone."""
    sizes: list[int] = []
    big = b"v" * (3 << 19)

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        answers = await asyncio.gather(*(pipe.do(big, 10.0) for _ in range(40)), pipe.do(b"w" * (5 << 20), 10.0))
        assert answers == [b"ok"] * 41 and len(seen) == 41
        assert max(sizes) < STREAM_BATCH_BYTES + (6 << 20) and len(sizes) >= 15
        assert all(size <= STREAM_BATCH_BYTES + 64 for size in sizes if size < (5 << 20))

    _run(_ok, scenario, opens_after=0.2, batch_sizes=sizes)


@pytest.mark.parametrize("field", ["put", "range"])
def test_a_store_answer_is_never_taken_for_an_unreached_node(field: str) -> None:
    """Trust item 15: whether a call may be sent again is decided by what the pipe knows (never
    sent, or outcome unknown), not by words in a message. A store answer whose text happens to
    say "failed to connect" is that call's answer: it reaches the client once, as it is."""
    from protos.etcdserverpb import raft_internal_pb2 as ipb
    from protos.etcdserverpb import rpc_pb2
    from proxy.store_client import StoreClient

    text = "raftgate: failed to connect the backup volume"

    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult:
        return store_pb2.DoResult(id=call.id, code=grpc.StatusCode.UNAVAILABLE.value[0], message=text)

    request = (ipb.InternalRaftRequest(put=rpc_pb2.PutRequest(key=b"k", value=b"v")) if field == "put"
               else ipb.InternalRaftRequest(range=rpc_pb2.RangeRequest(key=b"k"))).SerializeToString()

    async def main() -> None:
        port = free_port()
        seen: list[bytes] = []
        server = await _serve(port, behaviour, seen)
        client = StoreClient(f"127.0.0.1:{port}")
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await client.do(request, timeout=2.0)
            assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAVAILABLE, text)
            assert len(seen) == 1
        finally:
            await client.close()
            await server.stop(None)

    asyncio.run(main())


def _sized(call: store_pb2.DoCall) -> bytes:
    """An answer of the size the request names, made of the request's first byte."""
    return call.request[:1] * int(call.request[1:])


async def _sized_answer(call: store_pb2.DoCall) -> store_pb2.DoResult:
    await asyncio.sleep(0.0005)
    return store_pb2.DoResult(id=call.id, response=_sized(call))


def test_large_answers_arrive_whole_in_bounded_parts() -> None:
    """Trust item 7: an answer far over one stream message (here 9 MiB and 5 MiB, at once with
    small ones) reaches its caller whole, and no message on the stream is larger than the bound."""
    sizes: list[int] = []

    async def scenario(pipe: StorePipe, _seen: list[bytes]) -> None:
        requests = [b"a%d" % (9 << 20), b"b5", b"c%d" % (5 << 20), *(b"d%d" % n for n in range(20))]
        answers = await asyncio.gather(*(pipe.do(r, 10.0) for r in requests))
        assert answers == [r[:1] * int(r[1:]) for r in requests]
        assert max(sizes) <= STREAM_BATCH_BYTES + 1024 and sum(sizes) > 14 << 20
        assert await pipe.do(b"e3", 5.0) == b"eee"  # the stream goes on

    _run(_sized_answer, scenario, answer_sizes=sizes)


def test_an_answer_over_the_bound_fails_its_call_alone() -> None:
    """The proxy puts an answer together in a buffer bounded in bytes: one announced larger fails
    that call alone, as etcd's server refuses a message over its limit; the others go on."""

    async def main() -> None:
        port = free_port()
        server = await _serve(port, _sized_answer, [], answer_sizes=[])
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_CHANNEL_OPTIONS)
        pipe = StorePipe(channel, METHOD, None, max_answer=2 << 20)
        try:
            huge, small, fits = await asyncio.gather(pipe.do(b"h%d" % (3 << 20), 10.0), pipe.do(b"s7", 10.0),
                                                     pipe.do(b"f%d" % (2 << 20), 10.0), return_exceptions=True)
            assert isinstance(huge, grpc.aio.AioRpcError)
            assert (huge.code(), huge.details()) == (
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "grpc: trying to send message larger than max (3145728 vs. 2097152)")
            assert small == b"sssssss" and fits == b"f" * (2 << 20)
            assert await pipe.do(b"e3", 5.0) == b"eee"
        finally:
            await pipe.close()
            await channel.close()
            await server.stop(None)

    asyncio.run(main())


def test_small_answers_pass_a_large_answer_being_written() -> None:
    """A large answer takes what room the small answers leave in each message: an answer that
    becomes ready while a large one is being written waits for one message at most."""
    outbox = Outbox()
    outbox.answer(1, b"x" * (10 * ANSWER_PART_BYTES))
    first = store_pb2.DoResultBatch.FromString(outbox.take()).results
    assert [(r.id, r.size, r.rest) for r in first] == [(1, 10 * ANSWER_PART_BYTES, False)] + [(1, 0, True)] * 3
    outbox.answer(2, b"small")
    outbox.refuse(store_pb2.DoResult(id=3, code=grpc.StatusCode.NOT_FOUND.value[0], message="no"))
    second = store_pb2.DoResultBatch.FromString(outbox.take()).results
    assert [r.id for r in second][:2] == [2, 3] and {r.id for r in second[2:]} == {1}
    rest = []
    while outbox:
        rest.extend(store_pb2.DoResultBatch.FromString(outbox.take()).results)
    assert b"".join(r.response for r in (*first, *second[2:], *rest)) == b"x" * (10 * ANSWER_PART_BYTES)


def test_the_store_refuses_an_answer_over_etcds_send_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("authstore.api.server.MAX_ANSWER_BYTES", 10)
    assert check_answer_size(b"x" * 10) == b"x" * 10
    with pytest.raises(Refusal) as err:
        check_answer_size(b"x" * 11)
    assert (err.value.code, err.value.message) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED, "grpc: trying to send message larger than max (11 vs. 10)")



def test_callers_answered_together_go_back_together(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22: four callers answered in one message come back one after another, as closed-loop
    clients do; their next calls travel in one message, not one for the first three and one for
    the last: every stream message costs the proxy and the store more than a call in it. The wait
    is bounded by RETURN_SECONDS, made long here so that only the last caller's return ends it."""
    import proxy.store_pipe as store_pipe

    monkeypatch.setattr(store_pipe, "RETURN_SECONDS", 60.0, raising=False)
    release = asyncio.Event()
    calls: list[int] = []

    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult:
        if call.request.startswith(b"first"):
            await release.wait()  # the four first calls are answered at once
        return store_pb2.DoResult(id=call.id, response=b"ok")

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        three_queued = asyncio.Event()
        queued: list[int] = []

        async def caller(i: int) -> bytes:
            assert await pipe.do(b"first-%d" % i, 10.0) == b"ok"
            if i == 3:
                await three_queued.wait()
                for _ in range(50):
                    await asyncio.sleep(0)  # loop turns: every chance to send the three without it
                return await pipe.do(b"next-3", 10.0)
            nxt = asyncio.ensure_future(pipe.do(b"next-%d" % i, 10.0))
            await asyncio.sleep(0)  # one turn: the call is queued
            queued.append(i)
            if len(queued) == 3:
                three_queued.set()
            return await nxt

        callers = [asyncio.ensure_future(caller(i)) for i in range(4)]
        while len(seen) < 4:
            await asyncio.sleep(0.01)
        before = len(calls)
        release.set()
        assert await asyncio.wait_for(asyncio.gather(*callers), 10.0) == [b"ok"] * 4
        assert calls[before:] == [4], calls

    _run(behaviour, scenario, answer_sizes=[], calls_per_message=calls)


def test_a_lone_caller_is_never_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """One caller's calls one after another go out at once, whatever the batching waits are (a
    lone request waits for nothing: the latency of one client is not traded for batches)."""
    import proxy.store_pipe as store_pipe

    monkeypatch.setattr(store_pipe, "RETURN_SECONDS", 60.0, raising=False)
    monkeypatch.setattr(store_pipe, "CORK_SECONDS", 60.0)

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        for i in range(20):
            assert await asyncio.wait_for(pipe.do(b"%d" % i, 10.0), 5.0) == b"ok"

    _run(_ok, scenario)


#: When the writer holds queued calls back (``hold_until``), every cell: (calls queued, callers
#: answered since the last message, calls out) -> "send", "return" (wait for the answered callers,
#: RETURN_SECONDS after the first answer at most) or "answer" (wait for an answer, CORK_SECONDS
#: after the last message at most).
_HOLD_TABLE = {
    ("one", "none", "none"): "send",  # a lone request
    ("one", "none", "some"): "answer",
    ("one", "fewer", "none"): "send",
    ("one", "fewer", "some"): "send",
    ("one", "more", "none"): "return",
    ("one", "more", "some"): "return",
    ("full", "none", "none"): "send",
    ("full", "none", "some"): "send",
    ("full", "fewer", "none"): "send",
    ("full", "fewer", "some"): "send",
    ("full", "more", "none"): "send",
    ("full", "more", "some"): "send",
}


@pytest.mark.parametrize("queued", ["one", "full"])
@pytest.mark.parametrize("answered", ["none", "fewer", "more"])
@pytest.mark.parametrize("out", ["none", "some"])
def test_when_the_writer_holds_calls_back_every_cell(queued: str, answered: str, out: str) -> None:
    from proxy.store_pipe import CORK_SECONDS, MAX_BATCH, RETURN_SECONDS, hold_until

    n = 1 if queued == "one" else MAX_BATCH
    returning = {"none": 0, "fewer": 1, "more": MAX_BATCH + 1}[answered]
    written_at, returned_at = 99.998, 99.999
    until = hold_until(n, returning, returned_at, 0 if out == "none" else 5, written_at)
    want = _HOLD_TABLE[(queued, answered, out)]
    assert until == {"send": 0.0, "return": returned_at + RETURN_SECONDS, "answer": written_at + CORK_SECONDS}[want]
    assert len(_HOLD_TABLE) == 2 * 3 * 2


def _held(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batching waits far longer than any test: a call sent at all was not held by them."""
    import proxy.store_pipe as store_pipe

    monkeypatch.setattr(store_pipe, "RETURN_SECONDS", 60.0)
    monkeypatch.setattr(store_pipe, "CORK_SECONDS", 60.0)


def _out_until(release: asyncio.Event, answer: str = "") -> Behaviour:
    """``out`` is answered when ``release`` is set (with ``answer`` as its message); the rest at once."""

    async def behaviour(call: store_pb2.DoCall) -> store_pb2.DoResult:
        if call.request == b"out":
            await release.wait()
            return store_pb2.DoResult(id=call.id, response=b"ok", message=answer)
        return store_pb2.DoResult(id=call.id, response=b"ok")

    return behaviour


async def _one_out(pipe: StorePipe, seen: list[bytes]) -> asyncio.Future[bytes]:
    """A call out and unanswered: a call queued now is held until an answer (or CORK_SECONDS)."""
    out = asyncio.ensure_future(pipe.do(b"out", 30.0))
    while b"out" not in seen:
        await asyncio.sleep(0.001)
    return out


def test_a_full_batch_goes_at_once_even_while_the_writer_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full batch (MAX_BATCH calls) is never held back: when it fills while the writer already
    waits for an answer (a call out, none answered), it goes then, not when the wait runs out."""
    from proxy.store_pipe import MAX_BATCH

    _held(monkeypatch)
    release = asyncio.Event()

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        out = await _one_out(pipe, seen)
        first = asyncio.ensure_future(pipe.do(b"0", 30.0))
        for _ in range(50):
            await asyncio.sleep(0)  # loop turns: the writer holds the first call back
        rest = [asyncio.ensure_future(pipe.do(b"%d" % i, 30.0)) for i in range(1, MAX_BATCH)]
        assert await asyncio.wait_for(asyncio.gather(first, *rest), 10.0) == [b"ok"] * MAX_BATCH
        release.set()
        assert await out == b"ok"

    _run(_out_until(release), scenario)


@pytest.mark.parametrize("ends", ["deadline", "cancel"])
def test_a_call_given_up_while_held_is_never_sent(monkeypatch: pytest.MonkeyPatch, ends: str) -> None:
    """A call held back by the batching waits whose deadline passes fails with DEADLINE_EXCEEDED
    then (not when the wait ends), and neither it nor a cancelled one is sent afterwards."""
    _held(monkeypatch)
    release = asyncio.Event()

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        out = await _one_out(pipe, seen)
        held = asyncio.ensure_future(pipe.do(b"given up", 0.05 if ends == "deadline" else 30.0))
        if ends == "deadline":
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(held, 10.0)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, (type(err.value), err.value, seen)
        else:
            for _ in range(50):
                await asyncio.sleep(0)
            held.cancel()
            with pytest.raises(asyncio.CancelledError):
                await held
        release.set()  # the answer ends the wait: what was held goes now, if anything
        assert await asyncio.wait_for(out, 10.0) == b"ok"
        assert await asyncio.wait_for(pipe.do(b"after", 30.0), 10.0) == b"ok"
        assert seen == [b"out", b"after"]

    _run(_out_until(release), scenario)


def test_a_stream_broken_while_calls_are_held_fails_them_as_not_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls held back when the stream breaks were never written: NotSent (the client may send
    them elsewhere), the one written is OutcomeUnknown, and the next call, on a new stream, is not
    held by anything the old stream knew."""
    _held(monkeypatch)
    release = asyncio.Event()

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        out = await _one_out(pipe, seen)
        held = [asyncio.ensure_future(pipe.do(b"held-%d" % i, 30.0)) for i in range(3)]
        for _ in range(50):
            await asyncio.sleep(0)
        release.set()  # its "answer" aborts the stream
        results = await asyncio.wait_for(asyncio.gather(out, *held, return_exceptions=True), 10.0)
        assert isinstance(results[0], OutcomeUnknown), results
        assert all(isinstance(r, NotSent) and r.code() == grpc.StatusCode.UNAVAILABLE for r in results[1:]), (
            [(type(r), r) for r in results], seen)
        assert seen == [b"out"]
        assert await asyncio.wait_for(pipe.do(b"again", 30.0), 10.0) == b"ok"
        assert seen == [b"out", b"again"]

    _run(_out_until(release, "abort the stream"), scenario)


class _WritesReturnWhen:
    """A DoStream call whose writes return only once ``returns`` is set (the store may have read
    the message by then: it can read one before its write returns to the writer)."""

    def __init__(self, call: grpc.aio.StreamStreamCall, returns: asyncio.Event, written: list[bytes]) -> None:
        self._call, self._returns, self._written = call, returns, written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._call.__aiter__()

    async def write(self, message: bytes) -> None:
        self._written.append(message)
        await self._call.write(message)
        await self._returns.wait()


def test_calls_queued_while_a_message_is_written_are_held_as_any_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls queued after the store read a message, before its write returned to the writer, wait
    for an answer as any call queued with one out does (hold_until): they are not written behind
    it, so a stream broken then fails them as NotSent. (Before: the writer wrote whatever was
    queued when a write returned, unheld; seen in a full run as the two held-call tests above
    failing once each, their held calls written: OutcomeUnknown, or answered instead of expired.)"""
    _held(monkeypatch)
    release = asyncio.Event()
    returns = asyncio.Event()
    written: list[bytes] = []
    open_call = StorePipe._open_call

    async def writes_return_when(pipe: StorePipe) -> Any:
        return _WritesReturnWhen(await open_call(pipe), returns, written)

    monkeypatch.setattr(StorePipe, "_open_call", writes_return_when)

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        out = await _one_out(pipe, seen)  # the store has it; its write has not returned
        held = [asyncio.ensure_future(pipe.do(b"held-%d" % i, 30.0)) for i in range(3)]
        for _ in range(50):
            await asyncio.sleep(0)
        returns.set()
        for _ in range(50):
            await asyncio.sleep(0)  # loop turns: the writer is back from the write, and holds them
        assert len(written) == 1, "the held calls were written behind the first message"
        release.set()  # its "answer" aborts the stream
        results = await asyncio.wait_for(asyncio.gather(out, *held, return_exceptions=True), 10.0)
        assert isinstance(results[0], OutcomeUnknown), results
        assert all(isinstance(r, NotSent) for r in results[1:]), results
        assert seen == [b"out"]

    _run(_out_until(release, "abort the stream"), scenario)


def test_an_answer_in_parts_counts_as_one_returning_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer waits for as many calls as callers were answered, not parts: a caller whose
    large answer came in many parts sends its next call at once (RETURN_SECONDS made long here)."""
    import proxy.store_pipe as store_pipe

    monkeypatch.setattr(store_pipe, "RETURN_SECONDS", 60.0)

    async def scenario(pipe: StorePipe, _seen: list[bytes]) -> None:
        for _ in range(3):
            assert await asyncio.wait_for(pipe.do(b"a%d" % (9 << 20), 30.0), 10.0) == b"a" * (9 << 20)
        assert await asyncio.wait_for(pipe.do(b"b3", 30.0), 10.0) == b"bbb"

    sizes: list[int] = []
    _run(_sized_answer, scenario, answer_sizes=sizes)
    assert len(sizes) > 4  # the large answers did come in parts


def test_two_thousand_callers_in_a_closed_loop_all_answered_in_bounded_messages() -> None:
    """Many concurrent callers, each sending its next call when answered: every call is answered,
    and no stream message carries more than MAX_BATCH calls."""
    from proxy.store_pipe import MAX_BATCH

    calls: list[int] = []

    async def scenario(pipe: StorePipe, seen: list[bytes]) -> None:
        async def caller(n: int) -> list[bytes]:
            return [await pipe.do(b"%d-%d" % (n, i), 30.0) for i in range(5)]

        results = await asyncio.wait_for(asyncio.gather(*(caller(n) for n in range(2000))), 120.0)
        assert results == [[b"ok"] * 5] * 2000
        assert len(seen) == 10000 and len(set(seen)) == 10000
        assert max(calls) <= MAX_BATCH and sum(calls) == 10000

    _run(_ok, scenario, answer_sizes=[], calls_per_message=calls)


def test_a_store_stopping_under_load_never_took_a_call_failed_as_not_sent() -> None:
    """A store going away under load, with calls held back and written: a call failed as NotSent
    never reached the store (so sending it again, as the client does, cannot apply it twice), and
    a client that sends only those again never has a request taken twice."""

    async def main() -> None:
        port = free_port()
        seen: list[bytes] = []
        server = await _serve(port, _ok, seen)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_CHANNEL_OPTIONS)
        pipe = StorePipe(channel, METHOD, None)
        not_sent: list[bytes] = []
        unknown = 0

        async def client(n: int) -> None:
            nonlocal unknown
            for i in range(100):
                request = f"{n}-{i}".encode()
                try:
                    await pipe.do(request, 5.0)
                except NotSent:
                    not_sent.append(request)
                    return
                except OutcomeUnknown:
                    unknown += 1
                    return

        clients = [asyncio.ensure_future(client(n)) for n in range(64)]
        while len(seen) < 300:
            await asyncio.sleep(0.001)
        await server.stop(None)
        await asyncio.wait_for(asyncio.gather(*clients), 30.0)
        assert not_sent or unknown, "the stop came after every client finished"
        taken = set(seen)
        assert len(taken) == len(seen)
        assert not taken & set(not_sent)
        server = await _serve(port, _ok, seen)  # the same node back: what was not sent goes again

        async def again(request: bytes) -> bytes:
            """As a client does: NotSent may be sent again (the channel may not have reconnected yet)."""
            while True:
                try:
                    return await pipe.do(request, 5.0)
                except NotSent:
                    await asyncio.sleep(0.05)  # a retry's back-off, not a wait for a condition

        try:
            assert await asyncio.wait_for(asyncio.gather(*(again(r) for r in not_sent)), 30.0) == \
                [b"ok"] * len(not_sent)
            assert len(set(seen)) == len(seen)
        finally:
            await pipe.close()
            await channel.close()
            await server.stop(None)

    asyncio.run(main())


def test_waits_counted_on_a_millisecond_clock_last_what_they_say() -> None:
    """uvloop's clock (libuv's) counts whole milliseconds: an answer at 5.0009 s reads 5.000, so a
    wait of RETURN_SECONDS counted from that reading ended up to a millisecond early (measured at
    16 clients: 3.1-3.3 calls per stream message on uvloop, 4.2-4.6 on asyncio's loop). The
    writer's times are the latest the time can be: a reading plus the clock's tick."""
    import uvloop

    import proxy.store_pipe as store_pipe

    class MillisecondLoop:
        def time(self) -> float:
            return 5.0

    assert store_pipe.now_at_the_latest(MillisecondLoop()) == pytest.approx(5.001)  # type: ignore[arg-type]
    for new_loop, tick in ((asyncio.new_event_loop, 0.0), (uvloop.new_event_loop, 0.001)):
        loop = new_loop()
        try:
            before = loop.time()
            stamp = store_pipe.now_at_the_latest(loop)
            assert before + tick <= stamp <= loop.time() + tick + 1e-6
        finally:
            loop.close()


def test_a_deadline_between_two_ticks_of_a_millisecond_clock_is_not_spun_for() -> None:
    """uvloop rounds a timer's delay to whole milliseconds: a call's deadline less than half a
    millisecond ahead got a timer of 0, which found it not yet due, armed another of 0, and so on
    until the clock ticked (hundreds of runs of the loop for one deadline, measured 423). The
    deadline still fails the call, never before it is due, with a timer or two."""
    import uvloop

    import proxy.store_pipe as store_pipe

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def never() -> grpc.aio.StreamStreamCall:  # the stream never opens: only the timer ends the call
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        stream = store_pipe._Stream(never, 1 << 20)
        runs = 0
        expire_due = stream._expire_due

        def counted() -> None:
            nonlocal runs
            runs += 1
            expire_due()

        stream._expire_due = counted  # type: ignore[method-assign]
        fut: asyncio.Future[bytes] = loop.create_future()
        stream.unsent[1] = fut
        when = loop.time() + 0.0004  # the clock reads whole milliseconds: due between two ticks
        stream.expire_at(when, 1)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await fut
        assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert loop.time() >= when
        assert runs <= 2, runs
        for task in stream.tasks:
            task.cancel()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def test_a_hold_counted_on_a_millisecond_clock_ends_on_its_tick_whatever_the_uptime() -> None:
    """uvloop's clock reads whole milliseconds since the host booted. A hold counted from such a
    reading (``now_at_the_latest`` plus RETURN_SECONDS) ends on a tick, but the sum can come out a
    float's last bit past that tick's reading (after 11.6 days of uptime: 1,000,000.001 + 0.001 +
    0.002 > 1,000,000.004, one reading in four or five): the writer found the hold not over when
    its timer fired, armed a timer of 0, and spun the loop until the next tick (a millisecond of
    busy loop and a millisecond late, for a quarter to a half of the batches on a host up for
    weeks). At the tick's reading the hold is over, whatever the uptime."""
    import proxy.store_pipe as store_pipe

    class MillisecondLoop:
        ms = 0

        def time(self) -> float:
            return self.ms / 1000

    loop = MillisecondLoop()
    missed = []
    for booted in (2_000_000, 57_000_000, 1_000_000_000, 5_000_000_000):  # 33 min to 58 days up
        for ms in range(booted, booted + 200):
            loop.ms = ms
            until = store_pipe.hold_until(1, 2, store_pipe.now_at_the_latest(loop), 0, 0.0)  # type: ignore[arg-type]
            loop.ms = ms + 2
            assert store_pipe.holding(until, loop), "ended a tick early"  # type: ignore[arg-type]
            loop.ms = ms + 3
            if store_pipe.holding(until, loop):  # type: ignore[arg-type]
                missed.append(ms)
    assert not missed, f"{len(missed)} holds of 800 missed their tick, e.g. at {missed[0]} ms"
