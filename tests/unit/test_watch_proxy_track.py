"""proxy/watch.py's `track`: what the proxy learns from each store answer to resume a watch on a new
leader from the first revision the client has not seen, and the guard that drops an event the client
already has (no duplicate after a resume); and the byte bound on what it keeps for the store."""

from __future__ import annotations

from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2
from proxy.watch import UNSENT_BYTES, _State, track
from proxy.watch_merge import EventsAnswer


def resp(watch_id: int, rev: int, *event_revs: int, **kw: object) -> bytes:
    events = [kv_pb2.Event(kv=kv_pb2.KeyValue(key=b"k", mod_revision=r)) for r in event_revs]
    return pb.WatchResponse(header=pb.ResponseHeader(revision=rev), watch_id=watch_id, events=events,
                            **kw).SerializeToString()  # type: ignore[arg-type]


def state_with(*creates: pb.WatchCreateRequest) -> _State:
    st = _State(header=b"", current_revision=False)
    st.pending.extend(creates)
    return st


def test_created_records_the_watch_from_the_next_revision_or_its_start() -> None:
    st = state_with(pb.WatchCreateRequest(key=b"a"), pb.WatchCreateRequest(key=b"b", start_revision=3))
    assert track(st, resp(0, 10, created=True)) is not None
    track(st, resp(1, 10, created=True))
    assert {i: (w.create.key, w.create.watch_id, w.next_rev) for i, w in st.watches.items()} == {
        0: (b"a", 0, 11), 1: (b"b", 1, 3)}
    assert not st.pending


def test_a_denied_create_is_passed_on_and_not_tracked() -> None:
    st = state_with(pb.WatchCreateRequest(key=b"x"))
    data = resp(-1, 10, created=True, canceled=True, cancel_reason="denied")
    assert track(st, data) == data and not st.watches and not st.pending


def test_events_and_progress_advance_next_rev_and_old_events_are_dropped() -> None:
    st = state_with(pb.WatchCreateRequest(key=b"k"))
    track(st, resp(0, 10, created=True))
    track(st, resp(0, 12, 12))
    assert st.watches[0].next_rev == 13
    track(st, resp(0, 15))  # progress notify for this watch
    assert st.watches[0].next_rev == 16
    assert track(st, resp(0, 15, 14, 15)) is None  # all seen: nothing for the client
    out = track(st, resp(0, 17, 15, 16, 17))  # a resumed stream repeating 15: dropped, the rest kept
    assert isinstance(out, EventsAnswer)  # only events: it may merge with the next answers
    assert [e.kv.mod_revision for e in pb.WatchResponse.FromString(out.data).events] == [16, 17]
    assert st.watches[0].next_rev == 18
    track(st, resp(-1, 20))  # a progress response for the whole stream
    assert st.watches[0].next_rev == 21


def test_fragments_advance_next_rev_only_with_the_last_part() -> None:
    st = state_with(pb.WatchCreateRequest(key=b"k", fragment=True))
    track(st, resp(0, 10, created=True))
    track(st, resp(0, 12, 11, fragment=True))
    assert st.watches[0].next_rev == 11  # a resume now re-reads revision 11..12 as a whole
    track(st, resp(0, 12, 12))
    assert st.watches[0].next_rev == 13


def test_cancel_forgets_the_watch() -> None:
    st = state_with(pb.WatchCreateRequest(key=b"k"))
    track(st, resp(0, 10, created=True))
    st.canceling.add(0)
    track(st, resp(0, 10, canceled=True))
    assert not st.watches and not st.canceling


def test_a_watch_canceled_because_its_token_died_gets_etcds_reason_and_no_more_events() -> None:
    """After a JWT's exp the proxy cancels the stream's watches itself: the store's plain cancel
    reaches the client with `invalid auth token`, and nothing of the watch passes meanwhile."""
    from proxy.watch import INVALID_TOKEN_REASON

    st = state_with(pb.WatchCreateRequest(key=b"k"), pb.WatchCreateRequest(key=b"j"))
    track(st, resp(0, 10, created=True))
    track(st, resp(1, 10, created=True))
    st.dead.add(0)
    assert track(st, resp(0, 11, 11)) is None
    assert track(st, resp(1, 11, 11)) is not None
    out = pb.WatchResponse.FromString(track(st, resp(0, 11, canceled=True)) or b"")
    assert (out.watch_id, out.canceled, out.cancel_reason) == (0, True, INVALID_TOKEN_REASON)
    assert INVALID_TOKEN_REASON == "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
    assert set(st.watches) == {1} and not st.dead


def test_unanswered_creates_and_held_requests_share_one_byte_bound() -> None:
    """A client's creates the store has not answered and requests held for the next store stream
    count against UNSENT_BYTES together: the proxy reads no more of the client at the bound and
    reads on as soon as an answer or a new stream brings it below."""
    st = _State()
    create = pb.WatchCreateRequest(key=b"k" * (UNSENT_BYTES // 2))
    st.keep(create)
    assert st.unsent.room.is_set()
    st.keep(held=b"h" * (UNSENT_BYTES - create.ByteSize()))  # the bound, reached
    assert st.unsent.bytes == UNSENT_BYTES and not st.unsent.room.is_set()
    assert st.answered() == create and st.unsent.room.is_set()
    st.keep(create)
    assert not st.unsent.room.is_set()
    st.release_held()
    assert st.unsent.bytes == create.ByteSize() and st.unsent.room.is_set() and not st.held
