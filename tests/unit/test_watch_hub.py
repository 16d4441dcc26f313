"""The watch hub (authstore/api/watch/hub.py) without processes: event matching and filters, event
encoding, fragments, watch id allocation, and the apply-stage tap that re-checks open watches on an
auth change (a real Applier on a temporary LMDB; the Raft node is a stand-in, the hub's methods are
called on this thread the way the apply thread and the event loop call them).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from authstore.api.watch import hub as hubmod
from authstore.api.watch.hub import DUPLICATE_ID, EMPTY_RANGE, Event, Stream, Watcher, WatchHub
from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2
from protos.storepb import store_pb2 as spb

PERMISSION_DENIED = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
INVALID_TOKEN = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
USER_EMPTY = "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"
HASH = base64.b64encode(b"$2b$04$abcdefghijklmnopqrstuu5Jm0bq2b3DNHYXjJSOJ5WbWbYHJ8bTa").decode()
HASH2 = base64.b64encode(b"$2b$04$bbcdefghijklmnopqrstuu5Jm0bq2b3DNHYXjJSOJ5WbWbYHJ8bTa").decode()
ANY_REV = 1 << 40  # a header auth revision never older than the store's


def new_stream() -> Stream:
    return Stream()


def watcher(key: bytes, end: bytes = b"", **kw: Any) -> Watcher:
    return Watcher(stream=new_stream(), id=0, key=key, range_end=end, next_rev=0, username="", auth_revision=0,
                   invalid_token=False, current_revision=True, **kw)


def record(key: bytes, rev: int, *, version: int = 1, create: int | None = None, value: bytes = b"v") -> bytes:
    if version == 0:  # a delete: key and mod_revision only
        return kv_pb2.KeyValue(key=key, mod_revision=rev).SerializeToString()
    return kv_pb2.KeyValue(key=key, value=value, mod_revision=rev, create_revision=create or rev,
                           version=version).SerializeToString()


def put_ev(key: bytes, rev: int = 5) -> Event:
    return hubmod._event(rev, record(key, rev, version=2, create=rev - 1))


def del_ev(key: bytes, rev: int = 5) -> Event:
    return hubmod._event(rev, record(key, rev, version=0))


# ---- matching and filters ------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "end", "hits", "misses"), [
    (b"foo", b"", [b"foo"], [b"fo", b"foo0", b"fop", b""]),  # one key
    (b"a/", b"a0", [b"a/", b"a/x", b"a/\xff"], [b"a", b"a0", b"b", b"a."]),  # prefix a/
    (b"m", b"\x00", [b"m", b"m0", b"z", b"\xff\xff"], [b"l", b"", b"a"]),  # from-key
    (b"\x00", b"\x00", [b"\x00", b"a", b"\xff"], []),  # every key (etcd rewrites an empty key to \0)
    (b"b", b"d", [b"b", b"c", b"cz"], [b"d", b"a", b"d0"]),  # half-open interval
])
def test_matches_the_watched_interval(key: bytes, end: bytes, hits: list[bytes], misses: list[bytes]) -> None:
    w = watcher(key, end)
    for k in hits:
        assert w.matches(put_ev(k)) and w.matches(del_ev(k)), k
    for k in misses:
        assert not w.matches(put_ev(k)) and not w.matches(del_ev(k)), k


@pytest.mark.parametrize(("no_put", "no_delete", "put_seen", "del_seen"), [
    (False, False, True, True), (True, False, False, True), (False, True, True, False), (True, True, False, False),
])
def test_noput_nodelete_filters(no_put: bool, no_delete: bool, put_seen: bool, del_seen: bool) -> None:
    w = watcher(b"k", no_put=no_put, no_delete=no_delete)
    assert w.matches(put_ev(b"k")) is put_seen
    assert w.matches(del_ev(b"k")) is del_seen


# ---- events as stored and as sent ----------------------------------------------------------------

def test_event_from_record_tells_create_update_delete() -> None:
    created = hubmod._event(3, record(b"k", 3))
    updated = hubmod._event(4, record(b"k", 4, version=2, create=3))
    deleted = hubmod._event(5, record(b"k", 5, version=0))
    assert [(e.rev, e.key, e.create, e.delete) for e in (created, updated, deleted)] == [
        (3, b"k", True, False), (4, b"k", False, False), (5, b"k", False, True)]


def test_event_encoding_is_an_mvccpb_event_with_optional_prev_kv() -> None:
    prev = kv_pb2.KeyValue(key=b"k", value=b"old", mod_revision=4, create_revision=3, version=2)
    ev = hubmod._event(5, record(b"k", 5, version=0))
    ev.prev = prev.SerializeToString()
    with_prev = kv_pb2.Event.FromString(ev.encode(with_prev=True))
    assert (with_prev.type, with_prev.kv.key, with_prev.kv.mod_revision, with_prev.prev_kv) == (
        kv_pb2.Event.DELETE, b"k", 5, prev)
    without = kv_pb2.Event.FromString(ev.encode(with_prev=False))
    assert not without.HasField("prev_kv") and without.type == kv_pb2.Event.DELETE
    put = kv_pb2.Event.FromString(put_ev(b"k").encode(with_prev=True))  # prev unknown: no prev_kv
    assert put.type == kv_pb2.Event.PUT and not put.HasField("prev_kv")


# ---- fragments -----------------------------------------------------------------------------------

class _FakeApplier:
    cluster_id, member_id, term = 11, 22, 3


def sent(stream: Stream) -> list[pb.WatchResponse]:
    out = []
    while not stream.queue.empty():
        item = stream.queue.get_nowait()
        assert isinstance(item, bytes), item
        out.append(pb.WatchResponse.FromString(item))
    return out


def big_events(n: int, size: int) -> list[Event]:
    return [hubmod._event(10, record(b"f/%d" % i, 10, value=b"x" * size)) for i in range(n)]


@pytest.mark.parametrize(("n", "size", "limit"), [(10, 300, 1000), (7, 100, 250), (5, 2000, 1000), (2, 10, 40)])
def test_fragments_fill_each_response_up_to_the_limit(n: int, size: int, limit: int) -> None:
    hub = WatchHub(_FakeApplier(), None, max_response_bytes=limit)
    w = watcher(b"f/", b"f0", fragment=True)
    w.id = 4
    events = big_events(n, size)
    hub._send_events(w, events, 10)
    parts = sent(w.stream)
    assert len(parts) > 1
    assert [p.fragment for p in parts] == [True] * (len(parts) - 1) + [False]
    assert all(p.watch_id == 4 and p.header.revision == 10 and p.header.member_id == 22 for p in parts)
    assert [e.kv.key for p in parts for e in p.events] == [b"f/%d" % i for i in range(n)]
    for p in parts:  # under the limit unless one event alone is bigger
        assert len(p.SerializeToString()) < limit or len(p.events) == 1, (len(p.SerializeToString()), len(p.events))


def test_no_fragments_without_the_flag_or_under_the_limit_or_for_one_event() -> None:
    hub = WatchHub(_FakeApplier(), None, max_response_bytes=1000)
    for w, events in [(watcher(b"f/", b"f0"), big_events(10, 300)),  # fragment not asked for
                      (watcher(b"f/", b"f0", fragment=True), big_events(2, 100)),  # fits
                      (watcher(b"f/", b"f0", fragment=True), big_events(1, 5000))]:  # one event can't split
        hub._send_events(w, events, 10)
        parts = sent(w.stream)
        assert len(parts) == 1 and not parts[0].fragment and len(parts[0].events) == len(events)


# ---- a hub on a real Applier -----------------------------------------------------------------------

class _Node:
    """What the hub asks of the Raft node, run inline (this thread is the 'apply thread')."""

    is_leader = True

    async def between_batches(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


class World:
    def __init__(self, path: Path) -> None:
        self.applier = Applier(Backend(path), member_id=1)
        self.hub = WatchHub(self.applier, _Node(), progress_interval=0)
        self.applier.subscribe_entries(self.hub.tap)
        self.index = itertools.count(1)
        self.streams: list[Stream] = []

    def apply(self, *reqs: tuple[str, Any], user: str = "root") -> list[Any]:
        """One batch of entries, then the event-loop drain; returns each entry's result."""
        entries = []
        for kind, body in reqs:
            req = ipb.InternalRaftRequest(ID=next(self.index), header=ipb.RequestHeader(
                username=user, auth_revision=ANY_REV if user else 0))
            getattr(req, kind).CopyFrom(body)
            entries.append(Entry(term=1, index=req.ID, data=req.SerializeToString()))
        results = [r for _, r in self.applier.apply_batch(entries)]
        self.hub.applied()
        return results

    def watch(self, stream: Stream | None, key: bytes, end: bytes = b"", *, user: str = "", watch_id: int = 0,
              **kw: Any) -> tuple[str, Watcher]:
        """Registers like WatchHub._create does for a watch from now on; (refusal reason, watcher)."""
        stream = stream or new_stream()
        w = Watcher(stream=stream, id=watch_id, key=key, range_end=end, next_rev=0, username=user,
                    auth_revision=ANY_REV, invalid_token=False, current_revision=True, **kw)
        w.gid = next(self.hub._gids)
        reason, rev, stale = self.hub._admit(w, False, self.hub._refusal(stream, watch_id, False))
        if stale:
            self.hub.rev = max(self.hub.rev, rev)
        if not reason:
            self.hub._attach(w, watch_id, False)
        w.synced = not reason
        return reason, w

    def close(self) -> None:
        self.hub.close()
        self.applier.env.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    wd = World(tmp_path / "store")
    yield wd
    wd.close()


def perm(key: bytes, end: bytes = b"", kind: int = auth_pb2.Permission.READWRITE) -> auth_pb2.Permission:
    return auth_pb2.Permission(permType=kind, key=key, range_end=end)


def setup_auth(world: World) -> None:
    """root; alice and bob with role r: READWRITE a/ and foo; enabled."""
    results = world.apply(
        ("auth_user_add", pb.AuthUserAddRequest(name="root", hashedPassword=HASH)),
        ("auth_user_grant_role", pb.AuthUserGrantRoleRequest(user="root", role="root")),
        ("auth_role_add", pb.AuthRoleAddRequest(name="r")),
        ("auth_role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="r", perm=perm(b"a/", b"a0"))),
        ("auth_role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="r", perm=perm(b"foo"))),
        ("auth_user_add", pb.AuthUserAddRequest(name="alice", hashedPassword=HASH)),
        ("auth_user_add", pb.AuthUserAddRequest(name="bob", hashedPassword=HASH)),
        ("auth_user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="r")),
        ("auth_user_grant_role", pb.AuthUserGrantRoleRequest(user="bob", role="r")),
        ("auth_enable", pb.AuthEnableRequest()),
        user="",
    )
    assert not any(isinstance(r, Exception) for r in results), results


def put(key: bytes, value: bytes = b"v") -> tuple[str, pb.PutRequest]:
    return "put", pb.PutRequest(key=key, value=value)


def summary(stream: Stream) -> list[tuple[Any, ...]]:
    return [(r.watch_id, r.canceled, r.cancel_reason, [e.kv.key for e in r.events]) for r in sent(stream)]


def test_watch_ids_are_allocated_like_etcds_auto_watch_id(world: World) -> None:
    world.apply(put(b"x"))
    s = new_stream()
    assert [world.watch(s, b"x")[1].id for _ in range(2)] == [0, 1]
    reason, w7 = world.watch(s, b"x", watch_id=7)
    assert (reason, w7.id) == ("", 7)
    assert world.watch(s, b"x", watch_id=7)[0] == DUPLICATE_ID
    assert world.watch(s, b"x", watch_id=3)[1].id == 3
    assert [world.watch(s, b"x")[1].id for _ in range(3)] == [2, 4, 5]  # skips 3, a taken id
    world.hub._remove(s.watchers[0])
    assert world.watch(s, b"x")[1].id == 6  # an id is not reused on its stream
    assert world.watch(new_stream(), b"x")[1].id == 0  # ids are per stream
    assert world.watch(s, b"b", b"a")[0] == EMPTY_RANGE
    assert world.watch(s, b"b", b"b")[0] == EMPTY_RANGE
    assert world.watch(s, b"b", b"\x00")[0] == ""  # from-key is not an empty range


def test_events_of_a_batch_go_to_matching_watchers_in_revision_order(world: World) -> None:
    world.apply(put(b"a/0"))
    s = new_stream()
    _, one = world.watch(s, b"a/1")
    _, pre = world.watch(s, b"a/", b"a0", no_delete=True)
    world.apply(put(b"a/1"), put(b"b"), put(b"a/2"), ("delete_range", pb.DeleteRangeRequest(key=b"a/1")))
    got = sent(s)
    assert [(r.watch_id, r.header.revision, [(e.type, e.kv.key) for e in r.events]) for r in got] == [
        (0, 3, [(0, b"a/1")]), (1, 3, [(0, b"a/1")]), (1, 5, [(0, b"a/2")]), (0, 6, [(1, b"a/1")])]
    # next_rev moves with what a watcher is sent (a synced watcher has everything up to hub.rev)
    assert (one.next_rev, pre.next_rev, world.hub.rev) == (7, 6, 6)


def test_revoke_in_a_batch_cancels_after_the_events_before_it(world: World) -> None:
    setup_auth(world)
    s_alice, s_bob = new_stream(), new_stream()
    assert world.watch(s_alice, b"a/", b"a0", user="alice")[0] == ""
    assert world.watch(s_alice, b"foo", user="alice")[0] == ""
    assert world.watch(s_bob, b"a/x", user="bob")[0] == ""
    assert world.watch(s_alice, b"b", user="alice")[0] == PERMISSION_DENIED  # create-time check
    revoke = ("auth_role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"a/", range_end=b"a0"))
    world.apply(put(b"a/x", b"1"), put(b"foo", b"1"), revoke, put(b"a/x", b"2"), put(b"foo", b"2"))
    assert summary(s_alice) == [(0, False, "", [b"a/x"]), (1, False, "", [b"foo"]), (0, True, PERMISSION_DENIED, []),
                                (1, False, "", [b"foo"])]
    assert summary(s_bob) == [(0, False, "", [b"a/x"]), (0, True, PERMISSION_DENIED, [])]
    assert set(s_alice.watchers) == {1} and not s_bob.watchers
    world.apply(put(b"a/x", b"3"))
    assert sent(s_alice) == [] and sent(s_bob) == []


@pytest.mark.parametrize(("change", "reason"), [
    (("auth_user_delete", pb.AuthUserDeleteRequest(name="alice")), INVALID_TOKEN),
    (("auth_user_change_password", pb.AuthUserChangePasswordRequest(name="alice", hashedPassword=HASH2)),
     INVALID_TOKEN),
    (("auth_user_revoke_role", pb.AuthUserRevokeRoleRequest(name="alice", role="r")), PERMISSION_DENIED),
    (("auth_role_delete", pb.AuthRoleDeleteRequest(role="r")), PERMISSION_DENIED),
])
def test_each_auth_change_cancels_with_etcds_reason(world: World, change: tuple[str, Any], reason: str) -> None:
    setup_auth(world)
    s = new_stream()
    world.watch(s, b"foo", user="alice")
    _, root_w = world.watch(s, b"foo", user="root")
    world.apply(put(b"foo", b"1"), change, put(b"foo", b"2"))
    assert summary(s) == [(0, False, "", [b"foo"]), (1, False, "", [b"foo"]), (0, True, reason, []),
                          (1, False, "", [b"foo"])]
    assert set(s.watchers) == {1} and not root_w.removed


def test_an_unrelated_auth_change_cancels_nothing(world: World) -> None:
    setup_auth(world)
    s = new_stream()
    world.watch(s, b"foo", user="alice")
    world.apply(("auth_role_add", pb.AuthRoleAddRequest(name="other")), put(b"foo"))
    assert summary(s) == [(0, False, "", [b"foo"])]


def test_auth_disable_keeps_watches_and_enable_cancels_anonymous_ones(world: World) -> None:
    setup_auth(world)
    world.apply(("auth_disable", pb.AuthDisableRequest()))
    s = new_stream()
    assert world.watch(s, b"foo")[0] == ""  # anonymous while disabled
    world.watch(s, b"foo", user="alice")
    world.apply(put(b"foo", b"1"), user="")
    world.apply(("auth_enable", pb.AuthEnableRequest()), user="")
    world.apply(put(b"foo", b"2"))
    assert summary(s) == [(0, False, "", [b"foo"]), (1, False, "", [b"foo"]), (0, True, USER_EMPTY, []),
                          (1, False, "", [b"foo"])]


def test_progress_interval_from_env() -> None:
    default = hubmod.DEFAULT_PROGRESS_INTERVAL
    assert hubmod.progress_interval_from_env({}) == default
    assert hubmod.progress_interval_from_env({"RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL": ""}) == default
    assert hubmod.progress_interval_from_env({"RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL": "0.25s"}) == 0.25
    assert hubmod.progress_interval_from_env({"RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL": "2"}) == 2.0


# ---- the async paths: create, catch-up from history, resume -----------------------------------------

def create_msg(key: bytes, end: bytes = b"", *, user: str, start: int = 0, watch_id: int = 0,
               resume: bool = False, **kw: Any) -> spb.WatchStreamRequest:
    return spb.WatchStreamRequest(
        header=ipb.RequestHeader(username=user, auth_revision=ANY_REV),
        request=pb.WatchRequest(create_request=pb.WatchCreateRequest(
            key=key, range_end=end, start_revision=start, watch_id=watch_id, **kw)),
        resume=resume, current_revision=True)


async def responses(stream: Stream, until: Any, timeout: float = 5.0) -> list[pb.WatchResponse]:
    """Responses from `stream` until one satisfies `until` (inclusive)."""
    out: list[pb.WatchResponse] = []
    async with asyncio.timeout(timeout):
        while not out or not until(out[-1]):
            item = await stream.queue.get()
            assert isinstance(item, bytes), item
            out.append(pb.WatchResponse.FromString(item))
    return out


def test_catch_up_stops_at_the_revoking_entry(world: World) -> None:
    """A watch still reading history when its permission goes gets the history up to the revoking
    entry, then its cancel: never an event after it."""
    setup_auth(world)
    first = world.apply(put(b"a/x", b"1"))[0].header.revision
    world.apply(put(b"a/x", b"2"), put(b"a/x", b"3"))
    revoke = ("auth_role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"a/", range_end=b"a0"))

    async def scenario() -> list[pb.WatchResponse]:
        s = new_stream()
        await world.hub._create(s, create_msg(b"a/x", user="alice", start=first))
        world.apply(revoke, put(b"a/x", b"4"))  # before the catch-up task has run
        return await responses(s, lambda r: r.canceled)

    got = asyncio.run(scenario())
    assert [(r.watch_id, r.created, r.canceled, r.cancel_reason, [e.kv.value for e in r.events]) for r in got] == [
        (0, True, False, "", []), (0, False, False, "", [b"1", b"2", b"3"]), (0, False, True, PERMISSION_DENIED, [])]


def test_resume_keeps_the_id_sends_no_created_and_is_checked_at_resume_time(world: World) -> None:
    """The proxy re-creates a watch on a new leader with `resume`: same id, no `created`, history
    from the first revision the client has not seen; refused now -> canceled under its own id."""
    setup_auth(world)
    first = world.apply(put(b"a/x", b"1"))[0].header.revision
    world.apply(put(b"a/x", b"2"))

    async def scenario() -> tuple[list[pb.WatchResponse], list[pb.WatchResponse]]:
        s = new_stream()
        await world.hub._create(s, create_msg(b"a/x", user="alice", start=first + 1, watch_id=5, resume=True))
        ok = await responses(s, lambda r: bool(r.events) or r.canceled, timeout=2)
        world.apply(("auth_role_revoke_permission",
                     pb.AuthRoleRevokePermissionRequest(role="r", key=b"a/", range_end=b"a0")))
        world.apply(put(b"a/x", b"3"))
        s2 = new_stream()
        await world.hub._create(s2, create_msg(b"a/x", user="alice", start=first + 2, watch_id=5, resume=True))
        refused = await responses(s2, lambda r: r.canceled)
        return ok, refused

    ok, refused = asyncio.run(scenario())
    assert [(r.watch_id, r.created, [e.kv.value for e in r.events]) for r in ok] == [(5, False, [b"2"])]
    assert [(r.watch_id, r.created, r.canceled, r.cancel_reason) for r in refused] == [
        (5, False, True, PERMISSION_DENIED)]


def test_resume_is_checked_against_the_token_the_stream_was_opened_with(world: World) -> None:
    """A password changed while the proxy looked for the new leader: a JWT whose revision predates
    it, and a simple token it dropped, both resume as `invalid auth token`. An unrelated auth change
    since the token was issued cancels neither."""
    import hashlib

    setup_auth(world)
    with world.applier.env.begin() as txn:
        issued = world.applier.auth.revision(txn)
    token = world.apply(("authenticate", ipb.InternalAuthenticateRequest(
        name="alice", simple_token="abcdefghijklmnop", checked_revision=issued)), user="")[0].token
    world.apply(("auth_role_add", pb.AuthRoleAddRequest(name="other")))

    def resume(kind: str) -> spb.WatchStreamRequest:
        msg = create_msg(b"foo", user="alice", watch_id=3, resume=True)
        if kind == "jwt":
            msg.header.auth_revision, msg.current_revision = issued, False
        else:
            msg.token_digest = hashlib.sha256(token.encode()).digest()
        return msg

    async def scenario() -> tuple[list[bool], list[list[tuple[int, bool, str]]]]:
        kept = []
        for kind in ("jwt", "simple"):
            s = new_stream()
            await world.hub._create(s, resume(kind))
            kept.append(3 in s.watchers and s.queue.empty())
        world.apply(("auth_user_change_password",
                     pb.AuthUserChangePasswordRequest(name="alice", hashedPassword=HASH2)))
        refused = []
        for kind in ("jwt", "simple"):
            s = new_stream()
            await world.hub._create(s, resume(kind))
            refused.append([(r.watch_id, r.canceled, r.cancel_reason) for r in await responses(s, lambda r: True)])
        return kept, refused

    kept, refused = asyncio.run(scenario())
    assert token and kept == [True, True]
    assert refused == [[(3, True, INVALID_TOKEN)], [(3, True, INVALID_TOKEN)]]


# ---- vouched tokens: a sidecar-class stream judges its tokens again ------------------------------------

def vouched(token: str, key: bytes, *, user: str = "alice", watch_id: int = 0,
            expires_at: float | None = None) -> tuple[spb.WatchStreamRequest, hubmod.Vouched]:
    msg = create_msg(key, user=user, watch_id=watch_id)
    return msg, hubmod.Vouched(msg.SerializeToString(), token, user, expires_at)


def test_a_dead_token_ends_only_its_watches_and_is_forgotten(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Judged every interval: a token the judge drops, or that now names another user, ends the
    watches it created with `invalid auth token`; a token still good keeps its watch; the stream
    holds no token once no open watch uses it."""
    setup_auth(world)
    monkeypatch.setattr(hubmod, "RECHECK_SECONDS", 0.01)
    verdicts: dict[str, tuple[str, float | None] | None] = {"good": ("alice", None), "bad": ("alice", None),
                                                            "swapped": ("alice", None)}

    async def judge(token: str) -> tuple[str, float | None] | None:
        return verdicts[token]

    async def scenario() -> tuple[list[pb.WatchResponse], Stream]:
        s = Stream(judge=judge)
        for i, token in enumerate(["good", "bad", "swapped", "bad"]):
            msg, vouch = vouched(token, b"foo", watch_id=i + 1)
            await world.hub._create(s, msg, vouch)
        assert {t: h.count for t, h in s.tokens.items()} == {"good": 1, "bad": 2, "swapped": 1}
        task = asyncio.get_running_loop().create_task(world.hub._judge_tokens(s))
        verdicts["bad"], verdicts["swapped"] = None, ("bob", None)
        got: list[pb.WatchResponse] = []
        async with asyncio.timeout(5):
            while len([r for r in got if r.canceled]) < 3:
                got.append(pb.WatchResponse.FromString(await s.queue.get()))  # type: ignore[arg-type]
        task.cancel()
        return got, s

    got, s = asyncio.run(scenario())
    created, ended = got[:4], got[4:]
    assert [(r.watch_id, r.created) for r in created] == [(1, True), (2, True), (3, True), (4, True)]
    assert sorted((r.watch_id, r.canceled, r.cancel_reason) for r in ended) == [
        (2, True, INVALID_TOKEN), (3, True, INVALID_TOKEN), (4, True, INVALID_TOKEN)]
    assert set(s.watchers) == {1} and set(s.tokens) == {"good"}
    world.hub._remove(s.watchers[1])
    assert s.tokens == {}


def test_a_token_ends_its_watches_at_its_exp_without_asking(world: World) -> None:
    setup_auth(world)
    asked: list[str] = []

    async def judge(token: str) -> tuple[str, float | None] | None:
        asked.append(token)
        return "alice", None

    async def scenario() -> list[pb.WatchResponse]:
        s = Stream(judge=judge)
        msg, vouch = vouched("t", b"foo", expires_at=time.time() + 0.2)
        await world.hub._create(s, msg, vouch)
        task = asyncio.get_running_loop().create_task(world.hub._judge_tokens(s))
        got = await responses(s, lambda r: r.canceled)
        assert time.time() >= vouch.expires_at  # type: ignore[operator]
        task.cancel()
        return got

    got = asyncio.run(scenario())
    assert [(r.created, r.canceled, r.cancel_reason) for r in got] == [(True, False, ""), (False, True, INVALID_TOKEN)]
    assert asked == []  # within the first interval: its exp alone ended it


def test_with_auth_off_a_dead_token_ends_nothing(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd ignores tokens while auth is off: the token is forgotten, the watch stays; turning auth
    on again re-checks every watch anyway (the tap)."""
    monkeypatch.setattr(hubmod, "RECHECK_SECONDS", 0.01)

    async def judge(token: str) -> tuple[str, float | None] | None:
        return None

    async def scenario() -> Stream:
        s = Stream(judge=judge)
        msg, vouch = vouched("t", b"foo", user="")
        await world.hub._create(s, msg, vouch)
        task = asyncio.get_running_loop().create_task(world.hub._judge_tokens(s))
        async with asyncio.timeout(5):
            while s.tokens:
                await asyncio.sleep(0.01)  # polling a condition
        task.cancel()
        return s

    s = asyncio.run(scenario())
    assert [(r.created, r.canceled) for r in sent(s)] == [(True, False)]
    assert set(s.watchers) == {0} and not s.watchers[0].removed


def test_a_central_stream_ignores_vouches(world: World) -> None:
    """Only a stream the store serves a sidecar-class caller on has a judge: no token is held."""
    setup_auth(world)

    async def scenario() -> Stream:
        s = new_stream()
        msg, vouch = vouched("t", b"foo")
        await world.hub._create(s, msg, vouch)
        return s

    s = asyncio.run(scenario())
    assert s.tokens == {} and s.watchers[0].token is None
