"""Auth changes made during a failover are enforced by every node in log order.

A user with a grant writes in a loop; root revokes the grant while the leader is killed (just
before the revoke in one round, just after it is sent in the other). Every write sent after the
revoke was acknowledged must be refused: zero successes, and none of those keys on any node.
Then, on every node (the restarted one too), a write stamped with the auth revision from before
the revoke is refused as `revision of auth store is old`, and one stamped with the current
revision as `permission denied`: each node's apply stage enforces the revoke itself.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, describe, local_cluster, retry_ok, root_header, setup_auth
from tests.support.processes import wait_for

GRANT = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"/app/", range_end=b"/app0")
DENIED = "PERMISSION_DENIED: etcdserver: permission denied"
OLD_REVISION = "INVALID_ARGUMENT: etcdserver: revision of auth store is old"
NOT_LEADER = "FAILED_PRECONDITION: etcdserver: not leader"
NOT_GRANTED = "FAILED_PRECONDITION: etcdserver: permission is not granted to the role"


@dataclass
class Write:
    key: bytes
    started: float
    finished: float = 0.0
    outcome: str = "pending"  # "OK" or "CODE: details"


class Writers:
    """Threads writing fresh keys under `prefix` as one user, recording every outcome."""

    def __init__(self, target: str, token: str, prefix: bytes, clients: int = 2, max_seconds: float = 60) -> None:
        self.target, self.token, self.prefix = target, token, prefix
        self.writes: list[Write] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.deadline = time.monotonic() + max_seconds
        self.threads = [threading.Thread(target=self._loop, args=(c,), daemon=True) for c in range(clients)]
        for t in self.threads:
            t.start()

    def _loop(self, c: int) -> None:
        client = Client(self.target, self.token)
        n = 0
        try:
            while not self.stop_event.is_set() and time.monotonic() < self.deadline:
                n += 1
                w = Write(self.prefix + b"c%d/%05d" % (c, n), time.monotonic())
                with self.lock:
                    self.writes.append(w)
                try:
                    client.put(w.key, b"v", timeout=4)
                    w.outcome = "OK"
                except grpc.RpcError as exc:
                    w.outcome = describe(exc)
                w.finished = time.monotonic()
        finally:
            client.close()

    def count(self, pred) -> int:  # type: ignore[no-untyped-def]
        with self.lock:
            return sum(1 for w in self.writes if w.finished and pred(w))

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=15)
        assert not any(t.is_alive() for t in self.threads)


def _revoke_until_acked(root: Client) -> float:
    """RoleRevokePermission until an answer proves it applied; returns when that answer came.
    A retry answered `permission is not granted` means an earlier attempt (with an unknown
    outcome) took effect before this answer: the answer time is a safe (late) ack time."""
    req = rpc_pb2.AuthRoleRevokePermissionRequest(role="app", key=GRANT.key, range_end=GRANT.range_end)
    deadline = time.monotonic() + 30
    errors: list[str] = []
    while time.monotonic() < deadline:
        try:
            root.auth.RoleRevokePermission(req, metadata=root.md, timeout=5)
            return time.monotonic()
        except grpc.RpcError as exc:
            errors.append(describe(exc))
            if errors[-1] == NOT_GRANTED:
                return time.monotonic()
    raise AssertionError(f"the revoke never succeeded: {errors}")


@pytest.mark.slow
def test_revoke_during_failover_is_enforced_in_log_order(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        root = Client(cluster.endpoint)
        alice = Client(cluster.endpoint)
        try:
            setup_auth(root)
            a, md = root.auth, root.md
            a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="alicepw"), metadata=md, timeout=10)
            a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="app"), metadata=md, timeout=10)
            a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="app"), metadata=md, timeout=10)
            alice.login("alice", "alicepw")
            report = []
            for round_no, kill_first in enumerate((True, False)):
                retry_ok(lambda: a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=GRANT),
                                                       metadata=md, timeout=5), 20, "the grant")
                rev_before = a.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5).authRevision
                prefix = b"/app/round%d/" % round_no
                writers = Writers(cluster.endpoint, alice.token, prefix)  # type: ignore[arg-type]
                try:
                    wait_for(lambda w=writers: w.count(lambda x: x.outcome == "OK") >= 10, 20, "alice's writes")
                    leader = cluster.leader()
                    if kill_first:
                        cluster.kill(leader)
                        acked_at = _revoke_until_acked(root)
                    else:
                        box: list[float] = []
                        t = threading.Thread(target=lambda b=box: b.append(_revoke_until_acked(root)))
                        t.start()
                        cluster.kill(leader)  # while the revoke is in flight
                        t.join(timeout=40)
                        assert box, "the revoke thread failed"
                        acked_at = box[0]
                    # writers keep going until the new leader refused a good number of them
                    wait_for(lambda w=writers, t0=acked_at: w.count(
                        lambda x: x.started > t0 and x.outcome in (DENIED, OLD_REVISION)) >= 10,
                        20, "writes after the revoke to be refused")
                finally:
                    writers.stop()
                after = [w for w in writers.writes if w.started > acked_at]
                leaked = [w for w in after if w.outcome == "OK"]
                assert not leaked, f"{len(leaked)} writes sent after the revoke's ack succeeded: {leaked[:5]}"
                outcomes: dict[str, int] = {}
                for w in after:
                    outcomes[w.outcome] = outcomes.get(w.outcome, 0) + 1
                report.append((round_no, "kill, then revoke" if kill_first else "revoke, kill while in flight",
                               leader.name, outcomes))
                cluster.restart(leader)
                header = root_header(root)
                cluster.wait_converged(header=header)
                late = {w.key for w in after}
                rev_now = a.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5).authRevision
                assert rev_now > rev_before
                leader_now = cluster.leader()
                for node in cluster.nodes:
                    held = cluster.local_keys(node, prefix, header())
                    assert not (late & held.keys()), f"{node.name} holds keys written after the revoke"
                    for rev, expected in ((rev_before, OLD_REVISION), (rev_now, DENIED)):
                        stale = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="alice", auth_revision=rev),
                                                        put=rpc_pb2.PutRequest(key=prefix + b"stamped", value=b"x"))
                        with pytest.raises(grpc.RpcError) as refused:
                            cluster.do(node, stale, timeout=10)
                        # The leader's apply stage refuses it; a follower takes no write at all.
                        assert describe(refused.value) == (expected if node is leader_now else NOT_LEADER), (
                            node.name, rev)
                cluster.wait_converged(header=header)
                for node in cluster.nodes:
                    assert prefix + b"stamped" not in cluster.local_keys(node, prefix, header())
            print()
            for round_no, how, killed, outcomes in report:
                print(f"round {round_no} ({how}, killed {killed}): writes sent after the ack: {outcomes}")
        finally:
            root.close()
            alice.close()
