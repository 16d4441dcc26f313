"""Watch through raftgate over raw gRPC: many watches on one stream, ids, cancel, filters,
history, compaction, progress, fragments, and the auth rules (create denial keeps the stream;
an auth change cancels exactly the watches it took the permission of, after the events before it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import RaftgateLocal
from tests.support.wclient import INVALID_TOKEN, PERMISSION_DENIED, USER_EMPTY, WatchStream, login, md

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def raftgate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaftgateLocal]:
    srv = RaftgateLocal(tmp_path_factory.mktemp("watch"), extra_args=["--nodes", "1"])
    srv.start()
    yield srv
    srv.stop()


def run(srv: RaftgateLocal, scenario) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as ch:
            await scenario(ch)

    asyncio.run(main())


async def put(ch: grpc.aio.Channel, key: bytes, value: bytes, token: str | None = None) -> int:
    return (await pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=value), metadata=md(token))).header.revision


def test_many_watches_ids_cancel_filters_history(raftgate: RaftgateLocal) -> None:
    async def scenario(ch: grpc.aio.Channel) -> None:
        kv = pbg.KVStub(ch)
        base = await put(ch, b"s/a", b"0")
        ws = WatchStream(ch)
        created = [await ws.create(b"s/a"), await ws.create(b"s/", range_end=b"s0"),
                   await ws.create(b"s/b", range_end=b"\x00"), await ws.create(b"s/", range_end=b"s0", watch_id=7)]
        assert [(c.watch_id, c.created, c.canceled) for c in created] == [
            (0, True, False), (1, True, False), (2, True, False), (7, True, False)]
        assert created[0].header.revision == base
        dup = await ws.create(b"x", watch_id=7)
        assert (dup.watch_id, dup.created, dup.canceled, dup.cancel_reason) == (
            -1, True, True, "mvcc: duplicate watch ID provided on the WatchStream")
        empty = await ws.create(b"b", range_end=b"a")
        assert (empty.watch_id, empty.canceled, empty.cancel_reason) == (-1, True, "mvcc: watcher range is empty")
        # NOPUT / NODELETE, prev_kv, and history from a start revision
        noput = await ws.create(b"s/", range_end=b"s0", filters=[pb.WatchCreateRequest.NOPUT], prev_kv=True)
        assert noput.watch_id == 3
        r1 = await put(ch, b"s/a", b"1")
        r2 = await put(ch, b"s/b", b"2")
        await kv.DeleteRange(pb.DeleteRangeRequest(key=b"s/a"))
        got: dict[int, list[tuple[int, int, bytes, bytes]]] = {}
        while sum(len(v) for v in got.values()) < 2 + 3 + 1 + 3 + 1:
            resp = await ws.recv()
            for ev in resp.events:
                prev = ev.prev_kv.value if ev.HasField("prev_kv") else b"-"
                got.setdefault(resp.watch_id, []).append((ev.kv.mod_revision, ev.type, ev.kv.key, prev))
        assert got[0] == [(r1, 0, b"s/a", b"-"), (r1 + 2, 1, b"s/a", b"-")]
        assert [e[:3] for e in got[1]] == [(r1, 0, b"s/a"), (r2, 0, b"s/b"), (r2 + 1, 1, b"s/a")]
        assert got[2] == [(r2, 0, b"s/b", b"-")]
        assert got[7] == got[1]
        assert got[3] == [(r2 + 1, 1, b"s/a", b"1")]  # a delete, with the value it had
        # cancel: a canceled response, then nothing more for that watch
        await ws.send(cancel_request=pb.WatchCancelRequest(watch_id=1))
        c = await ws.recv()
        assert (c.watch_id, c.canceled, c.created) == (1, True, False)
        await ws.send(cancel_request=pb.WatchCancelRequest(watch_id=99))  # unknown: etcd says nothing
        await put(ch, b"s/c", b"3")
        ids = set()
        while len(ids) < 2:
            ids.add((await ws.recv()).watch_id)
        assert ids == {2, 7}
        await ws.nothing(0.3)
        # a new stream reads history with prev_kv from a past revision
        hs = WatchStream(ch)
        assert (await hs.create(b"s/a", start_revision=base, prev_kv=True)).created
        resp = await hs.recv()
        assert [(e.type, e.kv.value, e.prev_kv.value) for e in resp.events] == [
            (0, b"0", b""), (0, b"1", b"0"), (1, b"", b"1")]
        # progress request: all watchers synced -> watch_id -1 at the current revision
        await hs.send(progress_request=pb.WatchProgressRequest())
        p = await hs.recv()
        cur = (await kv.Range(pb.RangeRequest(key=b"s/a"))).header.revision
        assert (p.watch_id, p.header.revision, len(p.events)) == (-1, cur, 0)
        ws.close()
        hs.close()

    run(raftgate, scenario)


def test_compacted_start_revision_and_fragments(raftgate: RaftgateLocal) -> None:
    async def scenario(ch: grpc.aio.Channel) -> None:
        kv = pbg.KVStub(ch)
        first = await put(ch, b"c/k", b"v1")
        for i in range(3):
            await put(ch, b"c/k", b"v%d" % (i + 2))
        last = await put(ch, b"c/k", b"v5")
        await kv.Compact(pb.CompactionRequest(revision=last - 1))
        ws = WatchStream(ch)
        c = await ws.create(b"c/k", start_revision=first)
        assert (c.watch_id, c.created, c.canceled) == (0, True, False)
        r = await ws.recv()
        assert (r.watch_id, r.canceled, r.compact_revision, len(r.events)) == (0, True, last - 1, 0)
        neg = await ws.create(b"c/k", start_revision=-1)
        assert (neg.watch_id, neg.created, neg.canceled, neg.cancel_reason) == (
            -1, True, True, "etcdserver: mvcc: required revision has been compacted")
        ok = await ws.create(b"c/k", start_revision=last - 1)
        assert ok.watch_id == 1
        r = await ws.recv()
        assert [e.kv.mod_revision for e in r.events] == [last - 1, last]
        # fragment: a catch-up response whose events together pass --max-request-bytes
        big = b"x" * (600 * 1024)
        start = await put(ch, b"f/0", big)
        for i in range(1, 4):
            await put(ch, b"f/%d" % i, big)
        fr = await ws.create(b"f/", range_end=b"f0", fragment=True, start_revision=start)
        assert fr.watch_id == 2
        parts = []
        while not parts or parts[-1].fragment:
            parts.append(await ws.recv())
        assert len(parts) > 1 and all(p.watch_id == 2 for p in parts)
        assert sum(len(p.events) for p in parts) == 4
        ws.close()

    run(raftgate, scenario)


def test_auth_create_denials_and_revocation_mid_stream(raftgate: RaftgateLocal) -> None:
    async def scenario(ch: grpc.aio.Channel) -> None:
        auth = pbg.AuthStub(ch)
        await auth.UserAdd(pb.AuthUserAddRequest(name="root", password="rootpw"))
        await auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"))
        await auth.RoleAdd(pb.AuthRoleAddRequest(name="rr"))
        for name in ("alice", "bob"):
            await auth.UserAdd(pb.AuthUserAddRequest(name=name, password="pw"))
            await auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user=name, role="rr"))
        perm = auth_pb2.Permission
        await auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
            name="rr", perm=perm(permType=perm.READWRITE, key=b"a/", range_end=b"a0")))
        await auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
            name="rr", perm=perm(permType=perm.READWRITE, key=b"foo")))
        await auth.AuthEnable(pb.AuthEnableRequest())
        root = await login(ch, "root", "rootpw")
        alice = await login(ch, "alice", "pw")
        bob = await login(ch, "bob", "pw")
        amd = md(root)
        # anonymous, bad token, no permission, from-key needs an open-ended grant (GHSA-xg4h)
        anon = WatchStream(ch)
        d = await anon.create(b"a/x")
        assert (d.watch_id, d.created, d.canceled, d.cancel_reason) == (-1, True, True, USER_EMPTY)
        bad = WatchStream(ch, "junk.token")
        assert (await bad.create(b"a/x")).cancel_reason == INVALID_TOKEN
        ws = WatchStream(ch, alice)
        assert (await ws.create(b"b")).cancel_reason == PERMISSION_DENIED
        fk = await ws.create(b"foo", range_end=b"\x00")
        assert (fk.watch_id, fk.canceled, fk.cancel_reason) == (-1, True, PERMISSION_DENIED)
        # the stream stays open: permitted watches work on it
        wa = await ws.create(b"a/", range_end=b"a0")
        wf = await ws.create(b"foo")
        assert (wa.watch_id, wf.watch_id, wa.canceled, wf.canceled) == (0, 1, False, False)
        bs = WatchStream(ch, bob)
        assert (await bs.create(b"a/", range_end=b"a0")).watch_id == 0
        r1 = await put(ch, b"a/1", b"before", root)
        # revoke a/ from the role: alice's and bob's a/ watches end after r1, foo's stays
        await auth.RoleRevokePermission(pb.AuthRoleRevokePermissionRequest(role="rr", key=b"a/", range_end=b"a0"),
                                        metadata=amd)
        await put(ch, b"a/2", b"after", root)
        await put(ch, b"foo", b"still", root)
        seen = []
        while True:
            resp = await ws.recv()
            seen.append((resp.watch_id, resp.canceled, resp.cancel_reason, [e.kv.key for e in resp.events]))
            if resp.watch_id == 1:
                break
        assert seen == [(0, False, "", [b"a/1"]), (0, True, PERMISSION_DENIED, []), (1, False, "", [b"foo"])]
        assert r1 > 0
        got = await bs.recv()
        assert [e.kv.key for e in got.events] == [b"a/1"]
        got = await bs.recv()
        assert (got.watch_id, got.canceled, got.cancel_reason) == (0, True, PERMISSION_DENIED)
        # deleting the user cancels its remaining watch (its token is no longer valid)
        await auth.UserDelete(pb.AuthUserDeleteRequest(name="alice"), metadata=amd)
        got = await ws.recv()
        assert (got.watch_id, got.canceled, got.cancel_reason) == (1, True, INVALID_TOKEN)
        # auth disable keeps watches; enable again cancels the anonymous ones
        rs = WatchStream(ch, root)
        assert (await rs.create(b"foo")).watch_id == 0
        await auth.AuthDisable(pb.AuthDisableRequest(), metadata=amd)
        an = WatchStream(ch)
        assert (await an.create(b"foo")).watch_id == 0
        await put(ch, b"foo", b"open")
        assert [e.kv.value for e in (await an.recv()).events] == [b"open"]
        assert [e.kv.value for e in (await rs.recv()).events] == [b"open"]
        await auth.AuthEnable(pb.AuthEnableRequest())
        got = await an.recv()
        assert (got.watch_id, got.canceled, got.cancel_reason) == (0, True, USER_EMPTY)
        for s in (anon, bad, ws, bs, rs, an):
            s.close()

    run(raftgate, scenario)
