"""Trust item 2 under a crash: a new cluster started with --initial-root-password-file whose
first leader is killed (-9) at once, while anonymous clients try to make themselves root.

No anonymous request ever succeeds (before, during or after the failover): the new leader holds
root and AuthEnable as committed entries, as every initial member does. Root logs in with the
file's password afterwards, and the killed node comes back with auth enabled.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.cluster import Client, program_cluster, retry_ok

pytestmark = pytest.mark.slow
PASSWORD = "initial-Root-pa55word"


def test_killing_the_first_leader_opens_no_window(tmp_path: Path) -> None:
    pw = tmp_path / "root-password"
    pw.write_text(PASSWORD + "\n")
    with program_cluster(tmp_path / "c", nodes=3,
                         store_flags=["--initial-root-password-file", str(pw), "--bcrypt-cost", "4"]) as cluster:
        successes: list[str] = []
        stop = threading.Event()

        def anonymous() -> None:
            with grpc.insecure_channel(cluster.endpoint) as ch:
                auth, kv = rpc_pb2_grpc.AuthStub(ch), rpc_pb2_grpc.KVStub(ch)
                attempts = [
                    ("UserAdd", lambda: auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="evil", password="x"), timeout=3)),
                    ("UserGrantRole", lambda: auth.UserGrantRole(
                        rpc_pb2.AuthUserGrantRoleRequest(user="evil", role="root"), timeout=3)),
                    ("AuthDisable", lambda: auth.AuthDisable(rpc_pb2.AuthDisableRequest(), timeout=3)),
                    ("Put", lambda: kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), timeout=3)),
                    ("UserChangePassword", lambda: auth.UserChangePassword(
                        rpc_pb2.AuthUserChangePasswordRequest(name="root", password="mine"), timeout=3)),
                ]
                for _ in range(400):
                    if stop.is_set():
                        return
                    for name, call in attempts:
                        try:
                            call()
                            successes.append(name)
                        except grpc.RpcError:
                            pass

        threads = [threading.Thread(target=anonymous) for _ in range(2)]
        for t in threads:
            t.start()
        try:
            leader = cluster.leader()
            cluster.kill(leader)
            cluster.leader(timeout=30, among=cluster.followers(leader))
            client = Client(cluster.endpoint)
            retry_ok(lambda: client.login("root", PASSWORD), 30, "root to log in")
            status = client.auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)
            assert status.enabled
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert successes == []
        cluster.restart(leader)
        cluster.wait_converged(timeout=60)
        users = client.auth.UserList(rpc_pb2.AuthUserListRequest(), metadata=client.md, timeout=10).users
        assert list(users) == ["root"]
        client.close()
