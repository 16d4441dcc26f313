"""AuthEnable under a crash: anonymous writers keep writing while root enables auth and the store
leader is killed (-9) with the enable in flight.

Whatever the AuthEnable caller was told, once auth is seen enabled no anonymous write sent after
that moment succeeds, on the new leader or on the restarted node: apply decides in log order.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.cluster import Client, program_cluster, retry_ok
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow


def test_no_anonymous_write_after_auth_enable_survives_a_leader_kill(tmp_path: Path) -> None:
    with program_cluster(tmp_path / "c", nodes=3) as cluster:
        admin = Client(cluster.endpoint)
        a = admin.auth
        a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
        a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), timeout=10)
        a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        enabled_seen = threading.Event()
        late_successes: list[bytes] = []
        stop = threading.Event()

        def writer(w: int) -> None:
            with grpc.insecure_channel(cluster.endpoint) as ch:
                kv = rpc_pb2_grpc.KVStub(ch)
                for i in range(2000):
                    if stop.is_set():
                        return
                    after = enabled_seen.is_set()
                    key = b"anon/%d/%d" % (w, i)
                    try:
                        kv.Put(rpc_pb2.PutRequest(key=key, value=b"v"), timeout=3)
                        if after:
                            late_successes.append(key)
                    except grpc.RpcError:
                        pass

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        try:
            leader = cluster.leader()
            enabler = threading.Thread(target=lambda: _quietly(lambda: a.AuthEnable(rpc_pb2.AuthEnableRequest(),
                                                                                    timeout=10)))
            enabler.start()
            a.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)  # a round trip: the enable is on its way
            cluster.kill(leader)
            enabler.join(timeout=60)
            # enable again if the first was lost (or enabled already: refused with no effect)
            wait_for(lambda: _enable_or_enabled(a), 60, "auth to be enabled")
            enabled_seen.set()
            retry_ok(lambda: admin.login("root", "rootpw"), 60, "root to log in")
            cluster.restart(leader)
            cluster.wait_converged(timeout=60)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert late_successes == []


def _quietly(call) -> None:  # type: ignore[no-untyped-def]
    with contextlib.suppress(grpc.RpcError):
        call()


def _enable_or_enabled(auth: rpc_pb2_grpc.AuthStub) -> bool:
    """Enables auth unless it is on (the enable in flight may have been lost); whether it is on."""
    with contextlib.suppress(grpc.RpcError):
        if not auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5).enabled:
            auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=5)
        return auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5).enabled
    return False
