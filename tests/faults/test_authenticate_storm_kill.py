"""A crash during an Authenticate storm: kill -9 of the store leader while clients log in.

Every token a client was given must work afterwards on the new leader (a simple token is
registered through the log before Authenticate returns, so no answered login may be lost), every
failure is one of etcd's, and a login refused for a wrong password never yields a token. The
killed node restarts and converges.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.errors import Err
from tests.support.cluster import (
    ETCD_FAILOVER_ERRORS,
    Client,
    assert_only_etcd_errors,
    program_cluster,
    retry_ok,
    setup_auth,
)
from tests.support.processes import wait_for

pytestmark = pytest.mark.slow
LOGINS_PER_CLIENT = 40
CLIENTS = 4


def test_tokens_given_during_a_leader_kill_all_work(tmp_path: Path) -> None:
    with program_cluster(tmp_path / "c", nodes=3) as cluster:
        root = Client(cluster.endpoint)
        setup_auth(root)
        root.auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password="pw"), metadata=root.md, timeout=10)
        tokens: list[str] = []
        errors: set[str] = set()
        done = [0]
        lock = threading.Lock()

        def storm(c: int) -> None:
            with grpc.insecure_channel(cluster.endpoint) as ch:
                auth = rpc_pb2_grpc.AuthStub(ch)
                for i in range(LOGINS_PER_CLIENT):
                    wrong = i % 5 == 4
                    try:
                        request = rpc_pb2.AuthenticateRequest(name="u", password="no" if wrong else "pw")
                        resp = auth.Authenticate(request, timeout=8)
                        with lock:
                            assert not wrong, "a wrong password was given a token"
                            tokens.append(resp.token)
                    except grpc.RpcError as e:
                        text = f"{e.code().name}: {e.details()}"
                        with lock:
                            if not (wrong and text == f"{Err.AUTH_FAILED.code.name}: {Err.AUTH_FAILED.message}"):
                                errors.add(text)
                    with lock:
                        done[0] += 1

        threads = [threading.Thread(target=storm, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        wait_for(lambda: done[0] >= CLIENTS * 5, 120, "logins under way")
        leader = cluster.leader()
        cluster.kill(leader)
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads)
        allowed = ETCD_FAILOVER_ERRORS | {f"{Err.TOO_MANY_REQUESTS.code.name}: {Err.TOO_MANY_REQUESTS.message}"}
        assert_only_etcd_errors(errors, allowed)
        assert tokens
        with grpc.insecure_channel(cluster.endpoint) as ch:
            lease = rpc_pb2_grpc.LeaseStub(ch)
            for token in tokens:
                retry_ok(lambda token=token: lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60),
                                                              metadata=(("token", token),), timeout=5),
                         60, "a login's token to work")
        cluster.restart(leader)
        cluster.wait_converged(timeout=60)
        root.close()
