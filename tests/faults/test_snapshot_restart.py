"""A follower that installed a snapshot must restart as itself.

The copy a leader sends is its whole LMDB store, node-local records included. A follower that
installs it and is later restarted (kill -9, an upgrade, a rescheduled pod) must come back with
its own member ID, not the leader's: two nodes answering to one ID is two voters counted as one
(or a follower taking itself for the leader), and the cluster no longer converges.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Client, program_cluster, retry_ok
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow

SNAPSHOT_FLAGS = ["--snapshot-count", "50", "--snapshot-catchup-entries", "10"]
PREFIX = b"/restart/"


def test_a_follower_restarted_after_a_snapshot_keeps_its_member_id(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3, store_flags=SNAPSHOT_FLAGS) as cluster:
        client = Client(cluster.endpoint)
        try:
            for i in range(20):
                retry_ok(lambda i=i: client.put(PREFIX + b"before/%03d" % i, b"x"), 20, "early writes")
            leader = cluster.leader()
            victim, other = cluster.followers(leader)
            ids = {}
            for node in cluster.nodes:
                info = cluster.leader_info(node)
                assert info is not None
                ids[node.name] = info.member_id
            cluster.kill(victim)
            for i in range(200):
                retry_ok(lambda i=i: client.put(PREFIX + b"while-down/%03d" % i, b"y"), 20, "writes")
            wait_for(lambda: "log compacted" in leader.output(), 10, "the leader to compact its log")
            cluster.restart(victim)
            wait_for(lambda: "installed a snapshot" in victim.output(), 30, "the follower to install a snapshot")
            cluster.wait_converged(timeout=30)
            # the crash: a follower restarted from a store that came from the leader
            cluster.kill(victim)
            cluster.restart(victim)
            info = wait_for(lambda: cluster.leader_info(victim), 10, "the restarted follower to answer")
            assert info.member_id == ids[victim.name], (  # type: ignore[attr-defined]
                f"{victim.name} restarted as {info.member_id:x}, "  # type: ignore[attr-defined]
                f"the leader's ID is {ids[leader.name]:x}, its own {ids[victim.name]:x}")
            cluster.wait_converged(timeout=30)
            # and it is a full voter: with the other follower down, writes need its vote and log
            cluster.kill(other)
            for i in range(5):
                retry_ok(lambda i=i: client.put(PREFIX + b"after/%d" % i, b"z"), 20, "writes with victim in the quorum")
            cluster.restart(other)
            cluster.wait_converged(timeout=30)
        finally:
            client.close()
