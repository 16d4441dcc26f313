"""What the snapshot-restore and migration tests share: a cluster filled with every kind of state
(keys with history, a lease, users, roles, grants, auth on), what etcdctl shows of one, and
``raftgate store`` started on restored data dirs with a proxy in front."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.cluster import Client, Cluster, Node, Program, setup_auth, store_argv
from tests.support.processes import etcdctl, free_port

ROOT_USER = "root:rootpw"


def fill_cluster(client: Client) -> int:
    """Keys (some with history), a lease with a key, users, roles, grants; then auth enable.
    Returns the lease ID."""
    for i in range(5):
        client.put(b"/app/a", b"v%d" % i, timeout=10)
    client.put(b"/app/b", b"bee", timeout=10)
    client.put(b"/other/x", b"ex", timeout=10)
    client.kv.DeleteRange(rpc_pb2.DeleteRangeRequest(key=b"/app/b"), timeout=10)
    client.put(b"/app/c", b"sea", timeout=10)
    lease = rpc_pb2_grpc.LeaseStub(client.channel).LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=600), timeout=10).ID
    client.kv.Put(rpc_pb2.PutRequest(key=b"/leased", value=b"l", lease=lease), timeout=10)
    a = client.auth
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="alicepw"), timeout=10)
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="bob", password="bobpw"), timeout=10)
    a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="reader"), timeout=10)
    a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="writer"), timeout=10)
    a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
        name="reader", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=b"/app/", range_end=b"/app0")),
        timeout=10)
    a.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(
        name="writer", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"/other/x")), timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="alice", role="reader"), timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="bob", role="writer"), timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="bob", role="reader"), timeout=10)
    setup_auth(client)
    return lease



def etcdctl_view(endpoint: str) -> dict[str, Any]:
    """What etcdctl shows of the cluster (as root): keys, users, roles, grants, leases."""

    def run(*args: str) -> str:
        rc, out, err = etcdctl(endpoint, *args, user=ROOT_USER)
        assert rc == 0, (args, err)
        return out

    users = run("user", "list").split()
    roles = run("role", "list").split()
    leases = run("lease", "list").splitlines()[1:]
    return {
        "keys": run("get", "", "--from-key"),
        "users": users,
        "user": {u: run("user", "get", u) for u in users},
        "roles": roles,
        "role": {r: run("role", "get", r) for r in roles},
        "leases": leases,
        "lease_keys": {line: run("lease", "timetolive", line.split()[-1], "--keys").split("attached keys")[-1]
                       for line in leases},
        "auth": run("auth", "status").splitlines()[0],
    }



@contextlib.contextmanager
def restored_cluster(workdir: Path, members: list[tuple[str, Path, int]]) -> Iterator[Cluster]:
    """`raftgate store` on each restored data dir (flags as the restore was given), and a proxy."""
    workdir.mkdir(parents=True, exist_ok=True)
    secret = workdir / "internal-secret"
    secret.write_text(os.urandom(32).hex())
    os.chmod(secret, 0o600)
    client_url = f"http://127.0.0.1:{free_port()}"
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in members)
    nodes = []
    for name, data_dir, peer_port in members:
        internal = free_port()
        argv = store_argv(name, data_dir, internal, peer_port, secret, initial, client_url, [])
        nodes.append(Node(name=name, argv=argv, data_dir=data_dir, internal=f"127.0.0.1:{internal}"))
    cluster = Cluster(workdir, sys.executable, secret.read_text(), nodes, client_url.removeprefix("http://"))
    try:
        # all at once, as program_cluster does: a member may wait for the others to come up
        threads = [threading.Thread(target=cluster.restart, args=(node,)) for node in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(node.running for node in nodes), [node.output()[-2000:] for node in nodes]
        proxy = Program(workdir / "proxy",
                        ["proxy", "--listen-client-urls", client_url,
                         "--store-endpoints", ",".join(n.internal for n in nodes),
                         "--internal-secret-file", str(secret), "--bcrypt-cost", "4"], "raftgate proxy:", name="proxy")
        cluster.extra_programs.append(proxy)
        proxy.start()
        yield cluster
    finally:
        cluster.close()
