"""A client that opens Maintenance.Snapshot and stops reading holds the store node's one client
snapshot slot (f3010f3) for as long as its stream lives: every other Snapshot on that node waits
behind it, without bound when the stalled call has no deadline (etcd serves snapshots side by side).

Not fixed here: the slot bounds the disk the copies take, and a stalled stream's copy (or an LMDB
read transaction held instead) costs disk for as long as it lives. A fix needs a progress bound
(end a client snapshot whose reader takes nothing for a while) or a copy-free stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import store_and_proxy

pytestmark = pytest.mark.slow


@pytest.fixture
def target(tmp_path: Path) -> Iterator[str]:
    with store_and_proxy(tmp_path) as target:
        yield target


@pytest.mark.xfail(strict=True, reason="a stalled Snapshot reader holds the node's one snapshot slot (see docstring)")
def test_a_stalled_snapshot_reader_does_not_block_other_snapshots(target: str) -> None:
    with grpc.insecure_channel(target) as ch:
        kv = pbg.KVStub(ch)
        for i in range(40):  # ~20 MB: more than the flow-control windows between client and store
            kv.Put(pb.PutRequest(key=b"r%03d" % i, value=bytes([i]) * 500_000), timeout=30)
        # Its receive window fixed at gRPC's initial 64 KiB: with BDP probing a reader that takes
        # nothing may still have its window grown past the whole ~20 MB (the run then passes: it
        # did once in a loaded full suite, a strict xfail then fails).
        stalled_channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1),
                                                                 ("grpc.http2.bdp_probe", 0)])
        try:
            stalled = pbg.MaintenanceStub(stalled_channel).Snapshot(pb.SnapshotRequest())
            assert next(stalled).blob  # started, then never read again
            # 8 s: a few times what ~20 MB takes on 127.0.0.1 when nothing blocks it (while the bug
            # stands, the test waits this out on every run)
            chunks = list(pbg.MaintenanceStub(ch).Snapshot(pb.SnapshotRequest(), timeout=8))
            assert chunks[-1].remaining_bytes == 0
        finally:
            stalled_channel.close()
