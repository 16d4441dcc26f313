"""Lockout through real proxies (issue 12, part 2): the count lives in the store's log, so failed
Authenticate calls spread over two proxies lock the name on both; a locked name, a name that
does not exist and a wrong password all get etcd's one wrong-password answer; root's `user passwd`
lifts the lock; a success resets the count; --auth-lockout-attempts 0 turns it off (through
`raftgate local`); --auth-rate-limit answers etcd's `too many requests`."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import (
    Program,
    RaftgateLocal,
    free_port,
    proxy_program,
    stop_together,
    store_program,
    wait_for,
    wait_serving,
)

pytestmark = pytest.mark.slow

AUTH_FAILED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")
TOO_MANY = (grpc.StatusCode.RESOURCE_EXHAUSTED, "etcdserver: too many requests")


class Cluster:
    def __init__(self, store_metrics: str, proxies: list[str]) -> None:
        self.store_metrics = store_metrics
        self.channels = [grpc.insecure_channel(p) for p in proxies]
        self.auth = [rpc_pb2_grpc.AuthStub(c) for c in self.channels]

    def login(self, proxy: int, name: str, password: str) -> tuple[grpc.StatusCode, str]:
        try:
            token = self.auth[proxy].Authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password),
                                                  timeout=30).token
        except grpc.RpcError as e:
            return e.code(), e.details()
        assert token
        return grpc.StatusCode.OK, ""

    def root(self) -> tuple[tuple[str, str]]:
        token = self.auth[0].Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw"), timeout=30)
        return (("token", token.token),)

    def metric(self, name: str) -> float:
        text = urllib.request.urlopen(f"http://{self.store_metrics}/metrics", timeout=10).read().decode()
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def setup_auth(auth: rpc_pb2_grpc.AuthStub) -> None:
    auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=30)
    auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=30)
    for name in ("alice", "bob", "carol"):
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=name, password="pw"), timeout=30)
    auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One store (3 attempts within 10m lock a name) and three proxies; the third rate-limits
    Authenticate to one call per 100 s per client."""
    workdir = tmp_path_factory.mktemp("lockout")
    metrics = f"127.0.0.1:{free_port()}"
    store, internal = store_program(workdir, "--auth-lockout-attempts", "3", "--auth-lockout-duration", "10m",
                                    "--metrics-addr", metrics)
    started: list[Program] = [store]
    try:
        store.start()
        ports = [free_port() for _ in range(3)]
        for i, port in enumerate(ports):
            extra = ["--auth-rate-limit", "0.01"] if i == 2 else []
            proxy = proxy_program(workdir, internal, f"http://127.0.0.1:{port}", *extra, name=f"proxy{i}")
            proxy.start()
            started.append(proxy)
        for port in ports:
            wait_serving(f"http://127.0.0.1:{port}")
        c = Cluster(metrics, [f"127.0.0.1:{p}" for p in ports])
        setup_auth(c.auth[0])
        yield c
        for channel in c.channels:
            channel.close()
    finally:
        stop_together(started)


def test_failures_over_two_proxies_lock_the_name_on_both(cluster: Cluster) -> None:
    before = cluster.metric("raftgate_store_auth_lockouts_total")
    assert cluster.login(0, "alice", "wrong") == AUTH_FAILED
    assert cluster.login(1, "alice", "wrong") == AUTH_FAILED
    assert cluster.login(0, "alice", "wrong") == AUTH_FAILED
    # locked: the right password gets exactly the wrong-password answer, on either proxy
    assert cluster.login(1, "alice", "pw") == AUTH_FAILED
    assert cluster.login(0, "alice", "pw") == AUTH_FAILED
    assert cluster.login(1, "bob", "pw") == (grpc.StatusCode.OK, "")  # only that name
    assert cluster.metric("raftgate_store_auth_lockouts_total") == before + 1
    assert cluster.metric("raftgate_store_auth_locked_names") >= 1
    # root's `user passwd` lifts the lock
    cluster.auth[0].UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(name="alice", password="pw2"),
                                       metadata=cluster.root(), timeout=30)
    assert cluster.login(1, "alice", "pw2") == (grpc.StatusCode.OK, "")


def test_a_name_that_does_not_exist_gets_the_same_answers(cluster: Cluster) -> None:
    for i in range(5):
        assert cluster.login(i % 2, "mallory", "pw") == AUTH_FAILED


def test_a_success_resets_the_count(cluster: Cluster) -> None:
    for _ in range(3):
        assert cluster.login(0, "carol", "wrong") == AUTH_FAILED
        assert cluster.login(1, "carol", "wrong") == AUTH_FAILED
        assert cluster.login(0, "carol", "pw") == (grpc.StatusCode.OK, "")


def test_the_rate_limit_answers_too_many_requests(cluster: Cluster) -> None:
    assert cluster.login(2, "bob", "pw") == (grpc.StatusCode.OK, "")
    assert cluster.login(2, "bob", "pw") == TOO_MANY
    assert cluster.login(0, "bob", "pw") == (grpc.StatusCode.OK, "")  # a limit of that proxy alone


def test_zero_attempts_through_raftgate_local_turns_lockout_off(tmp_path: Path) -> None:
    server = RaftgateLocal(tmp_path, extra_args=["--nodes", "1", "--auth-lockout-attempts", "0",
                                                 "--auth-rate-limit", "1000"])
    server.start()
    try:
        wait_for(server.is_ready, 60, "raftgate local")
        c = Cluster("", [server.endpoint.removeprefix("http://")])
        setup_auth(c.auth[0])
        for _ in range(8):
            assert c.login(0, "alice", "wrong") == AUTH_FAILED
        assert c.login(0, "alice", "pw") == (grpc.StatusCode.OK, "")
        layout = server.local_json()
        assert layout is not None and "--auth-lockout-attempts" in str(layout)
        for channel in c.channels:
            channel.close()
    finally:
        server.stop()
