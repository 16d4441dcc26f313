"""Trust item 13: a node killed at each crash point under load loses nothing and rejoins.

Each crash point (authstore/failpoints.py, armed by RAFTGATE_FAILPOINTS as etcd's gofail) sits
between two steps whose order durability depends on: the WAL written but not fsync'd, fsync'd
but not yet acknowledged, a batch applied but its LMDB transaction not committed, a leader's
snapshot installed in the store but not yet in the log, the log compacted halfway. Under a load
of writes, reads and compare-and-swaps through the proxy, one node is restarted with a point
armed and dies there (SIGKILL, as kill -9); it is restarted without it. Afterwards every
acknowledged write is there on every node, the history is linearizable, and all nodes hold the
same key space (HashKV).

The log is compacted every 50 entries and keeps only 10, so a node restarted after its crash
has usually fallen behind what the leader's log holds and catches up by a snapshot the leader
streams while the writes go on (`Backend.copy_to`, a plain page copy since Trust item 16). The
snapshot-install test makes sure of it: the load runs on while the victim, 150 writes behind,
receives the snapshot, dies installing it, and catches up again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Cluster, Node, Program, Recorder, Workload, program_cluster, verify_after_faults
from tests.support.processes import wait_for

#: the log is compacted within seconds of load; a restarted node catches up by snapshot
FLAGS = ["--snapshot-count", "50", "--snapshot-catchup-entries", "10"]


class ArmedProgram(Program):
    """A store node started with fail points armed in its environment."""

    def __init__(self, workdir: Path, python: str, argv: list[str], failpoints: str, name: str) -> None:
        super().__init__(workdir, argv, "raftgate store:", name=name, python=python)
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


def crash(cluster: Cluster, victim: Node, point: str, arm: str) -> None:
    """Restarts the (stopped) victim with `point` armed and waits until it dies there."""
    program = start_armed(cluster, victim, f"{point}={arm}")
    wait_for(lambda: not victim.running, 90, f"{victim.name} to crash at {point}")
    assert f"fail point {point} hit: kill" in program.output(), program.output()[-3000:]


def load(cluster: Cluster, rec: Recorder) -> Workload:
    return Workload(cluster.endpoint, rec, clients=3, max_seconds=120)


def more_writes(rec: Recorder, n: int, what: str) -> None:
    since = time.monotonic()
    wait_for(lambda: rec.writes_ok_since(since) >= n, 90, what)


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
    with program_cluster(tmp_path, nodes=3, store_flags=FLAGS) as cluster:
        rec = Recorder()
        with load(cluster, rec) as running:
            more_writes(rec, 20, "writes under load")
            victim = cluster.followers(cluster.leader())[0]
            cluster.kill(victim)
            crash(cluster, victim, point, arm)
            cluster.restart(victim)
            more_writes(rec, 20, "writes after the restart")
            running.stop()
        verify_after_faults(cluster, rec)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["raftBeforeFsync", "raftAfterFsync", "applyBeforeCommit"])
def test_leader_crash_point_under_load(tmp_path: Path, point: str) -> None:
    """The same points on the leader, which sends before its own fsync. The victim is restarted
    armed while the load pauses (catching up takes few hits), made leader (MoveLeader), and dies
    at the point under the load that follows."""
    with program_cluster(tmp_path, nodes=3, store_flags=FLAGS) as cluster:
        rec = Recorder()
        with load(cluster, rec) as running:
            more_writes(rec, 20, "writes under load")
            running.stop()
        victim = cluster.leader()
        cluster.kill(victim)
        program = start_armed(cluster, victim, f"{point}=50*off->kill")
        cluster.wait_converged(timeout=60)
        current = cluster.leader()
        if current is not victim:
            cluster.do(current, ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root"),
                                                        move_leader=rpc_pb2.MoveLeaderRequest(targetID=victim.member_id)),
                       timeout=15)
        assert cluster.leader() is victim
        with load(cluster, rec) as running:
            wait_for(lambda: not victim.running, 90, f"{victim.name} to crash at {point}")
            assert f"fail point {point} hit: kill" in program.output(), program.output()[-3000:]
            cluster.restart(victim)
            more_writes(rec, 20, "writes after the restart")
            running.stop()
        verify_after_faults(cluster, rec)


@pytest.mark.slow
def test_crash_mid_snapshot_install(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3, store_flags=FLAGS) as cluster:
        rec = Recorder()
        with load(cluster, rec) as running:
            more_writes(rec, 20, "writes under load")
            victim = cluster.followers(cluster.leader())[0]
            cluster.kill(victim)
            # far enough behind that the leader's log no longer holds what it misses
            more_writes(rec, 150, "writes while the victim is down")
            # the leader streams its store while the writes go on
            crash(cluster, victim, "raftMidSnapshotInstall", "kill")
            cluster.restart(victim)
            more_writes(rec, 20, "writes after the restart")
            running.stop()
        verify_after_faults(cluster, rec)


@pytest.mark.slow
def test_a_failure_inside_apply_stops_the_node(tmp_path: Path) -> None:
    """Fail-stop (Trust item 10): an exception inside apply ends the process with a CRITICAL line
    and exit code 70; nothing of its batch was committed, and once restarted the node applies the
    batch again and agrees with the others."""
    with program_cluster(tmp_path, nodes=3, store_flags=FLAGS) as cluster:
        rec = Recorder()
        with load(cluster, rec) as running:
            more_writes(rec, 20, "writes under load")
            victim = cluster.followers(cluster.leader())[0]
            cluster.kill(victim)
            program = start_armed(cluster, victim, "applyBeforeCommit=20*off->panic")
            wait_for(lambda: not victim.running, 90, f"{victim.name} to stop")
            code = program.proc.returncode if program.proc is not None else program.last_exit_code
            assert code == 70, program.output()[-3000:]
            assert "CRITICAL" in program.output() and "the node stops" in program.output()
            cluster.restart(victim)
            more_writes(rec, 20, "writes after the restart")
            running.stop()
        verify_after_faults(cluster, rec)
