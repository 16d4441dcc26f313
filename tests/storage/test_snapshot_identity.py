"""A snapshot from the leader must not give the follower the leader's identity.

A store node keeps its member ID in its LMDB store, and a snapshot is a copy of the leader's
store. Found by the crash test at `raftMidSnapshotInstall`: a follower restarted after installing
a snapshot came up as the leader's member (two nodes with one ID, the cluster stuck).
"""

from __future__ import annotations

from pathlib import Path

from authstore.main import _store_member_id, _stored_member_id
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
