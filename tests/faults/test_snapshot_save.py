"""A client's Snapshot call: it must never take a store node down, and it must never hang.

A key with hundreds of revisions is many duplicates in one key of the MVCC index (a sub-database
of its own inside LMDB once they outgrow a page). LMDB 0.9.36's compacting copy crashed the store
process on exactly that shape, from one `etcdctl snapshot save`. The same save runs side by side
against a real etcd, which serves it.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, program_cluster
from tests.support.processes import BACKENDS, ETCDCTL, etcdctl, new_server, wait_for

pytestmark = pytest.mark.slow

HOT_KEY = b"/hot"
REVISIONS = 300


def _many_revisions(target: str) -> None:
    client = Client(target)
    try:
        for i in range(REVISIONS):
            client.put(HOT_KEY, b"v%d" % i, timeout=10)
    finally:
        client.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_snapshot_save_of_a_key_with_many_revisions(backend: str, tmp_path: Path) -> None:
    server = new_server(backend, tmp_path / backend)
    server.start()
    try:
        target = server.endpoint.removeprefix("http://")
        _many_revisions(target)
        out_file = tmp_path / "saved.db"
        rc, out, err = etcdctl(server.endpoint, "snapshot", "save", str(out_file), timeout=60)
        assert rc == 0, err
        assert f"Snapshot saved at {out_file}" in out
        assert out_file.stat().st_size > 0
        # the server is still there and still serves
        rc, out, err = etcdctl(server.endpoint, "put", "/after", "x")
        assert (rc, out.strip()) == (0, "OK"), err
        rc, out, err = etcdctl(server.endpoint, "get", HOT_KEY.decode(), "--print-value-only")
        assert (rc, out.strip()) == (0, f"v{REVISIONS - 1}"), err
        if backend == "raftgate":
            state = server.local_json()  # type: ignore[union-attr]
            assert state is not None
            assert "exited" not in server.output()
    finally:
        server.stop()


def test_snapshot_of_a_lost_store_fails_at_once(tmp_path: Path) -> None:
    """With its only store node gone, `etcdctl snapshot save` ends with an error instead of hanging.

    etcd's client retries a stream that failed with Unavailable before its first message, and the
    proxy would send each retry to the same dead node: the proxy must end the stream with an
    error clients do not retry, and name no internal address in it.
    """
    with program_cluster(tmp_path, nodes=1) as cluster:
        client = Client(cluster.endpoint)
        try:
            client.put(b"/k", b"v", timeout=10)
        finally:
            client.close()
        (node,) = cluster.nodes
        cluster.kill(node)
        proc = subprocess.Popen([ETCDCTL, f"--endpoints={cluster.endpoint}", "snapshot", "save",
                                 str(tmp_path / "lost.db")], env={"ETCDCTL_API": "3"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            finished = threading.Event()
            threading.Thread(target=lambda: (proc.wait(), finished.set()), daemon=True).start()
            # far longer than one failed attempt takes; a hang retries until killed
            ended = finished.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate(timeout=10)
        assert ended, f"etcdctl snapshot save was still retrying after 30 s: {err[-500:]}"
        assert proc.returncode != 0
        assert "Error:" in err
        assert node.internal not in err, err[-500:]
        assert not (tmp_path / "lost.db").exists()


def test_store_keeps_serving_after_many_snapshots(tmp_path: Path) -> None:
    """Concurrent Snapshot calls on a store whose index holds large duplicate sets: all complete,
    and the node answers ordinary requests afterwards."""
    with program_cluster(tmp_path, nodes=1) as cluster:
        _many_revisions(cluster.endpoint)
        client = Client(cluster.endpoint)
        results: list[int] = []

        def save() -> None:
            total = 0
            for chunk in client.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), timeout=60):
                total += len(chunk.blob)
            results.append(total)

        try:
            threads = [threading.Thread(target=save) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=90)
            assert len(results) == 3 and all(size > 0 for size in results)
            assert client.get(HOT_KEY) == b"v%d" % (REVISIONS - 1)
            wait_for(lambda: cluster.nodes[0].running, 5, "the store to be running")
        finally:
            client.close()


def test_snapshot_right_after_the_leader_is_lost_comes_from_the_new_leader(tmp_path: Path) -> None:
    """Two of three store nodes still serve: a snapshot asked for just after the leader died must
    not fail because the proxy's guess of the leader is stale (a Put at that moment succeeds).
    Before its first chunk a snapshot is safe to ask of another node."""
    with program_cluster(tmp_path, nodes=3) as cluster:
        client = Client(cluster.endpoint)
        try:
            wait_for(lambda: cluster.leader(), 30, "a leader")
            client.put(b"/k", b"v", timeout=10)
        finally:
            client.close()
        cluster.kill(cluster.leader())
        out_file = tmp_path / "after-failover.db"
        endpoint = f"http://{cluster.endpoint}"
        rc, out, err = etcdctl(endpoint, "snapshot", "save", str(out_file), timeout=60)
        assert rc == 0, err[-500:]
        assert f"Snapshot saved at {out_file}" in out
        rc, out, err = etcdctl(endpoint, "get", "/k", "--print-value-only")
        assert (rc, out.strip()) == (0, "v"), err
