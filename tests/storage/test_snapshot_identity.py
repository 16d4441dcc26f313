"""A snapshot from the leader must not give the follower the leader's identity.

A store node keeps its member ID in its LMDB store, and a snapshot is a copy of the leader's
store. Found by the crash test at `raftMidSnapshotInstall`: a follower restarted after installing
a snapshot came up as the leader's member (two nodes with one ID, the cluster stuck).
"""

from __future__ import annotations

from pathlib import Path

from authstore.main import _store_member_id, _stored_member_id
from authstore.node.snapshots import IncomingSnapshots
from authstore.state.apply import Applier
from authstore.state.backend import Backend


def test_installing_a_snapshot_keeps_the_followers_member_id(tmp_path: Path) -> None:
    leader_backend = Backend(tmp_path / "leader", map_size=64 << 20)
    follower_backend = Backend(tmp_path / "follower", map_size=64 << 20)
    try:
        _store_member_id(leader_backend, 0xAAAA)
        _store_member_id(follower_backend, 0xBBBB)
        follower = Applier(follower_backend, member_id=0xBBBB)
        follower.restore(leader_backend.copy_to(tmp_path / "snapshot"))
        # what a restart reads, whenever it happens after the store was swapped
        assert _stored_member_id(follower_backend) == 0xBBBB
    finally:
        leader_backend.close()
        follower_backend.close()


def test_the_same_snapshot_arriving_again_leaves_the_copy_being_installed_alone(tmp_path: Path) -> None:
    """Found by the crash test at `raftBeforeFsync` under load: a leader whose newest snapshot is
    still the one it just sent sends it again when a late rejected append puts the follower back
    to probing. The second copy was kept under the same name as the first, while the apply
    thread was installing the first: renamed over it between writing the follower's member ID
    into it and swapping it in, it put the leader's own copy (and ID) in place."""
    leader_backend = Backend(tmp_path / "leader", map_size=64 << 20)
    try:
        _store_member_id(leader_backend, 0xAAAA)
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
