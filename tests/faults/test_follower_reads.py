"""Reads on every node (issue 13): the proxy spreads Range over the three store nodes, each
answers a linearizable read by ReadIndex, and nothing about it weakens what a client sees:
histories stay linearizable, a revoked permission is refused on every node at once, and a node
cut off from its leader serves nothing (etcd's errors instead). One cluster for the module."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import (
    Client,
    Cluster,
    Node,
    Recorder,
    Workload,
    prefix_end,
    program_cluster,
    retry_ok,
    root_header,
    setup_auth,
)
from tests.support.linearizability import GET, check
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow

PREFIX = b"/rv/"
KEY = PREFIX + b"k"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three nodes and a proxy with ``--store-reads spread``; auth on, one key written."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAFTGATE_PROXY_STORE_READS", "spread")  # read by the proxy program_cluster starts
        with program_cluster(Path(tmp_path_factory.mktemp("follower-reads")), nodes=3) as c:
            c.leader(timeout=60)
            root = Client(c.endpoint)
            try:
                retry_ok(lambda: root.put(KEY, b"v0"), 30, "a first write")
                setup_auth(root)
                for n in c.nodes:
                    c.leader_info(n)  # learns each node's member id
            finally:
                root.close()
            yield c


def _root(cluster: Cluster) -> Client:
    client = Client(cluster.endpoint)
    client.login("root", "rootpw")
    return client


def _serving_nodes(client: Client, want: int, key: bytes = KEY) -> set[int]:
    """Reads until `want` different nodes have answered (bounded): the member ids seen."""
    seen: set[int] = set()

    def more() -> bool:
        for _ in range(6):
            resp = client.kv.Range(rpc_pb2.RangeRequest(key=key), metadata=client.md, timeout=10)
            seen.add(resp.header.member_id)
        return len(seen) >= want

    wait_for(more, 30, f"reads answered by {want} nodes")
    return seen


def test_reads_through_the_proxy_are_served_by_every_node(cluster: Cluster) -> None:
    client = _root(cluster)
    try:
        assert _serving_nodes(client, 3) == {n.member_id for n in cluster.nodes}
        # serializable reads too (each node answers from its own state)
        seen = {client.kv.Range(rpc_pb2.RangeRequest(key=KEY, serializable=True), metadata=client.md,
                                timeout=10).header.member_id for _ in range(12)}
        assert len(seen) >= 2
    finally:
        client.close()


def test_a_history_with_reads_spread_is_linearizable(cluster: Cluster) -> None:
    client = _root(cluster)
    rec = Recorder()
    try:
        with Workload(cluster.endpoint, rec, clients=3, max_seconds=30, token=client.token, seed=13):
            wait_for(lambda: len(rec.records) >= 150, 30, "150 operations")
        rec.history.close()
        assert sum(1 for r in rec.records if r.op.kind == GET and r.op.status == "ok") >= 20, rec.errors()
        result = check(rec.history.ops)
        assert result.ok, result.describe()
    finally:
        client.close()


def _range(header: ipb.RequestHeader, *, serializable: bool) -> ipb.InternalRaftRequest:
    return ipb.InternalRaftRequest(header=header, range=rpc_pb2.RangeRequest(
        key=PREFIX, range_end=prefix_end(PREFIX), serializable=serializable))


def test_a_revoked_permission_is_refused_on_every_node(cluster: Cluster) -> None:
    root = _root(cluster)
    alice = Client(cluster.endpoint)
    try:
        a = root.auth
        md = root.md
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="reader"), metadata=md, timeout=10)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=PREFIX, range_end=prefix_end(PREFIX))
        a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="reader", perm=perm), metadata=md, timeout=10)
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="alicepw"), metadata=md, timeout=10)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="reader"), metadata=md, timeout=10)
        alice.login("alice", "alicepw")
        assert len(_serving_nodes(alice, 3)) == 3  # alice's reads reach the followers

        a.RoleRevokePermission(rpc_pb2.AuthRoleRevokePermissionRequest(
            role="reader", key=PREFIX, range_end=prefix_end(PREFIX)), metadata=md, timeout=10)
        # at once, on whichever node the proxy picks: never served with the older permissions
        for _ in range(12):
            with pytest.raises(grpc.RpcError) as info:
                alice.kv.Range(rpc_pb2.RangeRequest(key=KEY), metadata=alice.md, timeout=10)
            assert (info.value.code(), info.value.details()) == (  # type: ignore[attr-defined]
                grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
        # each node, asked directly with a request stamped at the revision the proxy now sees
        revision = root_header(root)().auth_revision
        for node in cluster.nodes:
            for serializable in (False, True):
                with pytest.raises(grpc.RpcError) as info:
                    cluster.do(node, _range(ipb.RequestHeader(username="alice", auth_revision=revision),
                                            serializable=serializable), timeout=10)
                assert info.value.details() == "etcdserver: permission denied", node.name  # type: ignore[attr-defined]
    finally:
        alice.close()
        root.close()


def _signal(node: Node, sig: signal.Signals) -> None:
    assert node.program is not None and node.program.proc is not None
    os.killpg(os.getpgid(node.program.proc.pid), sig)


def test_a_follower_cut_off_from_its_leader_serves_no_linearizable_read(cluster: Cluster) -> None:
    """The leader and the other follower are paused (SIGSTOP): the one left cannot confirm a read
    point with anybody, so it answers etcd's errors; the proxy serves nothing either."""
    client = _root(cluster)
    leader = cluster.leader()
    lone, other = cluster.followers(leader)[:2]
    header = root_header(client)()
    assert cluster.do(lone, _range(header, serializable=False)).kvs  # it serves while it can
    paused = [leader, other]
    try:
        for node in paused:
            _signal(node, signal.SIGSTOP)
        with pytest.raises(grpc.RpcError) as info:
            cluster.do(lone, _range(header, serializable=False), timeout=15)
        assert info.value.details() in (  # type: ignore[attr-defined]
            "etcdserver: leader changed", "etcdserver: no leader", "etcdserver: request timed out"), \
            info.value.details()  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError):
            client.kv.Range(rpc_pb2.RangeRequest(key=KEY), metadata=client.md, timeout=3)
    finally:
        for node in paused:
            _signal(node, signal.SIGCONT)
    try:
        assert retry_ok(lambda: client.get(KEY, 5), 30, "a read once the nodes are back") == b"v0"
    finally:
        client.close()
