"""A follower that misses more than the leader keeps in its log catches up by snapshot.

The stores run with `--snapshot-count 50 --snapshot-catchup-entries 10` (which `raftgate local`
cannot pass on, so this module starts the store and proxy programs itself). One follower is
killed -9 and, in one test, loses its whole data directory; while it is down the leader writes
and compacts its log well past what the follower holds. Restarted with the same argv, the
follower must install a snapshot from the leader, end up with the same key space as the others
(HashKV and a serializable range on its own internal port), and then serve as a full voter: with
the other follower killed, writes still commit (they need its vote and its log).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, program_cluster, retry_ok
from tests.support.processes import wait_for

SNAPSHOT_FLAGS = ["--snapshot-count", "50", "--snapshot-catchup-entries", "10"]
PREFIX = b"/snap/"


def _catch_up_by_snapshot(workdir: Path, *, wipe: bool, hot_revisions: int = 0) -> None:
    """hot_revisions: puts to one key while the follower is down (many duplicates of one index key,
    the shape LMDB 0.9.36's compacting copy crashed on, on the leader that builds the snapshot)."""
    with program_cluster(workdir, nodes=3, store_flags=SNAPSHOT_FLAGS) as cluster:
        client = Client(cluster.endpoint)
        try:
            for i in range(20):
                retry_ok(lambda i=i: client.put(PREFIX + b"before/%03d" % i, b"x" * 100), 20, "early writes")
            leader = cluster.leader()
            victim, other = cluster.followers(leader)
            cluster.kill(victim)
            if wipe:
                shutil.rmtree(victim.data_dir)
            # far more than snapshot-count + catch-up entries: the leader compacts past what victim has
            # (a write that fails, e.g. on a leader change under load, is sent again: same final state)
            for i in range(200):
                retry_ok(lambda i=i: client.put(PREFIX + b"while-down/%03d" % i, b"y" * 100), 20, "writes")
            for i in range(hot_revisions):
                retry_ok(lambda i=i: client.put(PREFIX + b"hot", b"%d" % i), 20, "writes to one key")
            retry_ok(lambda: client.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=PREFIX + b"while-down/000"),
                                                   timeout=10), 20, "a delete")
            wait_for(lambda: "log compacted" in leader.output(), 10, "the leader to compact its log")
            cluster.restart(victim)
            for i in range(10):  # writes keep coming while it catches up
                retry_ok(lambda i=i: client.put(PREFIX + b"restarted/%03d" % i, b"w"), 20, "writes")
            cluster.wait_converged(timeout=15)
            wait_for(lambda: "installed a snapshot" in victim.output(), 10, "the follower to report the snapshot")
            expected = client.scan(PREFIX)
            assert len(expected) == 20 + 199 + 10 + (1 if hot_revisions else 0)
            if hot_revisions:
                assert expected[PREFIX + b"hot"] == b"%d" % (hot_revisions - 1)
            assert cluster.local_keys(victim, PREFIX) == expected
            # a full voter: with the other follower down, writes need victim's vote and log
            cluster.kill(other)
            for i in range(5):
                retry_ok(lambda i=i: client.put(PREFIX + b"after/%d" % i, b"z"), 20, "writes with victim in the quorum")
            cluster.sync(victim)  # acknowledged means committed, not yet applied on every voter
            assert cluster.local_keys(victim, PREFIX + b"after/") == {PREFIX + b"after/%d" % i: b"z" for i in range(5)}
            cluster.restart(other)
            cluster.wait_converged(timeout=15)
        finally:
            client.close()


@pytest.mark.slow
def test_lagging_follower_catches_up_by_snapshot(tmp_path: Path) -> None:
    _catch_up_by_snapshot(tmp_path, wipe=False)


@pytest.mark.slow
def test_wiped_follower_catches_up_by_snapshot(tmp_path: Path) -> None:
    _catch_up_by_snapshot(tmp_path, wipe=True)


@pytest.mark.slow
def test_follower_catches_up_by_snapshot_with_a_key_of_many_revisions(tmp_path: Path) -> None:
    _catch_up_by_snapshot(tmp_path, wipe=True, hot_revisions=300)
