"""kill -9 of the leader, several times, and a graceful stop of the leader, under concurrent
writes and reads through the proxy.

Afterwards: every acknowledged write is present (on every node), the recorded history is
linearizable, and after each kill a new leader served writes. The time from each kill to the
first successful write sent after it is printed (issue 3 asks for 2 s with default timeouts; only
a generous sanity bound is asserted, timings are reported).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.support.cluster import (
    Recorder,
    Workload,
    distribution,
    local_cluster,
    verify_after_faults,
)
from tests.support.processes import etcdctl, wait_for

ROUNDS = 3
SANITY_BOUND = 15.0


@pytest.mark.slow
def test_kill_the_leader_repeatedly_under_load(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        rec = Recorder()
        failovers: list[float] = []
        elections: list[float] = []
        leaders: list[str] = []
        with Workload(cluster.endpoint, rec, clients=4, seed=1) as load:
            wait_for(lambda: rec.writes_ok_since(0) >= 20, 30, "the workload to get going")
            for _ in range(ROUNDS):
                since = time.monotonic()
                wait_for(lambda s=since: rec.writes_ok_since(s) >= 10, 30, "writes between kills")
                leader = cluster.leader()
                leaders.append(leader.name)
                killed_at = time.monotonic()
                cluster.kill(leader)
                new_leader = cluster.leader(among=[n for n in cluster.nodes if n is not leader], timeout=SANITY_BOUND)
                elections.append(time.monotonic() - killed_at)
                first = wait_for(lambda k=killed_at: rec.first_write_ok_after(k), SANITY_BOUND,
                                 "a write to succeed after the leader was killed")
                failovers.append(first - killed_at)  # type: ignore[operator]
                assert new_leader is not leader
                # Maintenance.Status through the proxy (etcdctl endpoint status) names the new leader
                wait_for(lambda n=new_leader: _status_leader(cluster.endpoint) == n.member_id, 10,
                         "endpoint status to show the new leader")
                cluster.restart(leader)
            since = time.monotonic()
            wait_for(lambda: rec.writes_ok_since(since) >= 10, 30, "writes after the last restart")
            load.stop()
        rec.history.close()
        print(f"\nkilled leaders: {leaders}")
        print(distribution("kill -9 of the leader -> survivors agree on a new leader", elections))
        print(distribution("kill -9 of the leader -> first acknowledged write sent after it", failovers))
        print(f"ops: {len(rec.records)}, acknowledged writes: {len(rec.acked_writes())}, errors: {rec.errors()}")
        verify_after_faults(cluster, rec)
        assert max(failovers) < SANITY_BOUND


@pytest.mark.slow
def test_stop_the_leader_gracefully_under_load(tmp_path: Path) -> None:
    """SIGTERM of the leader (a rolling restart): requests still arriving are sent to the new
    leader, requests under way finish; clients see at most etcd's own errors and lose nothing."""
    with local_cluster(tmp_path, nodes=3) as cluster:
        rec = Recorder()
        with Workload(cluster.endpoint, rec, clients=4, seed=2) as load:
            wait_for(lambda: rec.writes_ok_since(0) >= 20, 30, "the workload to get going")
            leader = cluster.leader()
            stopped_at = time.monotonic()
            cluster.terminate(leader)
            wait_for(lambda: rec.first_write_ok_after(stopped_at), SANITY_BOUND,
                     "a write to succeed after the leader stopped")
            cluster.restart(leader)
            since = time.monotonic()
            wait_for(lambda: rec.writes_ok_since(since) >= 10, 30, "writes after the restart")
            load.stop()
        rec.history.close()
        print(f"\nops: {len(rec.records)}, acknowledged writes: {len(rec.acked_writes())}, errors: {rec.errors()}")
        verify_after_faults(cluster, rec)


def _status_leader(endpoint: str) -> int | None:
    rc, out, _ = etcdctl(f"http://{endpoint}", "endpoint", "status", "-w", "json", timeout=10, dial_timeout="2s")
    if rc != 0:
        return None
    status = json.loads(out)[0]["Status"]
    return int(status.get("leader", 0)) if status.get("raftTerm") else None
