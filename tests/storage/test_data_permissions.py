"""No other local user reads the data (issue 21, item 5).

The store's data dir holds every key, value and bcrypt hash (the LMDB store, the log segments,
snapshot copies); `raftgate local`'s data dir also holds the internal secret. As etcd does, every
directory the store, `raftgate local` and `raftgate snapshot restore` create is 0700 and every
file 0600, whatever the umask of the process (here the common 022). A data dir that already
exists with a wider mode is left as it is and named in one WARNING line at start (etcd's
CheckDirPermission warning).
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Client, program_cluster, retry_ok
from tests.support.processes import RaftgateLocal, etcdctl, free_port, store_program, wait_for

pytestmark = pytest.mark.slow

SNAPSHOT_FLAGS = ["--snapshot-count", "50", "--snapshot-catchup-entries", "10"]


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The test process's umask (inherited by the programs it starts) while the block runs."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def loose(root: Path) -> list[str]:
    """Every path under `root` (itself included) that another user could read or enter."""
    out = []
    for path in [root, *sorted(root.rglob("*"))]:
        mode = path.lstat().st_mode
        want = 0o700 if stat.S_ISDIR(mode) else 0o600
        if stat.S_IMODE(mode) != want:
            out.append(f"{path.relative_to(root.parent)} {stat.filemode(mode)}")
    return out


def raftgate(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "raftgate.cli", *args], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def permission_warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if "WARNING" in line and "permission" in line]


def test_store_files_snapshot_install_and_restore_are_private(tmp_path: Path) -> None:
    """Three stores (one catches up by snapshot: a received copy replaces its store), a client
    snapshot, then `raftgate snapshot restore` of it: all under umask 022."""
    saved = tmp_path / "saved.db"
    with umask(0o022), program_cluster(tmp_path / "cluster", nodes=3, store_flags=SNAPSHOT_FLAGS) as cluster:
        client = Client(cluster.endpoint)
        try:
            retry_ok(lambda: client.put(b"/secret", b"value"), 30, "a first write")
            leader = cluster.leader()
            victim = cluster.followers(leader)[0]
            cluster.kill(victim)
            for i in range(120):
                retry_ok(lambda i=i: client.put(b"/k/%03d" % i, b"v" * 100), 20, "writes")
            wait_for(lambda: "log compacted" in leader.output(), 30, "the leader to compact its log")
            cluster.restart(victim)
            wait_for(lambda: "installed a snapshot" in victim.output(), 30, "the follower to install a snapshot")
            rc, _, err = etcdctl(f"http://{cluster.endpoint}", "snapshot", "save", str(saved), timeout=60)
            assert rc == 0, err
            for node in cluster.nodes:
                assert loose(node.data_dir) == [], node.name
        finally:
            client.close()
    restored = tmp_path / "restored"
    peer = f"http://127.0.0.1:{free_port()}"
    with umask(0o022):
        rc, _, err = raftgate("snapshot", "restore", str(saved), "--data-dir", str(restored), "--name", "solo",
                              "--initial-cluster", f"solo={peer}", "--initial-advertise-peer-urls", peer)
    assert rc == 0, err
    assert loose(restored) == []


@pytest.mark.parametrize("mask", [0o022, 0o000])
def test_local_data_dir_is_private(tmp_path: Path, mask: int) -> None:
    local = RaftgateLocal(tmp_path)
    try:
        with umask(mask):
            local.start()
        rc, _, err = local.ctl("put", "k", "v")
        assert rc == 0, err
        assert local.local_json() is not None
        assert loose(local.data_dir) == []
        assert permission_warnings(local.output()) == []
    finally:
        local.stop()


def test_a_wider_store_data_dir_is_named_in_one_warning_and_left_alone(tmp_path: Path) -> None:
    store, _ = store_program(tmp_path)
    data_dir = tmp_path / "store-data"
    data_dir.mkdir(mode=0o755)
    os.chmod(data_dir, 0o755)
    try:
        with umask(0o022):
            store.start()
        warnings = permission_warnings(store.output())
        assert len(warnings) == 1, store.output()
        assert str(data_dir) in warnings[0] and "drwxr-xr-x" in warnings[0], warnings
        assert "Traceback" not in store.output()
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o755  # the operator's to change, as with etcd
        assert loose(data_dir) == [f"store-data {stat.filemode(data_dir.stat().st_mode)}"]  # all it holds is private
    finally:
        store.stop()


def test_a_wider_local_data_dir_is_named_in_one_warning(tmp_path: Path) -> None:
    local = RaftgateLocal(tmp_path)
    local.data_dir.mkdir(mode=0o755)
    os.chmod(local.data_dir, 0o755)
    try:
        with umask(0o022):
            local.start()
        warnings = permission_warnings(local.output())
        assert len(warnings) == 1, local.output()
        assert str(local.data_dir) in warnings[0], warnings
        assert "Traceback" not in local.output()
        assert stat.S_IMODE(local.data_dir.stat().st_mode) == 0o755
    finally:
        local.stop()
