"""A slow watch client's queued answers merge into one message per watch (proxy/watch_merge.py):
byte for byte what protobuf writes for one WatchResponse with the last header and every event,
only answers of one watch that are already queued, never past MERGE_BYTES, never a control answer."""

from __future__ import annotations

import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2
from proxy.watch import CLIENT_BUFFER_BYTES, _State, _Watch, track
from proxy.watch_merge import MERGE_BYTES, EventsAnswer, answer_size, events_offset, merge, take_merged
from raftgate.byte_queue import ByteQueue

events_st = st.lists(st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=40), st.booleans()),
                     min_size=1, max_size=4)


def answer(watch_id: int, rev: int, events: list[tuple[bytes, bytes, bool]], **fields: object) -> bytes:
    return pb.WatchResponse(
        header=pb.ResponseHeader(cluster_id=7, member_id=9, revision=rev, raft_term=3), watch_id=watch_id,
        events=[kv_pb2.Event(type=kv_pb2.Event.DELETE if delete else kv_pb2.Event.PUT,
                             kv=kv_pb2.KeyValue(key=k, value=v, mod_revision=rev)) for k, v, delete in events],
        **fields).SerializeToString()  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=2**40), st.lists(events_st, min_size=1, max_size=6))
def test_merged_bytes_are_what_protobuf_writes_for_one_answer(watch_id: int, revisions: list) -> None:  # type: ignore[type-arg]
    answers = []
    for i, evs in enumerate(revisions):
        made = EventsAnswer.of(answer(watch_id, 100 + i, evs), watch_id)
        assert made is not None
        answers.append(made)
    expected = pb.WatchResponse(header=pb.ResponseHeader(cluster_id=7, member_id=9, revision=99 + len(revisions),
                                                         raft_term=3), watch_id=watch_id)
    for a in answers:
        expected.events.extend(pb.WatchResponse.FromString(a.data).events)
    merged = merge(answers)
    assert type(merged) is bytes  # gRPC sends plain bytes only
    assert merged == expected.SerializeToString()


def test_only_an_answer_of_nothing_but_events_may_merge() -> None:
    ev = [(b"k", b"v", False)]
    assert events_offset(answer(0, 5, ev)) is not None
    assert events_offset(answer(3, 5, ev)) is not None
    assert events_offset(answer(3, 5, [])) is None  # a progress notification
    assert events_offset(answer(3, 5, [], created=True)) is None
    assert events_offset(answer(3, 5, [], canceled=True, cancel_reason="x")) is None
    assert events_offset(answer(3, 5, [], canceled=True, compact_revision=4)) is None
    assert events_offset(answer(3, 5, ev, fragment=True)) is None


def queued(*items: object) -> ByteQueue[object]:
    q: ByteQueue[object] = ByteQueue(1 << 30, size=answer_size)
    for item in items:
        q.put_nowait(item)
    return q


def ea(watch_id: int, rev: int, value: bytes = b"v") -> EventsAnswer:
    made = EventsAnswer.of(answer(watch_id, rev, [(b"k", value, False)]), watch_id)
    assert made is not None
    return made


def revisions(data: bytes) -> list[int]:
    return [e.kv.mod_revision for e in pb.WatchResponse.FromString(data).events]


def test_take_merged_stops_at_another_watch_or_anything_else() -> None:
    control = answer(1, 9, [], canceled=True)
    q = queued(ea(1, 2), ea(1, 3), ea(2, 4), ea(1, 5), control, ea(1, 6))
    first = q.get_nowait()
    assert isinstance(first, EventsAnswer)
    assert revisions(take_merged(first, q)) == [2, 3]
    nxt = q.peek()
    assert q.qsize() == 4 and isinstance(nxt, EventsAnswer) and nxt.watch_id == 2
    second = q.get_nowait()
    assert isinstance(second, EventsAnswer)
    assert revisions(take_merged(second, q)) == [4]  # the next one is another watch's
    third = q.get_nowait()
    assert isinstance(third, EventsAnswer)
    assert revisions(take_merged(third, q)) == [5]  # a control answer is never merged
    assert q.get_nowait() == control


def test_take_merged_never_grows_past_the_bound_and_releases_what_it_took() -> None:
    big = b"x" * (MERGE_BYTES // 3)
    q = queued(*(ea(1, r, big) for r in range(2, 10)))
    assert q.bytes == sum(answer_size(x) for x in q._queue)  # type: ignore[attr-defined]
    sizes = []
    while q.qsize():
        first = q.get_nowait()
        assert isinstance(first, EventsAnswer)
        out = take_merged(first, q)
        assert len(out) <= MERGE_BYTES
        sizes.append(len(revisions(out)))
    assert sizes == [2, 2, 2, 2]
    assert q.bytes == 0
    alone = ea(1, 2, b"y" * (MERGE_BYTES + 10))  # larger than the bound by itself: sent alone
    q = queued(ea(1, 3))
    assert revisions(take_merged(alone, q)) == [2]


def test_take_merged_stops_at_etcds_thousand_revisions() -> None:
    # etcd's catch-up answer carries at most watchBatchMaxRevs (1000) revisions; 1 MiB of tiny
    # events would be tens of thousands.
    q = queued(*(ea(1, r) for r in range(2, 2502)))
    counts = []
    while q.qsize():
        first = q.get_nowait()
        assert isinstance(first, EventsAnswer)
        counts.append(len(set(revisions(take_merged(first, q)))))
    assert counts == [1000, 1000, 500] and q.bytes == 0


def test_an_answer_of_many_revisions_counts_each_of_them() -> None:
    # The store's catch-up answers carry many revisions (several events each here): 700 and 400
    # revisions are two messages, not one of 1100.
    st = _State()
    st.watches[1] = _Watch(pb.WatchCreateRequest(key=b"k", range_end=b"l"), 2)

    def catch_up(first: int, last: int) -> bytes | EventsAnswer | None:
        evs = [kv_pb2.Event(kv=kv_pb2.KeyValue(key=b"k%d" % i, mod_revision=r))
               for r in range(first, last + 1) for i in range(2)]
        return track(st, pb.WatchResponse(header=pb.ResponseHeader(revision=last), watch_id=1,
                                          events=evs).SerializeToString())

    q = queued(catch_up(2, 701), catch_up(702, 1101))
    first = q.get_nowait()
    assert isinstance(first, EventsAnswer)
    assert len(set(revisions(take_merged(first, q)))) == 700
    assert q.qsize() == 1


def test_what_a_stalled_client_holds_is_charged_as_the_memory_it_takes() -> None:
    # A client that reads nothing holds CLIENT_BUFFER_BYTES of answers in the proxy: in memory, not
    # only in payload. An answer's objects (its bytes object, the mergeable answer around it, its
    # queue slot) took ~100 bytes more than its payload: 4 MiB of 30-byte answers held 18 MiB, of
    # these 100-byte ones 8.2 MiB (3.9 MiB charged as memory).
    st = _State()
    st.watches[7] = _Watch(pb.WatchCreateRequest(key=b"k"), 1)
    value = b"v" * 70
    tracemalloc.start()
    try:
        q: ByteQueue[object] = ByteQueue(CLIENT_BUFFER_BYTES, size=answer_size)
        rev = 1
        while q.room.is_set():
            rev += 1
            event = kv_pb2.Event(kv=kv_pb2.KeyValue(key=b"k", value=value, mod_revision=rev))
            q.put_nowait(track(st, pb.WatchResponse(
                header=pb.ResponseHeader(cluster_id=1234567, member_id=7654321, revision=rev, raft_term=3),
                watch_id=7, events=[event]).SerializeToString()))
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held <= CLIENT_BUFFER_BYTES * 5 // 4, f"{held / 2**20:.1f} MiB held for {rev - 1} answers"
