"""A watch client that falls behind gets what queued for it in fewer messages, as etcd's catch-up
answers: several revisions in one WatchResponse with the newest header, every event once and in
order, no message past MERGE_BYTES, one watch's events never mixed with another's, and a watch
that asked for fragments still one message per revision (proxy/watch_merge.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from protos.mvccpb import kv_pb2
from proxy.watch_merge import MERGE_BYTES
from tests.support.processes import RaftgateLocal

pytestmark = pytest.mark.slow

#: A client that keeps the stream's window small (no BDP growth) and takes large messages.
CLIENT = [("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0),
          ("grpc.max_receive_message_length", 16 << 20)]
#: etcd's watchBatchMaxRevs: the most revisions its catch-up answer to a watcher behind carries.
ETCD_BATCH_REVISIONS = 1000


@pytest.fixture(scope="module")
def raftgate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaftgateLocal]:
    srv = RaftgateLocal(tmp_path_factory.mktemp("merge"), extra_args=["--nodes", "1"])
    srv.start()
    yield srv
    srv.stop()


async def behind(srv: RaftgateLocal, creates: list[pb.WatchCreateRequest], puts: list[tuple[bytes, bytes]],
                 ) -> list[pb.WatchResponse]:
    """Opens a stream with ``creates``, makes the puts while the client reads nothing, then reads
    until every put's event (for each watch that matches it) has arrived; returns the messages
    after the `created` answers."""
    endpoint = f"127.0.0.1:{srv.port}"
    async with grpc.aio.insecure_channel(endpoint, options=CLIENT) as wch, \
            grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as kch:
        call = pbg.WatchStub(wch).Watch()
        for create in creates:
            await call.write(pb.WatchRequest(create_request=create))
            assert (await asyncio.wait_for(call.read(), 10)).created
        kv = pbg.KVStub(kch)
        for key, value in puts:
            await kv.Put(pb.PutRequest(key=key, value=value), timeout=10)
        expected = sum(1 for key, _ in puts for c in creates if c.key <= key < c.range_end)
        got: list[pb.WatchResponse] = []
        while sum(len(m.events) for m in got) < expected:
            got.append(await asyncio.wait_for(call.read(), 20))
        call.cancel()
        return got


def test_a_client_behind_gets_every_event_once_in_fewer_messages(raftgate: RaftgateLocal) -> None:
    value = b"v" * (16 << 10)
    puts = [(b"m1/k%d" % (i % 7), value) for i in range(200)]  # 3.2 MiB the client does not read
    got = asyncio.run(behind(raftgate, [pb.WatchCreateRequest(key=b"m1/", range_end=b"m10")], puts))
    revs = [e.kv.mod_revision for m in got for e in m.events]
    assert len(revs) == 200 and revs == sorted(set(revs)) and revs[-1] - revs[0] == 199
    assert [e.kv.key for m in got for e in m.events] == [k for k, _ in puts]
    assert len(got) < 200  # merged: the proxy queued what the client did not take
    for m in got:
        assert m.ByteSize() <= MERGE_BYTES
        assert m.header.revision == m.events[-1].kv.mod_revision  # the newest header, as etcd's catch-up
        assert not m.created and not m.canceled and not m.fragment


def test_two_watches_on_one_stream_keep_their_own_order(raftgate: RaftgateLocal) -> None:
    value = b"w" * (8 << 10)
    puts = [(b"m2/%s" % (b"a" if i % 3 else b"b"), value) for i in range(300)]
    creates = [pb.WatchCreateRequest(key=b"m2/a"), pb.WatchCreateRequest(key=b"m2/", range_end=b"m20", watch_id=5)]
    for c in creates:
        if not c.range_end:
            c.range_end = c.key + b"\x00"
    got = asyncio.run(behind(raftgate, creates, puts))
    by_watch: dict[int, list[int]] = {}
    for m in got:
        by_watch.setdefault(m.watch_id, []).extend(e.kv.mod_revision for e in m.events)
        if m.watch_id == 0:
            assert {e.kv.key for e in m.events} == {b"m2/a"}
    assert sorted(by_watch) == [0, 5]
    assert len(by_watch[5]) == 300 and by_watch[5] == sorted(set(by_watch[5]))
    assert len(by_watch[0]) == 200 and by_watch[0] == sorted(set(by_watch[0]))
    assert set(by_watch[0]) < set(by_watch[5])


def test_a_watch_that_asked_for_fragments_gets_one_message_per_revision(raftgate: RaftgateLocal) -> None:
    value = b"f" * (16 << 10)
    puts = [(b"m3/k", value) for _ in range(150)]
    got = asyncio.run(behind(raftgate, [pb.WatchCreateRequest(key=b"m3/", range_end=b"m30", fragment=True)], puts))
    assert [len(m.events) for m in got] == [1] * 150
    assert [m.header.revision for m in got] == [m.events[0].kv.mod_revision for m in got]


def test_a_merged_message_carries_at_most_etcds_thousand_revisions(raftgate: RaftgateLocal) -> None:
    # Tiny events: 1 MiB of them would be tens of thousands of revisions in one message, where
    # etcd's catch-up answer (watchBatchMaxRevs) carries at most 1000.
    puts = [(b"m4/k%d" % (i % 3), b"t") for i in range(4000)]
    got = asyncio.run(behind(raftgate, [pb.WatchCreateRequest(key=b"m4/", range_end=b"m40")], puts))
    revs = [e.kv.mod_revision for m in got for e in m.events]
    assert len(revs) == 4000 and revs == sorted(set(revs))
    assert len(got) < 4000  # merged: the client fell behind
    assert max(len({e.kv.mod_revision for e in m.events}) for m in got) <= ETCD_BATCH_REVISIONS


def test_merged_messages_keep_whole_revisions_filters_prev_kv_and_the_progress_answer_after_them(
        raftgate: RaftgateLocal) -> None:
    """Txns of several keys (one revision each), deletes of several keys, prev_kv and filters while
    the client reads nothing, a progress request in the middle: each revision's events arrive in
    one message, once, in order, and the progress answer only after every event at or below its
    revision (etcd's guarantee for RequestProgress)."""
    value = b"t" * (12 << 10)

    async def scenario() -> tuple[list[int], list[pb.WatchResponse]]:
        endpoint = f"127.0.0.1:{raftgate.port}"
        async with grpc.aio.insecure_channel(endpoint, options=CLIENT) as wch, \
                grpc.aio.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as kch:
            call = pbg.WatchStub(wch).Watch()
            ids = []
            for extra in ({"prev_kv": True}, {"filters": [pb.WatchCreateRequest.NOPUT]},
                          {"filters": [pb.WatchCreateRequest.NODELETE]}):
                create = pb.WatchCreateRequest(key=b"m5/", range_end=b"m50", **extra)  # type: ignore[arg-type]
                await call.write(pb.WatchRequest(create_request=create))
                created = await asyncio.wait_for(call.read(), 10)
                assert created.created
                ids.append(created.watch_id)
            kv = pbg.KVStub(kch)
            for i in range(100):
                if i % 10 == 9:
                    await kv.DeleteRange(pb.DeleteRangeRequest(key=b"m5/x", range_end=b"m5/y"), timeout=10)
                else:
                    await kv.Txn(pb.TxnRequest(success=[pb.RequestOp(request_put=pb.PutRequest(
                        key=b"m5/x%d" % j, value=value)) for j in range(3)]), timeout=10)
                if i == 50:
                    await call.write(pb.WatchRequest(progress_request=pb.WatchProgressRequest()))
            # 90 txns of 3 puts, 10 deletes of 3 keys: 300 events, 30 deletes, 270 puts
            got: list[pb.WatchResponse] = []
            while sum(len(m.events) for m in got) < 300 + 30 + 270 or not any(m.watch_id == -1 for m in got):
                got.append(await asyncio.wait_for(call.read(), 20))
            call.cancel()
            return ids, got

    ids, got = asyncio.run(scenario())
    (progress,) = [n for n, m in enumerate(got) if m.watch_id == -1]
    assert not any(e.kv.mod_revision <= got[progress].header.revision for m in got[progress + 1:] for e in m.events)
    assert len(got) < 100 * 3  # merged
    for watch_id, count in zip(ids, (300, 30, 270), strict=True):
        mine = [m for m in got if m.watch_id == watch_id]
        revs = [e.kv.mod_revision for m in mine for e in m.events]
        assert len(revs) == count and revs == sorted(revs)
        for m in mine:  # whole revisions: each revision's three events in one message
            assert all(sum(1 for e in m.events if e.kv.mod_revision == r) == 3
                       for r in {e.kv.mod_revision for e in m.events})
    with_prev = [e for m in got if m.watch_id == ids[0] for e in m.events]
    deletes = [e for e in with_prev if e.type == kv_pb2.Event.DELETE]
    assert len(deletes) == 30 and all(e.prev_kv.key == e.kv.key and e.prev_kv.value == value for e in deletes)
    # every put has its prev_kv but those of the first txn and of the txns right after a delete
    assert sum(1 for e in with_prev if e.type == kv_pb2.Event.PUT and e.prev_kv.value == value) == 240
