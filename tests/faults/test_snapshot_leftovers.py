"""A client's snapshot must not leave a copy of the database behind, whoever ends it first.

Each Snapshot call streams a full temporary copy of the store. A client that goes away in the
middle (etcdctl interrupted, a deadline, a lost connection) and a store killed in the middle must
both leave no copy on the node's disk: every copy left behind is the size of the database, and
nothing else ever removes it. The copy belongs on the data volume, not in the temporary
directory: in the chart /tmp is a 64 MiB memory-backed volume shared with nothing that size.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, Cluster, Node, describe, program_cluster, retry_ok, setup_auth
from tests.support.processes import wait_for

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


def _database_copies(node: Node) -> list[Path]:
    """Copies of the store (data.mdb) and client snapshots in etcd's format written from one (etcd.db)."""
    return [p for p in _files(node.data_dir / "snap") if p.name in ("data.mdb", "etcd.db")]


def test_concurrent_snapshots_hold_one_copy_at_a_time(tmp_path: Path) -> None:
    """Each client snapshot is a full copy of the store on the data volume, kept while its client
    reads: without a bound, a few slow or stalled readers fill the volume the store itself writes
    to. A second snapshot waits for the first (and completes once it is gone)."""
    with program_cluster(tmp_path, nodes=1) as cluster:
        (node,) = cluster.nodes
        client = Client(cluster.endpoint)
        try:
            _fill(client)
            stalled = _open_snapshot(client)  # read one chunk, then stop reading
            second, thread = _read_whole_in_background(client)
            try:
                wait_for(lambda: "a client's snapshot waits" in node.output() or len(_database_copies(node)) > 1,
                         30, "the second snapshot to reach the store")
                assert len(_database_copies(node)) == 1, "two copies of the database on disk at once"
            finally:
                stalled.cancel()
                thread.join(timeout=150)
            assert not thread.is_alive()
            assert isinstance(second[0], int) and second[0] > VALUES * VALUE_BYTES, second
            wait_for(lambda: not _database_copies(node), 30, "the store to remove its copies")
        finally:
            client.close()


SNAPSHOT_FLAGS = ["--snapshot-count", "50", "--snapshot-catchup-entries", "10"]


def _snapshot_files(node: Node) -> list[Path]:
    return _files(node.data_dir / "snap")


def _inodes(node: Node) -> set[tuple[Path, int]]:
    """The snapshot files of ``node`` with their inodes (one removed meanwhile is left out)."""
    found = set()
    for path in _snapshot_files(node):
        with contextlib.suppress(FileNotFoundError):
            found.add((path, path.stat().st_ino))
    return found


def _pid(node: Node) -> int:
    assert node.program is not None and node.program.proc is not None
    return node.program.proc.pid


def _restart_quietly(cluster: Cluster, node: Node) -> None:
    """cluster.restart(node) in a thread: a start that ends in a kill -9 is expected here."""
    with contextlib.suppress(Exception):
        cluster.restart(node)


@pytest.mark.parametrize("victim_role", ["follower", "leader"])
def test_a_node_killed_during_catch_up_by_snapshot_leaves_no_copy_behind(victim_role: str, tmp_path: Path) -> None:
    """kill -9 of the follower while it receives a snapshot, or of the leader while it sends one:
    the restarted node holds no copy, and every node converges."""
    with program_cluster(tmp_path, nodes=3, store_flags=SNAPSHOT_FLAGS) as cluster:
        client = Client(cluster.endpoint)
        try:
            for i in range(20):
                retry_ok(lambda i=i: client.put(b"/early/%03d" % i, b"x"), 20, "early writes")
            leader = cluster.leader()
            lagging, _ = cluster.followers(leader)
            cluster.kill(lagging)
            value = os.urandom(VALUE_BYTES)
            for i in range(VALUES):
                retry_ok(lambda i=i: client.put(b"/big/%03d" % i, value, timeout=20), 20, "writes")
            wait_for(lambda: "log compacted" in leader.output(), 20, "the leader to compact its log")
            # The snapshot travels while the lagging node starts (it may even be installed before
            # the node prints its ready line), so the restart runs beside us and the lagging node is
            # stopped (SIGSTOP) at its first received chunk: the transfer then stalls, the leader's
            # copy and the follower's partial file both stay on disk, and the kill lands mid-transfer
            # whatever the machine's load (a poll for the victim's file alone raced the transfer).
            victim = lagging if victim_role == "follower" else leader
            starting = threading.Thread(target=_restart_quietly, args=(cluster, lagging), daemon=True)
            starting.start()
            deadline = time.monotonic() + 60
            while not _snapshot_files(lagging) and "installed a snapshot" not in lagging.output():
                assert time.monotonic() < deadline, "no snapshot reached the lagging node"
                time.sleep(0.002)  # a steady poll: wait_for's back-off would miss a short transfer
            os.kill(_pid(lagging), signal.SIGSTOP)
            try:
                assert "installed a snapshot" not in lagging.output(), "the snapshot was installed before the stop"
                wait_for(lambda: _snapshot_files(victim), 10, "the victim to hold its copy of the stalled snapshot")
                cluster.kill(victim)
            finally:
                if lagging.running:
                    os.kill(_pid(lagging), signal.SIGCONT)
            starting.join(timeout=90)
            assert not starting.is_alive()
            assert lagging.running == (victim is leader)  # a start that met the kill gave up
            # what the kill left: each file by its inode (a transfer started after the restart may
            # reuse a name, never the file)
            left = _inodes(victim)
            if victim is leader:
                assert lagging.running
                for i in range(5):
                    retry_ok(lambda i=i: client.put(b"/after/%d" % i, b"z"), 30, "writes under a new leader")
            cluster.restart(victim)
            assert _inodes(victim) & left == set(), "a copy outlived the kill"
            cluster.wait_converged(timeout=60)
            wait_for(lambda: "installed a snapshot" in lagging.output(), 30, "the follower to install a snapshot")
            # and the transfer after the restart leaves nothing either
            wait_for(lambda: _snapshot_files(victim) == [], 30, "the restarted node to hold no copy")
        finally:
            client.close()


def _writers(node: Node) -> list[int]:
    """Processes writing one of ``node``'s client snapshots in etcd's format (export.py), by pid."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"authstore.etcd_format.export" in argv and any(str(node.data_dir).encode() in a for a in argv):
                found.append(int(proc.name))
    return found


def test_a_snapshot_cancelled_while_its_file_is_written_keeps_its_turn_until_the_writer_is_gone(
        tmp_path: Path) -> None:
    """The client goes away while the store's writer process still writes etcd's file (here: held
    stopped). The snapshot's turn must not be handed to the next caller while that writer (and the
    copy it holds open) lives on: a client that cancels and retries would otherwise run writers and
    copies side by side without bound. The cancelled writer ends, the next snapshot completes, and
    nothing is left behind."""
    with program_cluster(tmp_path, nodes=1) as cluster:
        (node,) = cluster.nodes
        client = Client(cluster.endpoint)
        stopped: list[int] = []
        try:
            _fill(client)
            first = client.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), timeout=120)

            def read_one() -> None:
                with contextlib.suppress(grpc.RpcError):
                    next(first, None)

            reading = threading.Thread(target=read_one, daemon=True)
            reading.start()
            deadline = time.monotonic() + 60
            while not (stopped := _writers(node)):
                assert time.monotonic() < deadline, "the store started no writer"
                time.sleep(0.002)  # a steady poll: wait_for's back-off would miss a short-lived writer
            for pid in stopped:
                os.kill(pid, signal.SIGSTOP)
            first.cancel()
            reading.join(timeout=30)
            second, thread = _read_whole_in_background(client)
            wait_for(lambda: "a client's snapshot waits" in node.output() or set(_writers(node)) - set(stopped)
                     or second, 60, "the second snapshot to reach the store")
            alive = [pid for pid in stopped if pid in _writers(node)]
            assert not (alive and set(_writers(node)) - set(stopped)), "two writers (and copies) at once"
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            stopped = []
            thread.join(timeout=150)
            assert not thread.is_alive()
            assert isinstance(second[0], int) and second[0] > VALUES * VALUE_BYTES, second
            wait_for(lambda: not _writers(node), 30, "every writer to end")
            wait_for(lambda: not _database_copies(node), 30, "the store to remove its copies")
            assert not [p for p in (node.data_dir / "snap").iterdir()], "a snapshot's directory left behind"
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            client.close()


@pytest.mark.parametrize("change", ["revoke ops's root role", "add another user"])
def test_a_snapshot_waiting_for_its_turn_is_refused_once_its_user_lost_root(tmp_path: Path, change: str) -> None:
    """A snapshot waits for the one in progress (a slow reader may hold it for hours). If its user
    loses the root role meanwhile, it must not then be sent the whole database, with everything
    written since: etcd's root-only rule holds when the data is read, not only when the call came.
    Another auth change meanwhile changes nothing for it."""
    with program_cluster(tmp_path, nodes=1) as cluster:
        (node,) = cluster.nodes
        admin = Client(cluster.endpoint)
        ops = Client(cluster.endpoint)
        try:
            admin.auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="ops", password="opspw"), timeout=10)
            setup_auth(admin)
            admin.auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="ops", role="root"), metadata=admin.md,
                                     timeout=10)
            ops.login("ops", "opspw")
            _fill(admin)
            stalled = admin.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), metadata=admin.md, timeout=120)
            assert next(stalled).remaining_bytes > 0  # one chunk read, then no more: it holds the turn
            waiting: list[int | BaseException] = []

            def read_whole() -> None:
                try:
                    stream = ops.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), metadata=ops.md, timeout=120)
                    waiting.append(sum(len(c.blob) for c in stream))
                except BaseException as exc:  # reported below
                    waiting.append(exc)

            thread = threading.Thread(target=read_whole)
            thread.start()
            try:
                wait_for(lambda: "a client's snapshot waits" in node.output() or waiting, 30,
                         "ops's snapshot to wait for its turn")
                assert not waiting, waiting
                if change == "add another user":
                    admin.auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="dev", password="devpw"), metadata=admin.md,
                                       timeout=10)
                else:
                    admin.auth.UserRevokeRole(rpc_pb2.AuthUserRevokeRoleRequest(name="ops", role="root"),
                                              metadata=admin.md, timeout=10)
            finally:
                stalled.cancel()
                thread.join(timeout=150)
            assert not thread.is_alive()
            if change == "add another user":
                assert isinstance(waiting[0], int) and waiting[0] > VALUES * VALUE_BYTES, waiting
                return
            assert isinstance(waiting[0], grpc.RpcError), f"ops, no longer root, was sent {waiting[0]} bytes"
            assert describe(waiting[0]) == "PERMISSION_DENIED: etcdserver: permission denied", describe(waiting[0])
        finally:
            admin.close()
            ops.close()


def _read_whole_in_background(client: Client) -> tuple[list[int | BaseException], threading.Thread]:
    """A snapshot read to its end on a thread of its own: (its size or what ended it, the thread)."""
    result: list[int | BaseException] = []

    def read_whole() -> None:
        try:
            stream = client.maintenance.Snapshot(rpc_pb2.SnapshotRequest(), timeout=120)
            result.append(sum(len(c.blob) for c in stream))
        except BaseException as exc:  # reported by the caller
            result.append(exc)

    thread = threading.Thread(target=read_whole)
    thread.start()
    return result, thread
