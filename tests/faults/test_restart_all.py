"""kill -9 of every store node at once, then a restart of all of them from their argv: every key,
user, role, grant, the enabled flag, the auth revision and issued tokens are intact, and every write
acknowledged before the kill (some were in flight when it happened) is there, on every node."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import (
    Client,
    Recorder,
    Workload,
    auth_state,
    check_acked_present,
    kv_state,
    local_cluster,
    retry_ok,
    root_header,
    setup_auth,
)
from tests.support.processes import wait_for


def _build_state(root: Client) -> None:
    a, md = root.auth, root.md
    for name in ("alice", "bob"):
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name=name, password=f"{name}pw"), metadata=md, timeout=10)
    for role in ("app", "ro", "unused"):
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name=role), metadata=md, timeout=10)
    grants = [("app", auth_pb2.Permission.READWRITE, b"/app/", b"/app0"),
              ("ro", auth_pb2.Permission.READ, b"/ro/", b"/ro0"),
              ("ro", auth_pb2.Permission.WRITE, b"/ro/scratch", b"")]
    for role, kind, key, end in grants:
        a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
            name=role, perm=auth_pb2.Permission(permType=kind, key=key, range_end=end)), metadata=md, timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="app"), metadata=md, timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="bob", role="ro"), metadata=md, timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="bob", role="app"), metadata=md, timeout=10)
    a.UserRevokeRole(rpc_pb2.AuthUserRevokeRoleRequest(name="bob", role="app"), metadata=md, timeout=10)
    for i in range(10):
        root.put(f"/app/k{i}".encode(), f"v{i}".encode())
    root.put(b"/ro/x", b"read-only")
    root.put(b"/app/k3", b"v3-bis")
    root.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"/app/k5"), metadata=md, timeout=10)


@pytest.mark.slow
def test_kill_all_nodes_and_restart_keeps_everything(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        root = Client(cluster.endpoint)
        alice = Client(cluster.endpoint)
        try:
            setup_auth(root)
            _build_state(root)
            alice.login("alice", "alicepw")
            alice.put(b"/app/by-alice", b"1")
            before_auth = auth_state(root)
            before_kv = kv_state(root)
            assert before_auth["enabled"] and before_auth["auth_revision"] > 1

            rec = Recorder()
            with Workload(cluster.endpoint, rec, clients=3, token=root.token, unique_only=True, op_timeout=3) as load:
                wait_for(lambda: rec.writes_ok_since(0) >= 30, 30, "writes before the kill")
                for node in cluster.nodes:  # back to back: writes are in flight on all of them
                    cluster.kill(node)
                killed_at = time.monotonic()
                load.stop()
            for node in cluster.nodes:
                cluster.restart(node)
            cluster.leader()
            after_auth = retry_ok(lambda: auth_state(root), 30, "the restarted cluster to answer")
            restarted_in = time.monotonic() - killed_at
            after_kv = [kv for kv in kv_state(root) if not kv[0].startswith(Workload.UNIQUE_PREFIX)]
            assert after_auth == before_auth
            assert after_kv == before_kv
            # tokens issued before the kill still work, and permissions are what they were
            assert alice.get(b"/app/by-alice") == b"1"
            alice.put(b"/app/after-restart", b"2")
            with pytest.raises(grpc.RpcError) as denied:
                alice.put(b"/ro/x", b"no")
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            check_acked_present(rec, root.scan(Workload.UNIQUE_PREFIX))
            cluster.wait_converged(header=root_header(root))
            header = root_header(root)()
            for node in cluster.nodes:
                check_acked_present(rec, cluster.local_keys(node, Workload.UNIQUE_PREFIX, header))
                status = cluster.do(node, _auth_status(header))
                assert (status.enabled, status.authRevision) == (True, before_auth["auth_revision"])
            print(f"\nacknowledged writes before the kill: {len(rec.acked_writes())}, "
                  f"kill -> restarted and serving: {restarted_in:.2f}s, errors: {rec.errors()}")
        finally:
            root.close()
            alice.close()


def _auth_status(header: ipb.RequestHeader) -> ipb.InternalRaftRequest:
    return ipb.InternalRaftRequest(header=header, auth_status=rpc_pb2.AuthStatusRequest())
