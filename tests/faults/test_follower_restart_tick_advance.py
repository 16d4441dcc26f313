"""A follower restarted into a 3-node cluster with a live leader under writes fast-forwards all but
two ticks of its first election (etcd's initial election tick advance), and must still not disrupt
the cluster: the leader's heartbeat reaches it first, and pre-vote with check-quorum turns away a
campaign. Across restarts by SIGTERM and by kill -9 the leader and its term stay the same."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, Node, Recorder, Workload, program_cluster
from tests.support.processes import wait_for

ROUNDS = 4
#: the soak variant (`make test-soak`): RAFTGATE_RESTART_ROUNDS restarts (default 30)
SOAK_ROUNDS = int(os.environ.get("RAFTGATE_RESTART_ROUNDS", "30"))


def _term(cluster: Cluster, node: Node) -> int:
    info = wait_for(lambda: cluster.leader_info(node), 10, f"{node.name} to answer")
    return info.raft_term  # type: ignore[union-attr]


@pytest.mark.parametrize("rounds", [ROUNDS, pytest.param(SOAK_ROUNDS, marks=pytest.mark.soak, id="soak")])
def test_a_restarted_follower_does_not_disrupt_a_live_leader(tmp_path: Path, rounds: int) -> None:
    with program_cluster(tmp_path, nodes=3) as cluster:
        rec = Recorder()
        with Workload(cluster.endpoint, rec, clients=4, seed=7, max_seconds=120 + 10 * rounds,
                      unique_only=True) as load:
            since = time.monotonic()
            wait_for(lambda: rec.writes_ok_since(since) >= 20, 60, "the workload to get going")
            leader = cluster.leader()
            term = _term(cluster, leader)
            for rnd in range(rounds):
                follower = cluster.followers(leader)[rnd % 2]
                (cluster.terminate if rnd % 2 == 0 else cluster.kill)(follower)
                cluster.restart(follower)
                wait_for(lambda f=follower: "fast-forwarding election ticks" in f.program.output(),  # type: ignore[misc]
                         10, f"round {rnd}: {follower.name} to advance its election ticks")
                since = time.monotonic()
                wait_for(lambda s=since: rec.writes_ok_since(s) >= 10, 60, f"round {rnd}: writes after the restart")
                wait_for(lambda f=follower: (info := cluster.leader_info(f)) is not None and info.leader_id != 0, 10,
                         f"round {rnd}: {follower.name} to know the leader")
                assert cluster.leader() is leader, f"round {rnd}: the leader changed"
                assert _term(cluster, leader) == term, f"round {rnd}: the term rose"
            load.stop()
