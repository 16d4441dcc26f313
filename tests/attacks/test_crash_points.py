"""Trust item 13: a node killed at each crash point under load loses nothing and rejoins.

Each crash point (authstore/failpoints.py, armed by RAFTGATE_FAILPOINTS as etcd's gofail) sits
between two steps whose order durability depends on: the WAL written but not fsync'd, fsync'd
but not yet acknowledged, a batch applied but its LMDB transaction not committed, a leader's
snapshot installed in the store but not yet in the log, the log compacted halfway. Under a load
of writes, reads and compare-and-swaps through the proxy, one node is restarted with a point
armed and dies there (SIGKILL, as kill -9); it is restarted without it. Afterwards every
acknowledged write is there on every node, the history is linearizable, and all nodes hold the
same key space (HashKV).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from faults.cluster import Cluster, Node, Program, Recorder, Workload, program_cluster, verify_after_faults
from harness import wait_for

#: small snapshots, so compaction and snapshot install happen within seconds of load
FLAGS = ["--snapshot-count", "50", "--snapshot-catchup-entries", "10"]


class ArmedProgram(Program):
    """A store node started with fail points armed in its environment."""

    def __init__(self, workdir: Path, python: str, argv: list[str], failpoints: str, name: str) -> None:
        super().__init__(workdir, python, argv, "raftgate store:", name)
        self.failpoints = failpoints

    def command(self) -> list[str]:
        return ["env", f"RAFTGATE_FAILPOINTS={self.failpoints}", *super().command()]


def start_armed(cluster: Cluster, node: Node, failpoints: str) -> ArmedProgram:
    """Starts `node` with `failpoints`; it may die at one before it reports ready."""
    assert not node.running
    node.restarts += 1
    program = ArmedProgram(cluster.workdir / f"{node.name}.{node.restarts}", cluster.python, node.argv,
                           failpoints, node.name)
    node.program = program
    try:
        program.start(timeout=60)
    except RuntimeError:
        assert program.proc is None  # it died before it was ready: at the fail point, checked below
    return program


def acked_writes(rec: Recorder) -> int:
    return len(rec.acked_writes())


def crash_at(tmp_path: Path, point: str, arm: str, *, lag_first: bool) -> None:
    with program_cluster(tmp_path, nodes=3, store_flags=FLAGS) as cluster:
        rec = Recorder()
        with Workload(cluster.endpoint, rec, clients=3, max_seconds=120) as load:
            wait_for(lambda: acked_writes(rec) >= 20, 60, "writes under load")
            victim = cluster.followers(cluster.leader())[0]
            cluster.kill(victim)
            if lag_first:
                # far enough behind that the leader's log no longer holds what it misses
                target = acked_writes(rec) + 150
                wait_for(lambda: acked_writes(rec) >= target, 90, "writes while the victim is down")
            program = start_armed(cluster, victim, f"{point}={arm}")
            wait_for(lambda: not victim.running, 90, f"{victim.name} to crash at {point}")
            assert f"fail point {point} hit: kill" in program.output(), program.output()[-3000:]
            crashed_at = time.monotonic()
            cluster.restart(victim)
            wait_for(lambda: rec.writes_ok_since(crashed_at) >= 20, 60, "writes after the restart")
            load.stop()
        verify_after_faults(cluster, rec)


@pytest.mark.slow
@pytest.mark.parametrize(("point", "arm"), [
    # a few hits go by first, so the node is up and taking part when it dies
    ("raftBeforeFsync", "20*off->kill"),
    ("raftAfterFsync", "20*off->kill"),
    ("applyBeforeCommit", "20*off->kill"),
    # the first compaction after the restart (every 50 applied entries)
    ("walMidCheckpoint", "kill"),
])
def test_crash_point_under_load(tmp_path: Path, point: str, arm: str) -> None:
    crash_at(tmp_path, point, arm, lag_first=False)


@pytest.mark.slow
def test_crash_mid_snapshot_install(tmp_path: Path) -> None:
    crash_at(tmp_path, "raftMidSnapshotInstall", "kill", lag_first=True)
