"""A node's member ID must never come from what a leader sends it.

A follower's store is swapped whole for a copy of the leader's, which carries the leader's node-local
records. Found by the crash test at `raftMidSnapshotInstall`, and again at `raftBeforeFsync` under
load: a follower restarted after installing snapshots came up as the leader's member (two nodes with
one ID, the cluster without a leader). A node's ID now lives in a file of its data dir that no
snapshot carries, as etcd keeps it in its WAL's metadata, never in the backend a snapshot replaces.
"""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path

import pytest

from authstore import config as store_config
from authstore.main import StartupError, recover
from authstore.node.snapshots import IncomingSnapshots
from authstore.node.transport import PeerSecurity
from authstore.state.apply import Applier
from authstore.state.backend import LEGACY_MEMBER_ID_KEY, Backend
from tests.support.processes import SECRET


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
