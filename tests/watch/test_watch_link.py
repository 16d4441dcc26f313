"""The proxy's client Watch streams share one Store.WatchShared stream per store node
(proxy/watch_link.py): each is a sub-stream that behaves as its own WatchBatches stream would,
a slow client's sub-stream is closed and resumed without holding the others back, and a store
without WatchShared gets one WatchBatches stream per client stream as before.

Against a fake store (an in-process gRPC server on 127.0.0.1 with raw-bytes handlers) that
records what it is sent and answers what the test scripts."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import os
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from prometheus_client import REGISTRY

from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2
from protos.storepb import store_pb2 as spb
from proxy import store_client, watch, watch_link
from proxy.identity import Identity
from proxy.store_client import StoreClient, watch_retryable
from raftgate.errors import Err
from raftgate.secret_proof import INTERNAL, Challenges, ProofCheck
from tests.support.away_store import NoAbortContext
from tests.support.processes import free_port

SERVICE = "raftgate.storepb.Store"


def batch(*responses: bytes) -> bytes:
    return spb.WatchBatch(responses=list(responses)).SerializeToString()


def part(sub: int, data: bytes = b"", **end: Any) -> spb.WatchSharedPart:
    return spb.WatchSharedPart(sub=sub, batch=data, **end)


class FakeStore:
    """WatchShared (unless ``shared`` is False) and WatchBatches; the test sends each call's answers."""

    def __init__(self, *, shared: bool = True, secret: bytes | None = None, headers: bool = True) -> None:
        self.shared = shared
        #: WatchShared opens with the store's headers (False: as a store from before them)
        self.headers = headers
        #: with a secret, calls must prove it (the store's interceptor); ``issued`` counts challenges
        self.challenges = Challenges(INTERNAL, (secret,), member_id=7) if secret else None
        self.issued = 0
        self.requests: list[spb.WatchSharedRequest] = []  # every WatchShared call's, in order
        self.plain: list[bytes] = []  # every WatchBatches request
        self.calls: list[asyncio.Queue[Any]] = []  # one per WatchShared call: what it answers
        self.plain_calls = 0
        self._changed = asyncio.Event()
        #: called with each WatchShared request as it arrives
        self.observer: Callable[[spb.WatchSharedRequest], Any] | None = None
        self.server: grpc.aio.Server | None = None
        self.port = free_port()

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self._changed.clear()
            await self._changed.wait()

    def poke(self) -> None:
        """Something the test waits on changed."""
        self._changed.set()

    def send(self, *parts: spb.WatchSharedPart, call: int = -1) -> None:
        self.calls[call].put_nowait(spb.WatchSharedBatch(parts=list(parts)).SerializeToString())

    def abort(self, code: grpc.StatusCode, details: str, call: int = -1) -> None:
        self.calls[call].put_nowait((code, details))

    def closes(self, sub: int) -> int:
        return sum(1 for r in self.requests if r.sub == sub and r.close)

    def written(self, sub: int) -> list[bytes]:
        return [r.request for r in self.requests if r.sub == sub and not r.close]

    async def _watch_shared(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        if self.headers:
            await context.send_initial_metadata(())
        out: asyncio.Queue[Any] = asyncio.Queue()
        self.calls.append(out)
        self._changed.set()

        async def take() -> None:
            async for raw in requests:
                request = spb.WatchSharedRequest.FromString(raw)
                self.requests.append(request)
                if self.observer is not None:
                    self.observer(request)
                self._changed.set()

        reader = asyncio.get_running_loop().create_task(take())
        try:
            while True:
                item = await out.get()
                if isinstance(item, tuple):
                    await context.abort(*item)
                yield item
        finally:
            reader.cancel()

    async def _watch_batches(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
        self.plain_calls += 1
        async for raw in requests:
            self.plain.append(raw)
            self._changed.set()
            yield batch(b"plain:" + raw)

    async def start(self) -> None:
        handlers = {"WatchBatches": grpc.stream_stream_rpc_method_handler(self._watch_batches)}
        if self.shared:
            handlers["WatchShared"] = grpc.stream_stream_rpc_method_handler(self._watch_shared)
        interceptors = []
        if self.challenges is not None:
            issue = self.challenges.issue

            def counted(peer: str) -> bytes:
                self.issued += 1
                return issue(peer)

            self.challenges.issue = counted  # type: ignore[method-assign]
            interceptors.append(ProofCheck(self.challenges, "refused"))
        self.server = grpc.aio.server(interceptors=interceptors)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        await self.server.start()


def run(scenario: Callable[[FakeStore, StoreClient], Awaitable[None]], *, shared: bool = True,
        secret: bytes | None = None, headers: bool = True, store_class: type[FakeStore] = FakeStore) -> None:
    async def main() -> None:
        store = store_class(shared=shared, secret=secret, headers=headers)
        await store.start()
        client = StoreClient(f"127.0.0.1:{store.port}", secret=secret.decode() if secret else None)
        try:
            await scenario(store, client)
        finally:
            await client.close()
            assert store.server is not None
            await store.server.stop(None)

    asyncio.run(asyncio.wait_for(main(), 20))  # a wait that never ends fails, not hangs


async def written(store: FakeStore, client: StoreClient, *requests: bytes) -> list[Any]:
    """One sub-stream per request, each opened, then each writing its request, once the store has them all."""
    subs = [await client.watch_streams().open() for _ in requests]
    for sub, request in zip(subs, requests, strict=True):
        await sub.write(request)
    await store.until(lambda: len(store.requests) >= len(requests))
    return subs


async def refusal(streams: store_client.WatchStreams, *, turns: int = 0) -> grpc.aio.AioRpcError:
    """What ends a new stream of ``streams`` whose node refuses it: raised by its opening, its
    first write or its first read, whichever learns it; ``turns`` loop turns between the opening
    and the write."""
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        sub = await streams.open()
        for _ in range(turns):
            await asyncio.sleep(0)
        with contextlib.suppress(grpc.aio.AioRpcError):  # a refusal known by now: the read raises it too
            await sub.write(b"create")
        await sub.read()
    return ended.value


def test_a_full_stream_is_joined_by_another_so_no_client_waits_for_room(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store serves at most WATCH_SHARED_MAX_SUBS sub-streams on one stream: past that the
    proxy opens another stream to the node (before, a proxy with more client Watch streams than
    that retried `too many requests` until RESUME_DEADLINE, then failed them)."""
    monkeypatch.setattr(watch_link, "SUBS_PER_LINK", 2)

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        subs = [await client.watch_streams().open() for _ in range(5)]
        for n, sub in enumerate(subs):
            await sub.write(b"create-%d" % n)
        await store.until(lambda: len(store.requests) == 5)
        assert len(store.calls) == 3  # 2 + 2 + 1
        subs[0].cancel()  # room again on the first stream: the next client stream goes there
        await store.until(lambda: store.closes(1) == 1)
        late = await client.watch_streams().open()
        await late.write(b"late")
        await store.until(lambda: len(store.requests) == 7)
        assert len(store.calls) == 3

    run(scenario)


def test_two_sub_streams_get_their_own_batches_in_order_on_one_stream() -> None:
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        a, b = await written(store, client, b"create-a", b"create-b")
        assert len(store.calls) == 1  # one store stream for both
        assert store.written(1) == [b"create-a"] and store.written(2) == [b"create-b"]
        store.send(part(1, batch(b"a1")), part(2, batch(b"b1")), part(1, batch(b"a2")))
        store.send(part(2, batch(b"b2")), part(1, batch(b"a3")))
        assert [spb.WatchBatch.FromString(await a.read()).responses[0] for _ in range(3)] == [b"a1", b"a2", b"a3"]
        assert [spb.WatchBatch.FromString(await b.read()).responses[0] for _ in range(2)] == [b"b1", b"b2"]

    run(scenario)


def test_sub_streams_are_numbered_in_the_order_they_first_write() -> None:
    """The store opens a sub-stream at the first request naming it and ignores a number at or
    below one it has seen: a client stream opened first but writing second must get the higher
    number (found with a real 3-node store: the second client's creates were never answered)."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        first = await client.watch_streams().open()
        second = await client.watch_streams().open()
        never = await client.watch_streams().open()
        await second.write(b"from-second")
        await first.write(b"from-first")
        await store.until(lambda: len(store.requests) == 2)
        assert [(r.sub, r.request) for r in store.requests] == [(1, b"from-second"), (2, b"from-first")]
        never.cancel()  # it never wrote: the store never heard of it, nothing to close
        third = await client.watch_streams().open()
        await third.write(b"from-third")
        await store.until(lambda: len(store.requests) == 3)
        assert store.requests[2].sub == 3 and not any(r.close for r in store.requests)

    run(scenario)


def test_an_end_part_ends_its_sub_stream_only_after_its_batches() -> None:
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        a, b = await written(store, client, b"x", b"y")
        code, message = Err.PERMISSION_DENIED.value
        store.send(part(1, batch(b"a1")), part(1, end=True, code=code.value[0], message=message),
                   part(2, batch(b"b1")))
        assert spb.WatchBatch.FromString(await a.read()).responses == [b"a1"]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await a.read()
        assert (ended.value.code(), ended.value.details()) == (code, message)
        assert spb.WatchBatch.FromString(await b.read()).responses == [b"b1"]
        await b.write(b"still")  # the stream and the other sub-stream go on
        await store.until(lambda: store.written(2) == [b"y", b"still"])
        store.send(part(2, end=True))  # code 0: closed
        assert await b.read() is grpc.aio.EOF
        a.cancel()  # ended already: nothing to tell the store
        b.cancel()
        c = await client.watch_streams().open()
        await c.write(b"c")
        await store.until(lambda: store.written(3) == [b"c"])
        assert store.closes(1) == store.closes(2) == 0

    run(scenario)


def test_cancel_closes_the_sub_stream_at_the_store_once() -> None:
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        a = await client.watch_streams().open()
        await a.write(b"x")
        await store.until(lambda: len(store.requests) == 1)
        a.cancel()
        a.cancel()
        await store.until(lambda: store.closes(1) > 0)
        b = await client.watch_streams().open()
        await b.write(b"y")
        await store.until(lambda: store.written(2) == [b"y"])
        assert store.closes(1) == 1
        store.send(part(1, batch(b"late")), part(2, batch(b"b1")))  # under way when closed: dropped
        assert spb.WatchBatch.FromString(await b.read()).responses == [b"b1"]

    run(scenario)


def test_a_client_stream_that_ends_while_its_request_is_written_leaves_the_shared_stream_open() -> None:
    """A cancelled grpc.aio write cancels its whole call: a client stream that ends (its tasks
    cancelled) while its request is under way must not end every other client's sub-stream."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        leaving, other = await written(store, client, b"x", b"y")
        writing = asyncio.get_running_loop().create_task(leaving.write(b"under way"))
        await asyncio.sleep(0)  # one turn of the loop: the write is handed to gRPC, not done
        assert not writing.done()
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        leaving.cancel()
        store.send(part(2, batch(b"o1")))
        assert spb.WatchBatch.FromString(await other.read()).responses == [b"o1"]
        await other.write(b"still")
        await store.until(lambda: store.written(2)[-1:] == [b"still"])
        assert len(store.calls) == 1

    run(scenario)


def test_a_client_stream_that_ends_while_its_watches_resume_leaves_no_sub_stream_open() -> None:
    """Between the next sub-stream's opening and its first write, the resume awaits the token's
    identity: a client stream ending meanwhile closes that sub-stream too (the link forgets it, the
    open sub-stream gauge drops back)."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        open_before = REGISTRY.get_sample_value("raftgate_proxy_watch_substreams") or 0
        resuming = asyncio.Event()

        async def identify() -> Identity:
            resuming.set()
            await asyncio.Event().wait()  # the token is being resolved when the client leaves
            raise AssertionError

        proxy = watch.WatchProxy(client, identify=identify)

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        reading = asyncio.get_running_loop().create_task(anext(stream))
        await store.until(lambda: len(store.written(1)) == 1)
        store.send(part(1, end=True))  # the sub-stream closed: the next one opens and resumes
        await resuming.wait()
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        assert REGISTRY.get_sample_value("raftgate_proxy_watch_substreams") == open_before

    run(scenario)


def test_a_sub_stream_read_too_slowly_is_closed_and_told_to_resume_while_the_others_go_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_link, "INBOX_BYTES", 1000)

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        closed_before = REGISTRY.get_sample_value("raftgate_proxy_watch_slow_closes_total") or 0
        open_before = REGISTRY.get_sample_value("raftgate_proxy_watch_substreams") or 0
        slow, other = await written(store, client, b"x", b"y")
        big = [batch(bytes([n]) * 400) for n in range(4)]
        # two fit, the third does not; what follows it for the slow one is dropped; the other one
        # gets its batch although nobody reads the slow one
        store.send(*(part(1, b) for b in big), part(2, batch(b"o1")))
        assert spb.WatchBatch.FromString(await other.read()).responses == [b"o1"]
        await store.until(lambda: store.closes(1) == 1)
        assert [await slow.read() for _ in range(2)] == big[:2]
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await slow.read()
        assert (ended.value.code(), ended.value.details()) == Err.TOO_MANY_REQUESTS.value
        assert watch_retryable(ended.value)
        streams = client.watch_streams()
        streams._down_since = 0.0  # an outage long past RESUME_DEADLINE: a slow client is none
        assert await streams.ended(ended.value, 0.0) is None
        assert streams._down_since is None
        assert REGISTRY.get_sample_value("raftgate_proxy_watch_slow_closes_total") == closed_before + 1
        assert REGISTRY.get_sample_value("raftgate_proxy_watch_substreams") == open_before + 1  # the other one
        slow.cancel()  # ended: no second close
        store.send(part(2, batch(b"o2")))
        assert spb.WatchBatch.FromString(await other.read()).responses == [b"o2"]
        assert store.closes(1) == 1

    run(scenario)


def test_a_request_waiting_to_be_written_when_its_sub_stream_is_closed_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that waits for the link's turn to write while its sub-stream is closed for a slow
    client is refused (proxy/watch.py keeps it for the next sub-stream), not written to the closed
    one, where the store would drop it unanswered."""
    monkeypatch.setattr(watch_link, "INBOX_BYTES", 1000)

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        slow = await client.watch_streams().open()
        await slow.write(b"x")
        await store.until(lambda: len(store.requests) == 1)
        link = slow.link
        async with link._lock:  # another write under way
            waiting = asyncio.get_running_loop().create_task(slow.write(b"progress"))
            await asyncio.sleep(0)  # one turn: it waits for the link's turn
            store.send(*(part(1, batch(bytes([n]) * 400)) for n in range(3)))  # the third does not fit
            while not slow.done():  # the shared reader delivers two and closes it at the third
                slow._ready.clear()
                await slow._ready.wait()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await waiting
        assert refused.value.code() == Err.TOO_MANY_REQUESTS.code
        await store.until(lambda: store.closes(1) == 1)
        assert store.written(1) == [b"x"]

    run(scenario)


def test_the_stream_breaking_ends_every_sub_stream_and_the_next_opens_a_new_one() -> None:
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        a = await client.watch_streams().open()
        b = await client.watch_streams().open()
        await a.write(b"x")
        await store.until(lambda: len(store.calls) == 1)
        store.send(part(1, batch(b"a1")))
        store.abort(grpc.StatusCode.UNAVAILABLE, "node going away")
        assert spb.WatchBatch.FromString(await a.read()).responses == [b"a1"]
        for sub in (a, b):
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await sub.read()
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert watch_retryable(ended.value)
        c = await client.watch_streams().open()
        await c.write(b"again")
        await store.until(lambda: len(store.calls) == 2 and store.written(1)[-1:] == [b"again"])
        store.send(part(1, batch(b"c1")))  # sub-stream ids start again on the new stream
        assert spb.WatchBatch.FromString(await c.read()).responses == [b"c1"]

    run(scenario)


def test_requests_refused_by_an_ended_stream_are_not_kept() -> None:
    """Every buffer bounded in bytes: while the store is away a client stream's requests are
    refused by the ended stream (proxy/watch.py keeps them, within its bound, for the next one).
    The link raised the one error that ended it for every refused write, and each raise chained the
    write's frames, with the request they held, onto that error: a proxy whose store was down kept
    every create its clients sent until the link was freed (the outage test grew by 64 MiB)."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        sub = await client.watch_streams().open()
        await sub.write(b"x")
        await store.until(lambda: len(store.calls) == 1)
        store.abort(grpc.StatusCode.UNAVAILABLE, "node going away")
        with pytest.raises(grpc.aio.AioRpcError):
            await sub.read()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(32):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await sub.write(b"%d" % i + bytes(1 << 20))
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            del refused
            gc.collect()
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert kept < 2 << 20, f"{kept >> 20} MiB of refused requests kept"

    run(scenario)


def test_a_store_without_watch_shared_gets_a_watch_batches_stream_per_client_stream() -> None:
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        streams = client.watch_streams()
        error = await refusal(streams)
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert await streams.ended(error, 0.0) is None  # opened again, not the client's error
        for _ in range(2):  # remembered: every stream from now on is a WatchBatches one
            call = await streams.open()
            await call.write(b"create")
            assert spb.WatchBatch.FromString(await call.read()).responses == [b"plain:create"]
            call.cancel()
        assert store.plain_calls == 2

    run(scenario, shared=False)


def test_a_write_that_meets_the_store_s_refusal_does_not_hide_it() -> None:
    """The store's refusal (here UNIMPLEMENTED: a store older than the proxy) in gRPC's core, not
    yet in the call's status, when the proxy writes on the stream: grpc.aio then replaces the
    status with INTERNAL ("Internal error from Core"), or raises InvalidStateError (not an
    AioRpcError) for a write just after it. So the proxy writes only once the store said the stream
    is open. Before, a write 5 to 30 loop turns after the opening ended most streams so: the node
    was not known to lack WatchShared and was asked again (found as
    test_a_node_without_watch_shared_is_asked_again_after_a_while failing once)."""

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        for turns in range(32):
            streams = client.watch_streams()
            error = await refusal(streams, turns=turns)
            assert (turns, error.code(), error.details()) == (turns, grpc.StatusCode.UNIMPLEMENTED,
                                                               "Method not found!")
            assert await streams.ended(error, 0.0) is None
            client._leader.watch_links.clear()  # forget the refusal: WatchShared is asked again

    run(scenario, shared=False)


def test_a_write_that_meets_the_stream_s_end_raises_an_error_the_client_resumes_on() -> None:
    """The store ends the shared stream (a node restarting) while a sub-stream writes, at any loop
    turn: the write raises an AioRpcError the client's stream resumes on, as every other use of
    an ended link does. Before, a write in the turns between gRPC's status and the link's reader
    raised asyncio.InvalidStateError (grpc.aio's "RPC already finished"; proxy/watch.py's writes
    happen to take any exception as a broken stream)."""

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        for turns in range(40):
            a = await client.watch_streams().open()
            await a.write(b"x")
            await store.until(lambda: bool(store.requests))
            b = await client.watch_streams().open()
            store.abort(grpc.StatusCode.UNAVAILABLE, "node restarting")
            for _ in range(turns):
                await asyncio.sleep(0)
            try:
                await b.write(b"y")
            except grpc.aio.AioRpcError as exc:
                assert watch_retryable(exc), (turns, exc)
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await a.read()
            assert watch_retryable(ended.value), (turns, ended.value)
            client._leader.watch_links.clear()
            store.requests.clear()

    run(scenario)


def test_client_streams_opening_while_a_link_starts_never_overfill_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A link starts until the store's headers are in (a round trip; OPEN_WAIT_SECONDS with a
    store that sends none): client streams opened meanwhile count toward its SUBS_PER_LINK, so
    those past it go to another link. Before (found by an attack on the change that made the
    start wait for the headers), all joined the starting link, and the store ended those past
    its WATCH_SHARED_MAX_SUBS with `too many requests` (resumed, later)."""
    monkeypatch.setattr(watch_link, "SUBS_PER_LINK", 2)
    held = asyncio.Event()

    class SlowHeaders(FakeStore):
        async def _watch_shared(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
            await held.wait()
            async for item in super()._watch_shared(requests, context):
                yield item

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        loop = asyncio.get_running_loop()
        opening = [loop.create_task(client.watch_streams().open())]
        while not client._leader.watch_links:
            await asyncio.sleep(0)
        opening += [loop.create_task(client.watch_streams().open()) for _ in range(4)]
        for _ in range(20):  # (they all reach their link's start)
            await asyncio.sleep(0)
        held.set()
        subs = await asyncio.gather(*opening)
        per_link = sorted(collections.Counter(id(sub.link) for sub in subs).values())
        assert per_link == [1, 2, 2]

    run(scenario, store_class=SlowHeaders)


def test_a_store_that_opens_watch_shared_without_headers_is_written_to_after_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A store from before the opening headers sends none until its first answer: the link waits
    OPEN_WAIT_SECONDS for them, then writes as it did before (a proxy upgraded first still serves)."""
    monkeypatch.setattr(watch_link, "OPEN_WAIT_SECONDS", 0.2)

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        sub = await client.watch_streams().open()
        await sub.write(b"create")
        await store.until(lambda: store.written(1) == [b"create"])
        store.send(part(1, batch(b"created")))
        assert spb.WatchBatch.FromString(await sub.read()).responses == [b"created"]

    run(scenario, headers=False)


def test_a_store_that_opens_watch_shared_with_its_headers_is_written_to_at_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Today's store opens WatchShared with its headers: the link never waits OPEN_WAIT_SECONDS."""
    monkeypatch.setattr(watch_link, "OPEN_WAIT_SECONDS", 60.0)  # (longer than ``run`` lets a test take)
    caplog.set_level("INFO", logger=watch_link.log.name)

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        sub = await client.watch_streams().open()
        await sub.write(b"create")
        await store.until(lambda: store.written(1) == [b"create"])

    run(scenario)
    assert not [r for r in caplog.records if "sent no headers" in r.getMessage()]


def test_a_node_without_watch_shared_is_asked_again_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node upgraded since (restarted with WatchShared) is not left on WatchBatches for good."""
    monkeypatch.setattr(store_client, "WATCH_SHARED_RETRY_SECONDS", 0.0)

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        streams = client.watch_streams()
        for _ in range(2):  # each time the interval has passed: WatchShared is asked again
            error = await refusal(streams)
            assert isinstance(streams._link, watch_link.WatchLink)  # (the error came from a link)
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED
            assert await streams.ended(error, 0.0) is None

    run(scenario, shared=False)


def test_a_shared_stream_refused_over_a_stale_challenge_is_opened_again_with_a_new_one() -> None:
    secret = b"secret-for-tests-0123456789"

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        streams = client.watch_streams()
        a = await streams.open()
        await a.write(b"x")
        await store.until(lambda: len(store.requests) == 1)
        assert store.issued == 1
        store.abort(grpc.StatusCode.UNAVAILABLE, "node restarting")
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await a.read()
        assert await streams.ended(ended.value, 0.0) is None
        assert store.challenges is not None
        issued = store.issued
        store.challenges._key = os.urandom(32)  # what a restarted store is to its callers' challenges
        # a new stream, over the challenge the proxy holds: refused as stale
        error = await refusal(streams)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await streams.ended(error, 0.0) is None  # not the client's error: asked again
        c = await streams.open()
        await c.write(b"z")
        await store.until(lambda: len(store.calls) == 2 and store.written(1)[-1:] == [b"z"])
        assert store.issued == issued + 1  # the new stream came with a new challenge

    run(scenario, secret=secret)


def test_a_link_closed_while_it_starts_tells_its_waiting_streams_to_resume() -> None:
    """A node's link closed while it asks for its challenge (the node left the member list): a
    client stream waiting for it gets a retryable error, not a cancel of its own (its session
    would end without a word, the client's stream left hanging)."""
    secret = b"secret-for-tests-0123456789"

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        opening = asyncio.get_running_loop().create_task(client.watch_streams().open())
        await asyncio.sleep(0)  # one turn: the link starts
        (link,) = client._leader.watch_links
        await link.close()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await opening
        assert watch_retryable(ended.value)

    run(scenario, secret=secret)


def _events(first: int, last: int, size: int = 300) -> bytes:
    return pb.WatchResponse(header=pb.ResponseHeader(revision=last), watch_id=0, events=[
        kv_pb2.Event(kv=kv_pb2.KeyValue(key=b"k", value=b"v" * size, mod_revision=r, create_revision=1, version=r))
        for r in range(first, last + 1)]).SerializeToString()


async def created(store: FakeStore, stream: AsyncIterator[bytes]) -> None:
    """The client stream's first watch is created on sub-stream 1 and the client has the answer."""
    first = asyncio.get_running_loop().create_task(anext(stream))
    await store.until(lambda: len(store.written(1)) == 1)
    store.send(part(1, batch(pb.WatchResponse(header=pb.ResponseHeader(revision=1), watch_id=0,
                                              created=True).SerializeToString())))
    assert pb.WatchResponse.FromString(await first).created


@pytest.fixture
def slow_client_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small bounds, so that a client reading nothing fills its sub-stream's inbox in 30 answers."""
    monkeypatch.setattr(watch_link, "INBOX_BYTES", 4000)
    monkeypatch.setattr(watch, "CLIENT_BUFFER_BYTES", 1000)


async def reading_until(store: FakeStore, stream: AsyncIterator[bytes], condition: Callable[[], bool]) -> None:
    """The client reads everything (it has room again) until ``condition`` holds at the store."""
    async def read() -> None:
        while True:
            await anext(stream)

    reader = asyncio.get_running_loop().create_task(read())
    try:
        await store.until(condition)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


@pytest.mark.usefixtures("slow_client_bounds")
def test_a_client_too_slow_for_its_sub_stream_resumes_only_once_it_has_room_and_misses_nothing() -> None:
    """The proxy's Watch stream over a sub-stream: a client that stops reading lets its sub-stream
    overflow (closed at the store); the watch resumes on a new sub-stream only once the client
    took some of what the proxy held, from the first revision it had not been given, and the
    client sees every event once, in order."""

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        proxy = watch.WatchProxy(client)

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        got: list[int] = []
        taken_at_resume: list[int] = []
        store.observer = lambda r: taken_at_resume.append(len(got)) if r.sub == 2 and not taken_at_resume else None
        await created(store, stream)
        last = 31
        store.send(*(part(1, batch(_events(r, r))) for r in range(2, last + 1)))  # the client reads none
        await store.until(lambda: store.closes(1) == 1)
        assert {r.sub for r in store.requests} == {1}  # no resume while the client has no room

        async def read() -> None:
            while True:
                answer = pb.WatchResponse.FromString(await anext(stream))
                got.extend(e.kv.mod_revision for e in answer.events)
                store.poke()

        reader = asyncio.get_running_loop().create_task(read())
        await store.until(lambda: bool(store.written(2)))
        resumed = spb.WatchStreamRequest.FromString(store.written(2)[0])
        assert resumed.resume and taken_at_resume[0] > 0
        start = resumed.request.create_request.start_revision
        assert 2 < start < last  # what the sub-stream held, not what was dropped
        store.send(part(2, batch(_events(start, last))))
        await store.until(lambda: bool(got) and got[-1] == last)
        assert got == list(range(2, last + 1))  # each once, in order
        assert {r.sub for r in store.requests} == {1, 2}  # one resume, no spinning
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await stream.aclose()

    run(scenario)


@pytest.mark.usefixtures("slow_client_bounds")
def test_a_request_sent_while_a_slow_clients_sub_stream_was_closed_is_sent_on_the_next_one() -> None:
    """Between its sub-stream's close (the client read too slowly) and the resume, a client's
    progress request reaches the store on the new sub-stream, once."""
    progress = pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        proxy = watch.WatchProxy(client)
        send_progress = asyncio.Event()
        taken: list[bytes] = []

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            await send_progress.wait()
            yield progress
            taken.append(progress)  # the proxy handled it and asks for the next
            store.poke()
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        await created(store, stream)
        store.send(*(part(1, batch(_events(r, r))) for r in range(2, 32)))  # the client reads none
        await store.until(lambda: store.closes(1) == 1)
        send_progress.set()
        await store.until(lambda: bool(taken))

        await reading_until(store, stream, lambda: len(store.written(2)) >= 2)
        assert [spb.WatchStreamRequest.FromString(w).request.SerializeToString() for w in store.written(2)[1:]] == [
            progress]
        assert progress not in [spb.WatchStreamRequest.FromString(w).request.SerializeToString()
                                for w in store.written(1)]
        await stream.aclose()

    run(scenario)


@pytest.mark.usefixtures("slow_client_bounds")
def test_a_progress_request_whose_answer_a_slow_clients_closed_sub_stream_dropped_is_asked_again() -> None:
    """A progress request written before the sub-stream was closed for its slow client, whose
    answer came after the close (dropped with the rest): the resumed sub-stream asks again, so
    the client gets its answer as from its own WatchBatches stream."""
    progress = pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        proxy = watch.WatchProxy(client)
        send_progress = asyncio.Event()

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            await send_progress.wait()
            yield progress
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        await created(store, stream)
        send_progress.set()
        await store.until(lambda: len(store.written(1)) == 2)  # asked on the first sub-stream
        answer = pb.WatchResponse(header=pb.ResponseHeader(revision=31), watch_id=-1).SerializeToString()
        store.send(*(part(1, batch(_events(r, r))) for r in range(2, 32)), part(1, batch(answer)))
        await store.until(lambda: store.closes(1) == 1)  # the client reads none: the answer is dropped

        await reading_until(store, stream, lambda: len(store.written(2)) >= 2)
        assert [spb.WatchStreamRequest.FromString(w).request.SerializeToString() for w in store.written(2)[1:]] == [
            progress]
        await stream.aclose()

    run(scenario)


def held_outage(client: StoreClient) -> tuple[asyncio.Event, asyncio.Event]:
    """Once a store stream ends, the proxy looks for the leader: ``outage`` is set then, and the
    outage (no store stream) lasts until the test sets ``back``."""
    outage, back = asyncio.Event(), asyncio.Event()

    async def rediscover() -> None:
        outage.set()
        await back.wait()

    client._rediscover = rediscover  # type: ignore[method-assign]
    return outage, back


_CANCEL_0 = pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=0))
_CANCEL_1 = pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=1))
_CREATE_J = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"j"))
_PROGRESS = pb.WatchRequest(progress_request=pb.WatchProgressRequest())


@pytest.mark.parametrize("during, resent", [
    # a cancel of the open watch: it was kept twice (held, and as a watch being canceled) and sent
    # twice on the next stream
    ([_CANCEL_0, _PROGRESS], [("create_request", 0), ("cancel_request", 0), ("progress_request", 0)]),
    # a cancel of no watch, sent while no create was unanswered, is held and passed on once; the
    # next stream sent it after a create the client sent later, which the store may give that id
    ([_CANCEL_1, _CREATE_J, _PROGRESS],
     [("create_request", 0), ("cancel_request", 1), ("create_request", 0), ("progress_request", 0)]),
], ids=["cancel-of-the-open-watch", "cancel-of-no-watch-then-a-create"])
def test_what_a_client_sends_while_the_proxy_has_no_store_stream_reaches_the_next_once_in_order(
        during: list[pb.WatchRequest], resent: list[tuple[str, int]]) -> None:
    """The client has watch 0 open when the store stream ends; what it sends before another comes
    reaches the next stream once, where the client's order matters (the progress request, not
    answered, is asked last)."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        outage, back = held_outage(client)
        send = asyncio.Event()
        taken: list[bytes] = []

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            await send.wait()
            for request in during:
                yield request.SerializeToString()
                taken.append(request.SerializeToString())
            store.poke()
            await asyncio.Event().wait()  # the client stays

        stream = watch.WatchProxy(client).serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        await created(store, stream)
        before = len(store.written(1))  # (the next stream's sub-stream has the same number, 1)
        store.abort(grpc.StatusCode.UNAVAILABLE, "node going away")
        await outage.wait()
        send.set()
        await store.until(lambda: len(taken) == len(during))
        back.set()
        await store.until(lambda: len(store.calls) == 2 and any(
            spb.WatchStreamRequest.FromString(w).request.HasField("progress_request") for w in store.written(1)))
        sent = [spb.WatchStreamRequest.FromString(w).request for w in store.written(1)[before:]]
        got = [(r.WhichOneof("request_union"), r.cancel_request.watch_id if r.HasField("cancel_request")
                else r.create_request.watch_id) for r in sent]
        assert got == resent, sent
        await stream.aclose()

    run(scenario)


def test_cancels_of_watches_the_stream_never_had_are_not_kept_nor_sent_again_on_the_next_sub_stream() -> None:
    """etcd answers nothing to a cancel of a watch id the stream does not have, so nothing ever
    took such an id off the proxy's list of watches being canceled: a client sending cancels of
    unknown ids grew the proxy's memory without bound (an int per cancel, for the stream's life),
    and every resume re-sent all of them to the store (a burst past the store's bound of one
    sub-stream's unread requests). Only cancels of watches the store may have are kept."""
    unknown = 4_000

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        proxy = watch.WatchProxy(client)
        progress = pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()
        resumed = asyncio.Event()

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            for watch_id in range(1000, 1000 + unknown):
                yield pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id)).SerializeToString()
            yield progress  # the last before the resume
            await resumed.wait()
            yield progress  # the first after it
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        gc.collect()
        tracemalloc.start()
        try:
            await created(store, stream)
            await store.until(lambda: len(store.requests) == 2 + unknown)  # (all of sub-stream 1)
            gc.collect()
            kept = sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, watch.__file__)]).statistics("filename"))
        finally:
            tracemalloc.stop()
        assert kept < 128 << 10, f"{kept >> 10} KiB kept for {unknown} cancels of unknown watches"
        store.send(part(1, end=True))  # the sub-stream ended (closed): the watch resumes on the next
        await store.until(lambda: len(store.written(2)) >= 1)
        resumed.set()
        # (the first progress had no answer: asked again by the resume; the second is the client's)
        await store.until(lambda: sum(1 for r in store.requests[-2:] if r.sub == 2 and (
            spb.WatchStreamRequest.FromString(r.request).request.HasField("progress_request"))) == 2)
        sent = [spb.WatchStreamRequest.FromString(w).request for w in store.written(2)]
        assert [r.WhichOneof("request_union") for r in sent] == ["create_request", *["progress_request"] * 2], (
            f"{sum(1 for r in sent if r.HasField('cancel_request'))} cancels of unknown watches sent again")
        assert sent[0].create_request.watch_id == 0
        await stream.aclose()

    run(scenario)


def test_cancels_of_unknown_watches_while_a_create_is_unanswered_count_against_the_unsent_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """While a create is unanswered, a cancel of any id may be for the watch it makes, so it is
    kept; a client that keeps a create unanswered and sends cancels of unknown ids is read no
    further past ``UNSENT_BYTES`` (an int kept per cancel, without bound, before), and is read
    again once the create is answered (the cancels that did not name its watch are forgotten)."""
    monkeypatch.setattr(watch, "UNSENT_BYTES", 16 << 10)
    cancels = 5_000

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        proxy = watch.WatchProxy(client)
        sent: list[int] = []

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"j")).SerializeToString()
            for watch_id in range(1000, 1000 + cancels):
                yield pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id)).SerializeToString()
                sent.append(watch_id)
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        await created(store, stream)  # the first create answered, the second not
        await store.until(lambda: len(store.written(1)) >= 100)
        for _ in range(3000):  # turns of the loop: the proxy reads the client as far as it may
            await asyncio.sleep(0)
        assert len(sent) < cancels // 5, f"{len(sent)} cancels read while a create was unanswered"
        second = asyncio.get_running_loop().create_task(anext(stream))
        store.send(part(1, batch(pb.WatchResponse(header=pb.ResponseHeader(revision=1), watch_id=1,
                                                  created=True).SerializeToString())))
        assert pb.WatchResponse.FromString(await second).watch_id == 1
        await store.until(lambda: len(store.requests) == 2 + cancels)  # (all of sub-stream 1)
        await stream.aclose()

    run(scenario)


def test_a_write_under_way_when_the_link_is_closed_raises_its_error_not_a_cancel() -> None:
    """A link is closed when its node stops leading (or leaves): a client stream's write under
    way then must fail as a write to an ended stream does (an AioRpcError: proxy/watch.py keeps
    the request for the next sub-stream), not raise CancelledError into the client stream's
    reader, which ended it: that client's later requests were never read."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        sub = await client.watch_streams().open()
        await sub.write(b"x")
        await store.until(lambda: len(store.requests) == 1)
        writing = asyncio.get_running_loop().create_task(sub.write(bytes(3 << 20)))
        await asyncio.sleep(0)  # one turn of the loop: the write is handed to gRPC, not done
        assert not writing.done()
        await sub.link.close()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await writing
        assert watch_retryable(refused.value)

    run(scenario)


def test_a_client_whose_request_is_under_way_when_the_link_is_closed_is_still_read() -> None:
    """The same through proxy/watch.py: the client's request under way when its link closes is
    sent again on the next sub-stream, and the client's next request is read and sent there too."""
    async def scenario(store: FakeStore, client: StoreClient) -> None:
        proxy = watch.WatchProxy(client)
        go, send_big = asyncio.Event(), asyncio.Event()
        big = pb.WatchRequest(create_request=pb.WatchCreateRequest(key=bytes(3 << 20))).SerializeToString()
        progress = pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()

        async def requests() -> AsyncIterator[bytes]:
            yield pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")).SerializeToString()
            await send_big.wait()
            yield big
            await go.wait()
            yield progress
            await asyncio.Event().wait()  # the client stays

        stream = proxy.serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        first = asyncio.get_running_loop().create_task(anext(stream))
        await store.until(lambda: len(store.written(1)) == 1)
        link = client._leader.watch_links[0]
        answered = link._writing
        send_big.set()
        while link._writing is answered or link._writing is None or link._writing.done():
            await asyncio.sleep(0)  # until the big create is handed to gRPC
        await link.close()  # (its node stopped leading)
        await store.until(lambda: len(store.calls) == 2)  # the watch resumes on the next stream
        go.set()

        def last() -> bytes:
            return spb.WatchStreamRequest.FromString(store.requests[-1].request).request.SerializeToString()

        await store.until(lambda: last() == progress)
        sent = [spb.WatchStreamRequest.FromString(r.request).request.SerializeToString()
                for r in store.requests[-3:]]
        assert sent[-2] == big  # the resumed watch, the create under way, the next request
        assert pb.WatchRequest.FromString(sent[-3]).create_request.key == b"k"
        first.cancel()
        await asyncio.gather(first, return_exceptions=True)
        await stream.aclose()

    run(scenario)


@pytest.mark.parametrize("answered, resent", [
    (True, ["create_request", "create_request", "progress_request"]),
    (False, ["create_request", "cancel_request", "create_request", "progress_request"]),
], ids=["creates-answered", "nothing-answered"])
def test_a_cancel_of_an_id_not_open_never_cancels_a_watch_a_later_create_makes(
        answered: bool, resent: list[str]) -> None:
    """A client sends create a, a cancel of id 1 (not open), create b: the store ignores the cancel
    (as etcd) and gives b id 1. The cancel is kept while a create sent before it is unanswered (a
    may make that id). Two ways the next sub-stream canceled b, which the client never canceled:
    the cancel was judged only once *every* create was answered (b made 1: kept for good), and a
    resume sent every unanswered create before the kept cancels (b could be given 1 before it)."""
    def create(key: bytes) -> bytes:
        return pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)).SerializeToString()

    def created_as(watch_id: int) -> spb.WatchSharedPart:
        return part(1, batch(pb.WatchResponse(header=pb.ResponseHeader(revision=1), watch_id=watch_id,
                                              created=True).SerializeToString()))

    async def scenario(store: FakeStore, client: StoreClient) -> None:
        async def requests() -> AsyncIterator[bytes]:
            yield create(b"a")
            yield pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=1)).SerializeToString()
            yield create(b"b")
            # not answered: asked again last on the next sub-stream, after every create and cancel
            yield pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()
            await asyncio.Event().wait()  # the client stays

        stream = watch.WatchProxy(client).serve(Identity("bob", 1), requests(), NoAbortContext())  # type: ignore[arg-type]
        first = asyncio.get_running_loop().create_task(anext(stream))  # (the stream runs once read)
        await store.until(lambda: len(store.written(1)) == 4)
        if answered:
            store.send(created_as(0), created_as(1))
            assert pb.WatchResponse.FromString(await first).watch_id == 0
            assert pb.WatchResponse.FromString(await anext(stream)).watch_id == 1
        store.send(part(1, end=True))  # the sub-stream ended: what it carried goes on the next
        await store.until(lambda: any(spb.WatchStreamRequest.FromString(w).request.HasField("progress_request")
                                      for w in store.written(2)))
        sent = [spb.WatchStreamRequest.FromString(w).request for w in store.written(2)]
        assert [r.WhichOneof("request_union") for r in sent] == resent, sent
        if not first.done():
            first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await stream.aclose()

    run(scenario)


