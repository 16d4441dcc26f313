"""Requests as large as etcd accepts, and a store copy of tens of MiB, through the store's fixed
1 MiB receive windows (raftgate/flow_windows.py: no BDP probing on the internal and peer ports).

A fixed window only slows a transfer to one window per round trip; these check that nothing larger
than a window is refused or stalls: a 1.5 MiB Put (etcd's default --max-request-bytes) and a Txn
of the same size through the proxy to a 3-node cluster, replicated to every follower, and a
follower that was away catching up by a snapshot of ~40 MiB over the peer port.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, program_cluster, retry_ok
from tests.support.processes import wait_for

SNAPSHOT_FLAGS = ["--snapshot-count", "20", "--snapshot-catchup-entries", "5"]
PREFIX = b"/big/"
MAX_REQUEST = 1572864  # etcd's embed.DefaultMaxRequestBytes
LARGEST_VALUE = MAX_REQUEST - 64  # a PutRequest of just under --max-request-bytes


def _value(tag: int, size: int) -> bytes:
    return bytes([tag % 251]) * size


@pytest.mark.slow
def test_requests_as_large_as_etcd_accepts_and_a_large_snapshot_cross_the_fixed_windows(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3, store_flags=SNAPSHOT_FLAGS) as cluster:
        client = Client(cluster.endpoint)
        try:
            retry_ok(lambda: client.put(PREFIX + b"put", _value(1, LARGEST_VALUE), timeout=30), 60, "a 1.5 MiB Put")
            third = LARGEST_VALUE // 3 - 64
            txn = rpc_pb2.TxnRequest(success=[
                rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=PREFIX + b"txn/%d" % i, value=_value(i, third)))
                for i in range(3)])
            assert txn.ByteSize() <= MAX_REQUEST
            assert retry_ok(lambda: client.kv.Txn(txn, timeout=30), 60, "a 1.5 MiB Txn").succeeded
            cluster.wait_converged(timeout=60)
            for node in cluster.nodes:
                cluster.sync(node)
                assert cluster.local_keys(node, PREFIX + b"put") == {PREFIX + b"put": _value(1, LARGEST_VALUE)}
            leader = cluster.leader()
            victim = cluster.followers(leader)[0]
            cluster.kill(victim)
            for i in range(30):  # ~40 MiB the victim misses, far past what the leader's log keeps
                retry_ok(lambda i=i: client.put(PREFIX + b"away/%02d" % i, _value(i, 1400 * 1024), timeout=30), 60,
                         "large writes while a follower is away")
            wait_for(lambda: "log compacted" in leader.output(), 30, "the leader to compact its log")
            cluster.restart(victim)
            wait_for(lambda: "installed a snapshot" in victim.output(), 120, "the follower to install the snapshot")
            cluster.wait_converged(timeout=60)
            for i in (0, 29):
                key = PREFIX + b"away/%02d" % i
                assert cluster.local_keys(victim, key) == {key: _value(i, 1400 * 1024)}
        finally:
            client.close()
