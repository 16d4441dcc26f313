"""Trust item 10, end to end: the NOSPACE alarm is one replicated fact, raised by the leader.

As in etcd, the node that takes a write (the leader) notices that the store passed
`--quota-backend-bytes`, refuses the write with `etcdserver: mvcc: database space exceeded` and
puts the alarm (ACTIVATE NOSPACE, its own member ID) into the log; every node then refuses writes
that add data while it is set, and every node lists the same alarm. Deletes and compaction still
go through; once space is won back, `etcdctl alarm disarm` lets writes in again.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, program_cluster, retry_ok

QUOTA_FLAGS = ["--quota-backend-bytes", str(1 << 20)]
NOSPACE = (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded")
VALUE = b"v" * (200 << 10)


def _code(exc: grpc.RpcError) -> tuple[grpc.StatusCode, str]:
    return exc.code(), exc.details()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_nospace_is_raised_by_the_leader_through_the_log(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3, store_flags=QUOTA_FLAGS) as cluster:
        client = Client(cluster.endpoint)
        try:
            refused = None
            for i in range(20):
                try:
                    retry_ok(lambda i=i: _put_or_nospace(client, b"/big/%02d" % i), 20, "a big write")
                except _NoSpace as exc:
                    refused = exc.error
                    break
            assert refused == NOSPACE, refused
            leader = cluster.leader()

            # Every node lists the same alarm: the leader's NOSPACE, from the log.
            def alarms(node: object) -> list[tuple[int, int]]:
                resp = cluster.do(node, ipb.InternalRaftRequest(  # type: ignore[arg-type]
                    header=ipb.RequestHeader(username="root"),
                    alarm=rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.GET)))
                return sorted((a.memberID, a.alarm) for a in resp.alarms)

            expected = [(leader.member_id, rpc_pb2.NOSPACE)]
            for node in cluster.nodes:
                assert alarms(node) == expected, node.name
            listed = client.maintenance.Alarm(rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.GET), timeout=10)
            assert [(a.memberID, a.alarm) for a in listed.alarms] == expected

            # While it is set: a small write is refused too, a delete and a compaction are not.
            with pytest.raises(grpc.RpcError) as small:
                client.put(b"/small", b"x", timeout=10)
            assert _code(small.value) == NOSPACE
            deleted = client.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"/big/", range_end=b"/big0"), timeout=10)
            assert deleted.deleted > 0
            client.kv.Compact(rpc_pb2.CompactionRequest(revision=deleted.header.revision, physical=True), timeout=10)
            cluster.wait_converged()

            # Space won back: disarm (etcdctl alarm disarm), and writes go in again.
            for member_id, alarm in expected:
                client.maintenance.Alarm(rpc_pb2.AlarmRequest(action=rpc_pb2.AlarmRequest.DEACTIVATE,
                                                              memberID=member_id, alarm=alarm), timeout=10)
            retry_ok(lambda: client.put(b"/small", b"x", timeout=10), 20, "a write after the disarm")
            for node in cluster.nodes:
                assert alarms(node) == [], node.name
            cluster.wait_converged()
        finally:
            client.close()


class _NoSpace(Exception):
    def __init__(self, error: tuple[grpc.StatusCode, str]) -> None:
        super().__init__(error)
        self.error = error


def _put_or_nospace(client: Client, key: bytes) -> None:
    """A put; NOSPACE ends the filling (raised as _NoSpace, which retry_ok does not retry)."""
    try:
        client.put(key, VALUE, timeout=10)
    except grpc.RpcError as exc:
        if _code(exc)[0] == grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise _NoSpace(_code(exc)) from None
        raise
