"""A 5-node `raftgate local`: with 2 nodes killed it still serves; with a 3rd killed (no quorum)
no write succeeds (they should fail with etcd's errors: any other error text is reported as a
warning); once the nodes come back, no acknowledged write is lost, none sent without a quorum
was applied, the history is linearizable and all five nodes hold the same key space."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import (
    ETCD_FAILOVER_ERRORS,
    Client,
    Recorder,
    Workload,
    append_final_reads,
    assert_only_etcd_errors,
    check_acked_present,
    describe,
    local_cluster,
    retry_ok,
)
from tests.support.linearizability import check
from tests.support.processes import wait_for

NO_QUORUM_ERRORS = ETCD_FAILOVER_ERRORS


@pytest.mark.slow
def test_five_nodes_lose_two_then_quorum(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=5) as cluster:
        rec = Recorder()
        probe = Client(cluster.endpoint)
        try:
            with Workload(cluster.endpoint, rec, clients=3, seed=5, op_timeout=4) as load:
                wait_for(lambda: rec.writes_ok_since(0) >= 20, 30, "the workload to get going")
                leader = cluster.leader()
                first_two = [leader, cluster.followers(leader)[0]]
                killed_at = time.monotonic()
                for node in first_two:
                    cluster.kill(node)
                served = wait_for(lambda: rec.first_write_ok_after(killed_at), 15, "writes with 3 of 5 nodes")
                failover = served - killed_at  # type: ignore[operator]
                since = time.monotonic()
                wait_for(lambda: rec.writes_ok_since(since) >= 20, 30, "more writes with 3 of 5 nodes")

                third = cluster.leader(among=[n for n in cluster.nodes if n not in first_two])
                cluster.kill(third)
                lost_quorum_at = time.monotonic()
                errors: list[str] = []
                # longer than the store's request timeout (7 s), as etcd would answer by then
                try:
                    probe.put(b"/probe/no-quorum", b"x", timeout=9)
                    errors.append("OK")
                except grpc.RpcError as exc:
                    errors.append(describe(exc))
                wait_for(lambda: sum(1 for r in rec.records if r.started > lost_quorum_at and r.error) >= 3, 30,
                         "writes to fail without a quorum")
                succeeded = [r.op for r in rec.records if r.started > lost_quorum_at and r.op.status == "ok"
                             and r.op.kind != "get"]
                assert not succeeded, f"writes succeeded without a quorum: {succeeded}"
                no_quorum = {r.error for r in rec.records if r.started > lost_quorum_at and r.error}
                restarted_at = time.monotonic()
                for node in (*first_two, third):
                    cluster.restart(node)
                back = wait_for(lambda: rec.first_write_ok_after(restarted_at), 30, "writes once quorum is back")
                since = time.monotonic()
                wait_for(lambda: rec.writes_ok_since(since) >= 10, 30, "writes after the restart")
                load.stop()
            rec.history.close()
            print(f"\n2 of 5 killed -> first write {failover:.2f}s; first of 3 restarts begun -> first write "
                  f"{back - restarted_at:.2f}s")  # type: ignore[operator]
            print(f"probe write without quorum (9 s deadline): {errors}")
            print(f"workload errors without quorum: {sorted(no_quorum)}")
            print(f"ops: {len(rec.records)}, acknowledged writes: {len(rec.acked_writes())}, errors: {rec.errors()}")
            assert "OK" not in errors
            assert_only_etcd_errors(no_quorum | set(errors), NO_QUORUM_ERRORS)
            append_final_reads(rec, probe, Workload.SHARED)
            final = retry_ok(lambda: probe.scan(Workload.UNIQUE_PREFIX), 20, "the final scan")
            check_acked_present(rec, final)
            assert not probe.scan(b"/probe/no-quorum"), "a write sent without a quorum was applied"
            result = check(rec.history.ops)
            assert result.ok, result.describe()
            cluster.wait_converged(timeout=30)
            for node in cluster.nodes:
                check_acked_present(rec, cluster.local_keys(node, Workload.UNIQUE_PREFIX))
        finally:
            probe.close()
