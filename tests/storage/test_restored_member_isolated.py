"""A member restored into a NEW cluster (`raftgate snapshot restore` with a new
--initial-cluster-token) on the address of a member of the old cluster that still runs elsewhere
must not take part in the old cluster's Raft: the old leader keeps sending to the address it knows
for its member, and the node there now has another ID. etcd refuses such messages (the
receiver's ID and the cluster ID are checked on every peer request); a node that took them would
follow the old cluster's leader (its term, a leader that is no member of its own cluster).

Finding: a member restored into a new cluster on an old member's address followed the old cluster's
leader (failed before the fix).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, Node, program_cluster, retry_ok, store_argv, wait_for
from tests.support.processes import Program, free_port
from tests.support.snapshots import make_snapshot, raftgate

pytestmark = pytest.mark.slow


def test_a_restored_member_on_an_old_members_address_ignores_the_old_cluster(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path / "snap", keys=10)
    with program_cluster(tmp_path / "old", nodes=3) as old:
        client = Client(old.endpoint)
        b_prog: Program | None = None
        try:
            retry_ok(lambda: client.put(b"/warm", b"up", timeout=10), 30, "a first write")
            n1, n2, n3 = old.nodes
            for n in old.nodes:
                assert old.leader_info(n) is not None
            old.terminate(n1)
            # the old cluster's term well above a new cluster's first one
            for _ in range(4):
                lead = old.leader(among=[n2, n3])
                target = n3 if lead is n2 else n2
                retry_ok(lambda t=target: client.maintenance.MoveLeader(  # type: ignore[misc]
                    rpc_pb2.MoveLeaderRequest(targetID=t.member_id), timeout=10), 30, "a leader move")
                wait_for(lambda t=target: old.leader(among=[n2, n3]) is t, 30, "the move")  # type: ignore[misc]
            leader = old.leader(among=[n2, n3])
            info = old.leader_info(leader)
            assert info is not None
            old_term = info.raft_term

            peer_url = n1.argv[n1.argv.index("--listen-peer-urls") + 1]
            new_dir = tmp_path / "new-node1"
            proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(new_dir), "--name", "node1",
                            "--initial-cluster", f"node1={peer_url}", "--initial-advertise-peer-urls", peer_url,
                            "--initial-cluster-token", "restored")
            assert proc.returncode == 0, proc.stderr
            internal = free_port()
            secret = Path(n1.argv[n1.argv.index("--internal-secret-file") + 1])
            argv = store_argv("node1", new_dir, internal, int(peer_url.rsplit(":", 1)[1]), secret,
                              f"node1={peer_url}", "http://127.0.0.1:1", ["--initial-cluster-token", "restored"])
            b_prog = Program(tmp_path / "new-prog", argv, "raftgate store:", name="new-node1")
            b_prog.start(timeout=60)
            new = Node(name="new-node1", argv=argv, data_dir=new_dir, internal=f"127.0.0.1:{internal}")

            last: list[object] = []

            def leads_itself() -> bool:
                got = old.leader_info(new)
                last[:] = [got]
                return got is not None and got.leader_id == got.member_id

            try:
                wait_for(leads_itself, 30, "the restored member to lead its own cluster")
            except TimeoutError:
                got = last[0] if last else None
                raise AssertionError(f"the restored member does not lead its own one-member cluster: {got} "
                                     f"(the old leader is {info.member_id:x}, term {old_term})") from None
            # the old leader sends heartbeats and appends to "node1" meanwhile
            for i in range(40):
                client.put(b"/old/%d" % i, b"x", timeout=10)
                got = old.leader_info(new)
                assert got is not None
                assert got.leader_id in (0, got.member_id), f"follows {got.leader_id:x}, not a member of its cluster"
                assert got.raft_term < old_term, f"took the old cluster's term {got.raft_term} (old {old_term})"
        finally:
            if b_prog is not None:
                b_prog.stop(timeout=5)
            client.close()
