"""A watch of a password user (auth enabled) across kill -9 of the store leader: the proxy resumes it
on the new leader with no gap, no duplicate and no cancel; afterwards the resumed watch is still
re-checked on auth changes (a revoke cancels it with etcd's reason)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.cluster import local_cluster
from tests.support.processes import etcdctl
from tests.support.wclient import PERMISSION_DENIED, WatchStream, login, md

pytestmark = pytest.mark.slow

ROOT = "root:rootpw"


def test_authenticated_watch_survives_leader_kill_then_is_rechecked(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        endpoint = f"http://{cluster.endpoint}"
        for args in [("user", "add", ROOT), ("user", "add", "alice:pw"), ("role", "add", "r"),
                     ("role", "grant-permission", "r", "read", "w/", "--prefix"), ("user", "grant-role", "alice", "r"),
                     ("auth", "enable")]:
            rc, out, err = etcdctl(endpoint, *args, user=None if args[:2] == ("user", "add") else ROOT)
            assert rc == 0, (args, out, err)

        async def main() -> tuple[int, list[tuple[int, bool, str, list[int]]]]:
            async with grpc.aio.insecure_channel(cluster.endpoint) as ch:
                root = await login(ch, "root", "rootpw")
                alice = await login(ch, "alice", "pw")
                kv = pbg.KVStub(ch)

                async def write(n: int) -> int:
                    rev = 0
                    for i in range(n):
                        while True:
                            try:
                                r = await kv.Put(pb.PutRequest(key=b"w/%d" % i, value=b"x"), metadata=md(root),
                                                 timeout=5)
                                rev = r.header.revision
                                break
                            except grpc.aio.AioRpcError:
                                await asyncio.sleep(0.1)
                    return rev

                ws = WatchStream(ch, alice)
                created = await ws.create(b"w/", range_end=b"w0")
                assert (created.watch_id, created.canceled) == (0, False), created
                start = created.header.revision + 1
                got: list[tuple[int, bool, str, list[int]]] = []

                async def until(pred) -> None:  # type: ignore[no-untyped-def]
                    while not got or not pred(got[-1]):
                        r = await ws.recv(timeout=30)
                        got.append((r.watch_id, r.canceled, r.cancel_reason, [e.kv.mod_revision for e in r.events]))
                        if r.canceled:
                            return

                last = await write(5)
                await until(lambda g: g[3] and g[3][-1] >= last)
                leader = await asyncio.to_thread(cluster.leader)
                await asyncio.to_thread(cluster.kill, leader)
                last = await write(5)
                await until(lambda g: g[3] and g[3][-1] >= last)
                # the resumed watch is re-checked on the new leader
                await pbg.AuthStub(ch).RoleRevokePermission(
                    pb.AuthRoleRevokePermissionRequest(role="r", key=b"w/", range_end=b"w0"), metadata=md(root),
                    timeout=10)
                await write(1)
                await until(lambda g: g[1])
                ws.close()
                return start, got

        start, got = asyncio.run(main())
        events = [rev for g in got for rev in g[3]]
        # one put per revision (a put retried across the kill may add one): no gap, no duplicate
        assert len(events) >= 10 and events == list(range(start, events[-1] + 1)), got
        assert all(not g[1] for g in got[:-1]), got
        assert got[-1][:3] == (0, True, PERMISSION_DENIED), got
