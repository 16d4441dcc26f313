"""A node's member ID must never come from what a leader sends it.

A follower's store is swapped whole for a copy of the leader's, which carries the leader's node-local
records. Found by the crash test at `raftMidSnapshotInstall`, and again at `raftBeforeFsync` under
load: a follower restarted after installing snapshots came up as the leader's member (two nodes with
one ID, the cluster without a leader). A node's ID now lives in a file of its data dir that no
snapshot carries, as etcd keeps it in its WAL's metadata, never in the backend a snapshot replaces.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from authstore import config as store_config
from authstore import snapshot_tool
from authstore.main import StartupError, recover
from authstore.node.snapshots import IncomingSnapshots
from authstore.node.transport import PeerSecurity
from authstore.state.apply import Applier
from authstore.state.backend import LEGACY_MEMBER_ID_KEY, Backend
from authstore.state.mvcc.kvstore import KVStore
from tests.support.processes import SECRET
from tests.support.snapshots import FLAGS, PEER, make_snapshot


def _config(tmp_path: Path, name: str, port: int) -> store_config.StoreConfig:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    url = f"http://127.0.0.1:{port}"
    return store_config.parse(["--name", name, "--data-dir", str(tmp_path / name), "--internal-secret-file",
                               str(secret), "--peer-secret-file", str(secret), "--initial-advertise-peer-urls", url,
                               "--initial-cluster", f"{name}={url}"], environ={})


def _recovered_id(cfg: store_config.StoreConfig) -> int:
    """The member ID a (re)start of the node on ``cfg``'s data dir comes up as."""
    backend = Backend(cfg.data_dir / "store", map_size=64 << 20)
    try:
        rec = asyncio.run(recover(cfg, backend, PeerSecurity(secret=cfg.peer_secret)))
        rec.wal.close()
        return rec.member_id
    finally:
        backend.close()


def test_a_restart_after_the_store_was_swapped_for_the_leaders_keeps_this_nodes_id(tmp_path: Path) -> None:
    """Whatever put the leader's copy in place (an install, a crash in the middle of one, a copy
    that arrived twice), the restart comes up as this node."""
    leader, follower = _config(tmp_path, "leader", 1001), _config(tmp_path, "follower", 1002)
    leader_id, follower_id = _recovered_id(leader), _recovered_id(follower)
    assert leader_id != follower_id
    leader_backend = Backend(leader.data_dir / "store", map_size=64 << 20)
    try:
        copy = leader_backend.copy_to(tmp_path / "copy")
    finally:
        leader_backend.close()
    shutil.copyfile(copy, follower.data_dir / "store" / "data.mdb")  # the leader's store, as it was sent
    assert _recovered_id(follower) == follower_id


def test_installing_a_snapshot_keeps_the_followers_member_id(tmp_path: Path) -> None:
    leader, follower = _config(tmp_path, "leader", 1001), _config(tmp_path, "follower", 1002)
    follower_id = _recovered_id(follower)
    _recovered_id(leader)
    leader_backend = Backend(leader.data_dir / "store", map_size=64 << 20)
    follower_backend = Backend(follower.data_dir / "store", map_size=64 << 20)
    try:
        Applier(follower_backend, member_id=follower_id).restore(leader_backend.copy_to(tmp_path / "snapshot"))
    finally:
        leader_backend.close()
        follower_backend.close()
    assert _recovered_id(follower) == follower_id  # what a restart reads, whenever it happens after the swap


def test_a_data_dir_of_an_older_version_keeps_the_id_its_store_held(tmp_path: Path) -> None:
    """Data dirs written before the ID file kept the ID in the store: taken over once, then the
    store's record is gone (a copy sent from this node later must not carry it)."""
    cfg = _config(tmp_path, "old", 1003)
    mid = _recovered_id(cfg)
    (cfg.data_dir / "member_id").unlink()
    backend = Backend(cfg.data_dir / "store", map_size=64 << 20)
    try:
        with backend.env.begin(write=True) as txn:
            backend.meta_put(txn, LEGACY_MEMBER_ID_KEY, struct.pack(">Q", mid))
    finally:
        backend.close()
    assert _recovered_id(cfg) == mid
    assert (cfg.data_dir / "member_id").exists()
    backend = Backend(cfg.data_dir / "store", map_size=64 << 20)
    try:
        with backend.env.begin() as txn:
            assert backend.meta_get(txn, LEGACY_MEMBER_ID_KEY) is None
    finally:
        backend.close()


def test_a_data_dir_with_a_log_but_no_member_id_is_refused(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "lost", 1004)
    _recovered_id(cfg)
    (cfg.data_dir / "member_id").unlink()
    with pytest.raises(StartupError, match="member ID"):
        _recovered_id(cfg)


def test_the_same_snapshot_arriving_again_leaves_the_copy_being_installed_alone(tmp_path: Path) -> None:
    """A leader that sends its newest snapshot again (its first send failed on its side, or the
    follower fell back to probing) must not replace, by name, the copy the apply thread is
    installing: renamed over it, the leader's own copy would be swapped in unseen."""
    leader_backend = Backend(tmp_path / "leader", map_size=64 << 20)
    try:
        incoming = IncomingSnapshots(tmp_path / "snap")
        incoming.keep(352, leader_backend.copy_to(tmp_path / "first"))
        taken = incoming.take(352)
        content = taken.read_bytes()
        with leader_backend.env.begin(write=True) as txn:  # the leader moves on: its next copy differs
            txn.put(b"later", b"write")
        incoming.keep(352, leader_backend.copy_to(tmp_path / "second"))
        assert taken.read_bytes() == content
    finally:
        leader_backend.close()


def _restored_revision(data_dir: Path) -> int:
    """The revision the store in ``data_dir`` holds (0: an empty store, nothing restored)."""
    backend = Backend(data_dir / "store", map_size=64 << 20)
    try:
        with backend.env.begin(write=True) as txn:  # (an empty store has no sub-databases yet)
            return KVStore(backend.env, txn).current_revision(txn)
    finally:
        backend.close()


_KILL_AT_RENAME = """
import os, signal, sys
from authstore import snapshot_tool
real, seen = os.rename, []
def rename(src, dst):
    seen.append(src)
    if len(seen) == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9: nothing cleaned up
    real(src, dst)
snapshot_tool.os.rename = rename
sys.exit(snapshot_tool.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("killed_at", [2, 3])
def test_a_restore_killed_while_moving_its_parts_in_never_leaves_an_empty_member(tmp_path: Path,
                                                                                    killed_at: int) -> None:
    """A restore into an existing (empty) data dir moves its parts in one by one: killed between
    two moves, the data dir must either be refused at start or start holding the restored state,
    never start as a member of a new cluster with an empty store (it would apply the same first
    entries as its restored peers and hold none of their keys)."""
    snap = make_snapshot(tmp_path, keys=10)
    target = tmp_path / "target"
    target.mkdir()
    proc = subprocess.run([sys.executable, "-c", _KILL_AT_RENAME, str(killed_at), "restore", str(snap),
                           "--data-dir", str(target), *FLAGS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-500:]
    cfg = store_config.parse(["--name", "solo", "--data-dir", str(target), "--internal-secret-file",
                              str(_secret(tmp_path)), "--peer-secret-file", str(_secret(tmp_path)),
                              "--initial-advertise-peer-urls", PEER, "--initial-cluster", f"solo={PEER}"],
                             environ={})
    try:
        _recovered_id(cfg)
    except StartupError:
        return  # refused: the operator restores again into an emptied dir
    assert _restored_revision(target) > 1


def test_a_restore_that_fails_while_moving_its_parts_in_leaves_the_data_dir_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error on the last move (the system refused it) removes what was moved already: the data
    dir is as empty as before, and the next restore into it works."""
    snap = make_snapshot(tmp_path, keys=10)
    target = tmp_path / "target"
    target.mkdir()
    real, seen = os.rename, []

    def rename(src: str | Path, dst: str | Path) -> None:
        seen.append(src)
        if len(seen) == 3:
            raise OSError(errno.EIO, "Input/output error", str(src))
        real(src, dst)

    monkeypatch.setattr(snapshot_tool.os, "rename", rename)
    assert snapshot_tool.main(["restore", str(snap), "--data-dir", str(target), *FLAGS]) == 1
    monkeypatch.setattr(snapshot_tool.os, "rename", real)
    assert list(target.iterdir()) == []
    assert snapshot_tool.main(["restore", str(snap), "--data-dir", str(target), *FLAGS]) == 0


def test_a_member_id_that_is_no_regular_file_is_refused_at_start(tmp_path: Path) -> None:
    """A member_id that is a FIFO (or a link to a device) is refused with the reason, never read
    until something writes to it (the start would hang, or read a device's endless bytes)."""
    cfg = _config(tmp_path, "odd", 1005)
    _recovered_id(cfg)
    path = cfg.data_dir / "member_id"
    path.unlink()
    os.mkfifo(path, 0o600)
    result: list[BaseException | int] = []
    thread = threading.Thread(target=lambda: result.append(_outcome(cfg)), daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():  # blocked in open(): let it go, and fail
        with open(path, "wb"):
            pass
        thread.join(60)
        pytest.fail("the start blocked on a member_id that is a FIFO")
    assert isinstance(result[0], StartupError) and "member_id" in str(result[0]), result


def test_a_member_id_file_larger_than_an_id_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "big", 1006)
    mid = _recovered_id(cfg)
    (cfg.data_dir / "member_id").write_text(f"{mid:016x}" + " " * (1 << 20) + "\n")
    with pytest.raises(StartupError, match="member ID"):
        _recovered_id(cfg)


def _outcome(cfg: store_config.StoreConfig) -> BaseException | int:
    try:
        return _recovered_id(cfg)
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return exc


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    return secret


def test_a_copy_from_an_older_versions_leader_never_gives_this_node_the_leaders_id(tmp_path: Path) -> None:
    """In a rolling upgrade a leader still on the older version sends a copy of its store that
    holds its own ID under the old record. Installed here, the record must not stay: a restart that
    finds no member_id beside this node's log must be refused, never come up as the leader's
    member (which the old record would make it, taken over as an older data dir's own ID)."""
    leader, follower = _config(tmp_path, "leader", 1007), _config(tmp_path, "follower", 1008)
    leader_id, follower_id = _recovered_id(leader), _recovered_id(follower)
    leader_backend = Backend(leader.data_dir / "store", map_size=64 << 20)
    follower_backend = Backend(follower.data_dir / "store", map_size=64 << 20)
    try:
        with leader_backend.env.begin(write=True) as txn:  # what the older version kept in its store
            leader_backend.meta_put(txn, LEGACY_MEMBER_ID_KEY, struct.pack(">Q", leader_id))
        Applier(follower_backend, member_id=follower_id).restore(leader_backend.copy_to(tmp_path / "snapshot"))
    finally:
        leader_backend.close()
        follower_backend.close()
    assert _recovered_id(follower) == follower_id
    (follower.data_dir / "member_id").unlink()
    with pytest.raises(StartupError, match="member ID"):
        _recovered_id(follower)


def test_a_new_member_killed_between_its_id_and_its_log_starts_as_the_same_member(tmp_path: Path) -> None:
    """The ID is written before the log: a kill -9 between the two leaves the ID alone (and
    perhaps its staged copy), and the next starts are this member, with its first entries."""
    cfg = _config(tmp_path, "fresh", 1009)
    mid = _recovered_id(cfg)
    shutil.rmtree(cfg.data_dir / "wal")
    (cfg.data_dir / "member_id.tmp").write_bytes(b"00")  # a staged copy cut short by the kill
    assert _recovered_id(cfg) == mid
    assert not (cfg.data_dir / "member_id.tmp").exists()
    assert _recovered_id(cfg) == mid
