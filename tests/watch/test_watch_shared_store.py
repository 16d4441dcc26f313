"""Store.WatchShared (issue 22): the client Watch streams of one proxy as sub-streams of one store
stream, each served exactly as a WatchBatches stream of its own would be.

One store (auth off, the central secret and a sidecar secret, its metrics), called straight at its
internal port as a proxy would: two sub-streams number their watches each from 0 and get only their
own events; a sub-stream that fails ends alone, with its status in an end part, the others go on;
a closed sub-stream's watches are gone, and so are all of them once the shared stream ends; a
request naming sub-stream 0, or one that does not decode, ends the whole stream (a proxy's bug).
The bounds with small caps (the open sub-streams, one sub-stream's unread requests) are checked
on the demultiplexer itself (authstore/api/watch/shared.py) with a stand-in for the hub's serving.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest

from authstore.api.watch import shared
from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb
from raftgate.errors import STREAM_UNMARSHAL_ERROR_PREFIX, Err
from raftgate.secret_proof import proving_channel
from tests.support.cluster import unstarted_cluster
from tests.support.probes import sample, scrape
from tests.support.processes import SECRET, Program, free_port, store_program, wait_for

SIDECAR_SECRET = "sidecar-secret-for-shared-watch-tests-0123456789"
WATCH_SHARED = "/raftgate.storepb.Store/WatchShared"
DO = "/raftgate.storepb.Store/Do"
PUT = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_name["put"].number
OPEN_WATCHES = "raftgate_store_open_watches"
TOO_MANY = (Err.TOO_MANY_REQUESTS.code.value[0], Err.TOO_MANY_REQUESTS.message)


@dataclass
class Setup:
    store: str
    metrics: str
    program: Program


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work: Path = tmp_path_factory.mktemp("watch-shared")
    (work / "sidecar-secret").write_text(SIDECAR_SECRET)
    metrics = f"127.0.0.1:{free_port()}"
    store, internal = store_program(work, "--sidecar-secret-file", str(work / "sidecar-secret"),
                                    "--metrics-addr", metrics)
    store.start()
    try:
        s = Setup(internal, metrics, store)
        wait_for(lambda: _put(s, b"ready", b"1", check=False), 30, "the store to take writes")
        yield s
    finally:
        store.stop()


@pytest.fixture(autouse=True)
def _no_watch_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test against the shared store starts with no watch open (the ones before it ended
    theirs: their streams' watches are removed as the store notices the end, not at once)."""
    if "setup" in request.fixturenames:
        setup: Setup = request.getfixturevalue("setup")
        wait_for(lambda: _open_watches(setup) == 0, 20, "the earlier tests' watches to go")
    yield


def _put(setup: Setup, key: bytes, value: bytes, *, check: bool = True) -> bool:
    """A put straight at the store, as a central proxy sends it (auth is off: no user stamped)."""
    with grpc.insecure_channel(setup.store) as base:
        call = proving_channel(base, SECRET).unary_unary(DO, request_serializer=None, response_deserializer=None)
        body = wire.build_internal_request(None, PUT, pb.PutRequest(key=key, value=value).SerializeToString())
        try:
            call(body, timeout=10)
        except grpc.RpcError:
            if check:
                raise
            return False
    return True


def _open_watches(setup: Setup) -> float:
    return sample(scrape(setup.metrics), OPEN_WATCHES)


def _create(key: bytes, **fields: Any) -> spb.WatchStreamRequest:
    return spb.WatchStreamRequest(request=pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key, **fields)))


class Shared:
    """One WatchShared stream straight at the store, its requests sent as they come."""

    def __init__(self, store: str, secret: str = SECRET) -> None:
        self._channel = grpc.insecure_channel(store)
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        method = proving_channel(self._channel, secret).stream_stream(
            WATCH_SHARED, request_serializer=None, response_deserializer=None)
        self._answers = method(iter(self._requests.get, None), timeout=60)
        #: every WatchResponse of each sub-stream, in order
        self.responses: dict[int, list[pb.WatchResponse]] = {}
        #: each ended sub-stream's end part
        self.ends: dict[int, spb.WatchSharedPart] = {}

    def raw(self, data: bytes) -> None:
        self._requests.put(data)

    def send(self, sub: int, request: spb.WatchStreamRequest | bytes | None = None, close: bool = False) -> None:
        data = request.SerializeToString() if isinstance(request, spb.WatchStreamRequest) else request or b""
        self.raw(spb.WatchSharedRequest(sub=sub, request=data, close=close).SerializeToString())

    def until(self, done: Any) -> None:
        """Reads the stream until ``done()`` holds."""
        while not done():
            raw = next(self._answers)
            for part in spb.WatchSharedBatch.FromString(raw).parts:
                assert part.sub not in self.ends, f"a part after sub-stream {part.sub} ended: {part}"
                if part.end:
                    self.ends[part.sub] = part
                else:
                    self.responses.setdefault(part.sub, []).extend(
                        pb.WatchResponse.FromString(r) for r in spb.WatchBatch.FromString(part.batch).responses)

    def created(self, sub: int) -> list[int]:
        return [r.watch_id for r in self.responses.get(sub, []) if r.created]

    def events(self, sub: int) -> list[tuple[int, bytes, bytes]]:
        return [(r.watch_id, e.kv.key, e.kv.value) for r in self.responses.get(sub, []) for e in r.events]

    def ended_with(self) -> tuple[grpc.StatusCode, str]:
        """How the whole stream ended (it must end)."""
        try:
            while True:
                next(self._answers)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        except StopIteration:
            return grpc.StatusCode.OK, ""

    def close(self) -> None:
        self._requests.put(None)
        self._answers.cancel()
        self._channel.close()


def test_each_sub_stream_has_its_own_watch_ids_and_events(setup: Setup) -> None:
    s = Shared(setup.store)
    try:
        s.send(1, _create(b"two/a"))
        s.send(1, _create(b"two/b"))
        s.send(2, _create(b"two/a"))
        s.until(lambda: len(s.created(1)) == 2 and len(s.created(2)) == 1)
        assert (sorted(s.created(1)), s.created(2)) == ([0, 1], [0])
        _put(setup, b"two/a", b"1")
        _put(setup, b"two/b", b"2")
        s.until(lambda: len(s.events(1)) == 2 and len(s.events(2)) == 1)
        assert sorted(s.events(1)) == [(0, b"two/a", b"1"), (1, b"two/b", b"2")]
        assert s.events(2) == [(0, b"two/a", b"1")]
        assert not s.ends
    finally:
        s.close()


def test_a_failing_sub_stream_ends_alone(setup: Setup) -> None:
    """A sidecar's request that does not decode fails its WatchBatches stream (`not capable`):
    here its sub-stream only, whose later requests are ignored; the other sub-stream goes on.
    A caller's bad input is no failure of the store's: nothing logs a traceback."""
    tracebacks = setup.program.output().count("Traceback")
    s = Shared(setup.store, SIDECAR_SECRET)
    try:
        s.send(1, _create(b"fail/a"))
        s.send(2, _create(b"fail/b"))
        s.until(lambda: s.created(1) == [0] and s.created(2) == [0])
        s.send(2, b"\xff\xff\xff")
        s.until(lambda: 2 in s.ends)
        end = s.ends[2]
        assert (end.code, end.message) == (Err.NOT_CAPABLE.code.value[0], Err.NOT_CAPABLE.message), end
        s.send(2, _create(b"fail/a"))  # an ended sub-stream is never opened again
        s.send(3, _create(b"fail/a"))
        s.until(lambda: s.created(3) == [0])
        _put(setup, b"fail/a", b"x")
        s.until(lambda: s.events(1) and s.events(3))
        assert s.events(1) == [(0, b"fail/a", b"x")] and s.events(3) == [(0, b"fail/a", b"x")]
        assert s.created(2) == [0] and not s.events(2) and set(s.ends) == {2}
    finally:
        s.close()
    assert setup.program.output().count("Traceback") == tracebacks, setup.program.output()[-3000:]


def test_a_closed_sub_stream_and_an_ended_stream_leave_no_watch(setup: Setup) -> None:
    base = _open_watches(setup)
    s = Shared(setup.store)
    try:
        for key in (b"close/a", b"close/b", b"close/c"):
            s.send(1, _create(key))
        s.send(2, _create(b"close/a"))
        s.until(lambda: len(s.created(1)) == 3 and len(s.created(2)) == 1)
        wait_for(lambda: _open_watches(setup) == base + 4, 20, "the four watches to count")
        s.send(1, close=True)
        wait_for(lambda: _open_watches(setup) == base + 1, 20, "the closed sub-stream's watches to go")
        _put(setup, b"close/a", b"after")
        s.until(lambda: s.events(2))
        assert s.events(2) == [(0, b"close/a", b"after")]
        assert not s.events(1) and not s.ends  # a close is answered with nothing
    finally:
        s.close()
    wait_for(lambda: _open_watches(setup) == base, 20, "the ended stream's watches to go")


@pytest.mark.parametrize("request_bytes", [
    spb.WatchSharedRequest(sub=0, request=_create(b"zero").SerializeToString()).SerializeToString(),
    b"\xff\xff\xff"], ids=["sub-0", "garbage"])
def test_a_request_for_no_sub_stream_ends_the_stream(setup: Setup, request_bytes: bytes) -> None:
    s = Shared(setup.store)
    try:
        s.send(1, _create(b"zero"))
        s.until(lambda: s.created(1) == [0])
        s.raw(request_bytes)
        code, message = s.ended_with()
        assert code is grpc.StatusCode.INTERNAL and message.startswith(STREAM_UNMARSHAL_ERROR_PREFIX), (code, message)
    finally:
        s.close()


def test_a_leader_that_steps_down_ends_every_sub_stream_not_the_stream(tmp_path: Path) -> None:
    """Every hub stream fails with `not leader`: each sub-stream ends with it, and the shared
    stream stays open (the proxy opens its sub-streams again on the new leader's link)."""
    cluster = unstarted_cluster(tmp_path)
    try:
        starts = [threading.Thread(target=cluster.restart, args=(n,)) for n in cluster.nodes]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        leader = cluster.leader()
        follower = cluster.followers(leader)[0]
        assert cluster.leader_info(follower, timeout=5) is not None
        s = Shared(leader.internal, cluster.secret)
        try:
            s.send(1, _create(b"lead/a"))
            s.send(2, _create(b"lead/b"))
            s.until(lambda: s.created(1) == [0] and s.created(2) == [0])
            cluster.do(leader, ipb.InternalRaftRequest(move_leader=pb.MoveLeaderRequest(targetID=follower.member_id)),
                       timeout=15)
            s.until(lambda: {1, 2} <= set(s.ends))
            not_leader = (Err.NOT_LEADER.code.value[0], Err.NOT_LEADER.message)
            assert {sub: (e.code, e.message) for sub, e in s.ends.items()} == {1: not_leader, 2: not_leader}
            s.send(3, _create(b"lead/c"))  # the stream is still open: a new sub-stream is answered
            s.until(lambda: 3 in s.ends)
            assert (s.ends[3].code, s.ends[3].message) == not_leader
        finally:
            s.close()
    finally:
        cluster.close(background=True)


# ---- the demultiplexer alone, with a stand-in for the hub's serving ----

class _Aborted(Exception):
    pass


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise _Aborted(code, details)


class _Run:
    """A shared stream over a stand-in serving: it answers each request as a batch of its bytes
    (b"hold": reads no more; b"end": returns; b"leader": aborts with `not leader`)."""

    def __init__(self, **caps: int) -> None:
        self.requests: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.serving: set[int] = set()
        self.ends: dict[int, tuple[int, str]] = {}
        self.batches: dict[int, list[bytes]] = {}
        self._subs = iter(range(1, 1 << 30))
        self.out = shared.SharedWatches(self._serve, **caps).serve(self._read(), _Context())

    async def _serve(self, feed: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        me = object()
        self.serving.add(id(me))
        try:
            async for r in feed:
                if r == b"hold":
                    await asyncio.Event().wait()
                if r == b"end":
                    return
                if r == b"leader":
                    await context.abort(*Err.NOT_LEADER.value)
                yield r
        finally:
            self.serving.discard(id(me))

    async def _read(self) -> AsyncIterator[bytes]:
        while (item := await self.requests.get()) is not None:
            yield item

    def send(self, sub: int, request: bytes = b"", close: bool = False) -> None:
        self.requests.put_nowait(spb.WatchSharedRequest(sub=sub, request=request, close=close).SerializeToString())

    async def served(self, n: int) -> None:
        """Until ``n`` sub-streams are being served (a cancelled one ends at its next turn)."""
        async def settled() -> None:
            while len(self.serving) != n:
                await asyncio.sleep(0)
        await asyncio.wait_for(settled(), 10)

    async def until(self, done: Any) -> None:
        while not done():
            raw = await asyncio.wait_for(self.out.__anext__(), 10)
            for part in spb.WatchSharedBatch.FromString(raw).parts:
                assert part.sub not in self.ends
                if part.end:
                    self.ends[part.sub] = (part.code, part.message)
                else:
                    self.batches.setdefault(part.sub, []).append(part.batch)


def test_sub_streams_over_the_cap_are_refused_and_ended_ones_free_their_place() -> None:
    async def main() -> None:
        run = _Run(max_subs=2)
        for sub in (1, 2, 3):
            run.send(sub, b"a%d" % sub)
        await run.until(lambda: 3 in run.ends and len(run.batches) == 2)
        assert run.ends == {3: TOO_MANY} and run.batches == {1: [b"a1"], 2: [b"a2"]}
        run.send(3, b"again")  # ended: ignored
        run.send(1, b"end")  # returns: its place is free
        await run.until(lambda: 1 in run.ends)
        assert run.ends[1] == (0, "")
        run.send(2, b"leader")
        await run.until(lambda: 2 in run.ends)
        assert run.ends[2] == (Err.NOT_LEADER.code.value[0], Err.NOT_LEADER.message)
        run.send(4, b"b4")
        run.send(5, b"b5")
        await run.until(lambda: 4 in run.batches and 5 in run.batches)
        assert 3 not in run.batches
        await run.out.aclose()
        await run.served(0)  # no sub-stream's serving outlives the shared stream
    asyncio.run(main())


def test_a_sub_stream_that_reads_no_requests_ends_at_its_request_bound() -> None:
    """Past its bound a sub-stream holds the stream's reading back until it has room (as HTTP/2
    a stream of its own); one that takes none of its requests meanwhile is ended."""
    async def main() -> None:
        run = _Run(sub_request_bytes=100, sub_stall_seconds=0.05)
        run.send(1, b"hold")
        run.send(2, b"x")
        await run.until(lambda: 2 in run.batches)
        for _ in range(5):
            run.send(1, b"y" * 40)
        run.send(2, b"z")
        await run.until(lambda: 1 in run.ends and len(run.batches[2]) == 2)
        assert run.ends == {1: TOO_MANY}
        await run.served(1)  # the ended sub-stream is served no more
        await run.out.aclose()
        await run.served(0)
    asyncio.run(main())


def test_a_sub_stream_past_its_bound_that_reads_on_holds_the_stream_back_and_is_not_ended() -> None:
    """A proxy's resume sends every watch of a client stream at once (megabytes), which its
    sub-stream takes one create at a time: past its bound the stream reads no further until it
    has room, and the sub-stream, which reads on, is not ended (it was, with `too many requests`,
    at every resume); the other sub-streams' requests come after."""
    async def main() -> None:
        gate = asyncio.Semaphore(0)
        read = 0

        async def serve(feed: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for r in feed:
                await gate.acquire()  # one request taken per release
                yield r

        async def requests() -> AsyncIterator[bytes]:
            nonlocal read
            for i in range(10):
                read += 1
                yield spb.WatchSharedRequest(sub=1, request=bytes([i]) * 40).SerializeToString()
            read += 1
            yield spb.WatchSharedRequest(sub=2, request=b"other").SerializeToString()
            await asyncio.Event().wait()

        out = shared.SharedWatches(serve, sub_request_bytes=100, sub_stall_seconds=60).serve(requests(), _Context())
        first = asyncio.ensure_future(out.__anext__())
        for _ in range(200):  # turns of the loop: the stream reads as far as it may
            await asyncio.sleep(0)
        assert read < 10, f"{read} requests read past sub-stream 1's bound"
        for _ in range(11):
            gate.release()
        batches: dict[int, list[bytes]] = {}
        ends: list[int] = []
        raw = await asyncio.wait_for(first, 10)
        while True:
            for p in spb.WatchSharedBatch.FromString(raw).parts:
                if p.end:
                    ends.append(p.sub)
                else:
                    batches.setdefault(p.sub, []).append(p.batch)
            if len(batches.get(1, [])) == 10 and batches.get(2):
                break
            raw = await asyncio.wait_for(out.__anext__(), 10)
        assert batches == {1: [bytes([i]) * 40 for i in range(10)], 2: [b"other"]} and not ends
        await out.aclose()
    asyncio.run(main())


def test_a_closed_sub_stream_is_served_no_more() -> None:
    async def main() -> None:
        run = _Run()
        run.send(1, b"a")
        run.send(2, b"b")
        await run.until(lambda: len(run.batches) == 2)
        run.send(1, close=True)
        run.send(1, b"after")  # closed: ignored
        run.send(2, b"c")
        await run.until(lambda: len(run.batches[2]) == 2)
        assert run.batches[1] == [b"a"] and not run.ends
        await run.served(1)
        await run.out.aclose()
        await run.served(0)
    asyncio.run(main())


def test_a_stream_not_read_holds_its_sub_streams_back() -> None:
    """What the proxy has not read is bounded (``out_bytes``): a sub-stream's serving is not asked
    for more meanwhile (a hub stream then fills, and its watchers fall back to history); once read,
    everything comes, in order, in messages of at most STREAM_BATCH_BYTES (or one part alone)."""
    async def main() -> None:
        run = _Run(out_bytes=4 << 20)
        produced: list[int] = []

        async def flood(feed: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for _ in feed:
                for i in range(40):
                    produced.append(i)
                    yield bytes([i]) * (1 << 20)
        run.out = shared.SharedWatches(flood, out_bytes=4 << 20).serve(run._read(), _Context())
        run.send(1, b"go")
        first = asyncio.ensure_future(run.out.__anext__())
        for _ in range(200):  # turns of the loop: the serving runs as far as it may
            await asyncio.sleep(0)
        # the bound (4 MiB), the message the stream is writing (4 MiB), the part waiting for room
        assert len(produced) <= 9, f"{len(produced)} MiB queued for a stream that reads nothing"
        got: list[bytes] = []
        raw = await first
        while True:
            parts = spb.WatchSharedBatch.FromString(raw).parts
            assert len(parts) == 1 or len(raw) <= shared.STREAM_BATCH_BYTES + 64
            got += [p.batch for p in parts]
            if len(got) == 40:
                break
            raw = await asyncio.wait_for(run.out.__anext__(), 10)
        assert got == [bytes([i]) * (1 << 20) for i in range(40)]
        await run.out.aclose()
    asyncio.run(main())


@pytest.mark.parametrize("request_bytes", [b"", b"leader"], ids=["over-the-cap", "ending-at-once"])
def test_a_stream_not_read_reads_no_more_requests_whose_ends_it_cannot_send(request_bytes: bytes) -> None:
    """A caller that never reads and names new sub-streams, each refused (over ``max_subs``) or
    ending at once, is read no further once its unread parts reach ``out_bytes``: each end part
    was queued however much the caller left unread (unbounded store memory for a few bytes of
    request each); once read, every end part comes, none lost."""
    async def main() -> None:
        read = 0
        subs = 5_000

        async def requests() -> AsyncIterator[bytes]:
            nonlocal read
            yield spb.WatchSharedRequest(sub=1, request=b"hold").SerializeToString()
            for sub in range(2, subs + 2):
                read += 1
                yield spb.WatchSharedRequest(sub=sub, request=request_bytes).SerializeToString()
            await asyncio.Event().wait()

        async def serve(feed: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            async for r in feed:
                if r == b"hold":
                    await asyncio.Event().wait()
                if r == b"leader":
                    await context.abort(*Err.NOT_LEADER.value)
                yield r

        out = shared.SharedWatches(serve, max_subs=1 if not request_bytes else 100,
                                   out_bytes=4096).serve(requests(), _Context())
        first = asyncio.ensure_future(out.__anext__())
        for _ in range(2000):  # turns of the loop: the stream reads as far as it may
            await asyncio.sleep(0)
        assert read < 1_000, f"{read} requests read, their end parts queued, for a stream that reads nothing"
        ends: list[int] = []
        raw = await first
        while True:
            ends += [p.sub for p in spb.WatchSharedBatch.FromString(raw).parts if p.end]
            if len(ends) == subs:
                break
            raw = await asyncio.wait_for(out.__anext__(), 10)
        assert sorted(ends) == list(range(2, subs + 2))
        await out.aclose()
    asyncio.run(main())
