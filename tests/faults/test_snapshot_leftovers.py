"""A client's snapshot must not leave a copy of the database behind, whoever ends it first.

Each Snapshot call streams a full temporary copy of the store. A client that goes away in the
middle (etcdctl interrupted, a deadline, a lost connection) and a store killed in the middle must
both leave no copy on the node's disk: every copy left behind is the size of the database, and
nothing else ever removes it. The copy belongs on the data volume, not in the temporary
directory: in the chart /tmp is a 64 MiB memory-backed volume shared with nothing that size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness import wait_for

from protos.etcdserverpb import rpc_pb2

from .cluster import Client, Node, program_cluster, retry_ok

pytestmark = pytest.mark.slow

#: large enough that the stream cannot sit whole in the transport's buffers while a client waits
VALUES = 50
VALUE_BYTES = 500_000
#: the store's own files under its data dir: the LMDB environment and the log
LIVE = {"store", "wal"}


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def _copies(node: Node, tmpdir: Path) -> list[Path]:
    """Every file the store keeps beyond its live database and log: snapshot copies."""
    extra = [p for top in node.data_dir.iterdir() if top.name not in LIVE for p in _files(top)]
    return _files(tmpdir) + extra


def _fill(client: Client) -> None:
    value = os.urandom(VALUE_BYTES)
    for i in range(VALUES):
        client.put(b"/big/%03d" % i, value, timeout=20)


def _open_snapshot(client: Client) -> Any:
    """A Snapshot stream of which one chunk has been read (a call: iterable and cancellable)."""
    stream = client.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), timeout=120)
    first = next(stream)
    assert first.remaining_bytes > 0
    return stream


def test_a_cancelled_snapshot_leaves_no_copy_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client reads one chunk and cancels: the store must drop its copy, not keep it for ever."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    with program_cluster(tmp_path / "cluster", nodes=1) as cluster:
        (node,) = cluster.nodes
        client = Client(cluster.endpoint)
        try:
            _fill(client)
            stream = _open_snapshot(client)
            assert _copies(node, tmpdir), "the stream ended before the client cancelled it"
            stream.cancel()
            wait_for(lambda: not _copies(node, tmpdir), 30, "the store to remove the copy of a cancelled snapshot")
            # and a whole snapshot still works afterwards
            total = sum(len(c.blob) for c in client.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), timeout=120))
            assert total > VALUES * VALUE_BYTES
            wait_for(lambda: not _copies(node, tmpdir), 30, "the store to remove the copy of a finished snapshot")
        finally:
            client.close()


def test_a_store_killed_during_a_snapshot_leaves_no_copy_behind(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of the store mid-stream: the client gets an error, and the restarted node holds
    no copy, in its data dir or in the temporary directory (a crash-looping node would
    otherwise fill its disk one database-sized copy per crash)."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    with program_cluster(tmp_path / "cluster", nodes=1) as cluster:
        (node,) = cluster.nodes
        client = Client(cluster.endpoint)
        try:
            _fill(client)
            stream = _open_snapshot(client)
            assert _copies(node, tmpdir), "the stream ended before the store was killed"
            assert not _files(tmpdir), "the copy is in the temporary directory, not on the data volume"
            cluster.kill(node)
            with pytest.raises(grpc.RpcError) as failed:
                for _ in stream:
                    pass
            assert failed.value.code() == grpc.StatusCode.UNKNOWN
            assert failed.value.details() == "snapshot: the connection to the store was lost"
            cluster.restart(node)
            assert not _copies(node, tmpdir)
            retry_ok(lambda: client.put(b"/after", b"x"), 20, "a write after the restart")
            assert client.get(b"/big/000") is not None
        finally:
            client.close()
