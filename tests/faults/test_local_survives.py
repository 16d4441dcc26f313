"""Issue 3's "done when": `raftgate local --nodes 3` survives killing any one store process.

Each of the three store nodes in turn (whether it leads or follows at that moment) is killed -9
under concurrent writes and reads, the cluster keeps serving, and the node is restarted from its
argv. Afterwards no acknowledged write is lost on any node and the history is linearizable.
"""

from __future__ import annotations

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
from tests.support.processes import wait_for


@pytest.mark.slow
def test_local_survives_killing_each_store_node(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        rec = Recorder()
        gaps: list[float] = []
        roles: list[str] = []
        with Workload(cluster.endpoint, rec, clients=3, seed=3) as load:
            wait_for(lambda: rec.writes_ok_since(0) >= 20, 30, "the workload to get going")
            for node in list(cluster.nodes):
                leader = cluster.leader()
                roles.append(f"{node.name} ({'leader' if node is leader else 'follower'})")
                killed_at = time.monotonic()
                cluster.kill(node)
                first = wait_for(lambda k=killed_at: rec.first_write_ok_after(k), 15, f"writes without {node.name}")
                gaps.append(first - killed_at)  # type: ignore[operator]
                since = time.monotonic()
                wait_for(lambda s=since: rec.writes_ok_since(s) >= 10, 30, f"more writes without {node.name}")
                cluster.restart(node)
            since = time.monotonic()
            wait_for(lambda: rec.writes_ok_since(since) >= 10, 30, "writes after the last restart")
            load.stop()
        rec.history.close()
        print(f"\nkilled in turn: {roles}")
        print(distribution("kill -9 -> first acknowledged write sent after it", gaps))
        print(f"ops: {len(rec.records)}, acknowledged writes: {len(rec.acked_writes())}, errors: {rec.errors()}")
        verify_after_faults(cluster, rec)
