"""One store and two proxies with simple tokens, and root's calls on them (token revocation tests)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import Program, free_port, proxy_program, stop_together, store_program, wait_serving

ROOT_PW = "root-pw"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """One store node and two proxies (simple tokens); yields the proxies' host:port."""
    workdir = tmp_path_factory.mktemp("revocation")
    store, internal = store_program(workdir)
    started: list[Program] = [store]
    store.start()
    try:
        targets = []
        for name in ("p1", "p2"):
            port = free_port()
            proxy = proxy_program(workdir, internal, f"http://127.0.0.1:{port}", "--auth-token-ttl", "300",
                                  name=name)
            proxy.start()
            started.append(proxy)
            targets.append(f"127.0.0.1:{port}")
        wait_serving("http://" + targets[0])
        with grpc.insecure_channel(targets[0]) as ch:
            auth = rpc_pb2_grpc.AuthStub(ch)
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password=ROOT_PW), timeout=30)
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=30)
            auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=30)
        yield targets
    finally:
        stop_together(started)


def _token(target: str, name: str, password: str) -> str:
    with grpc.insecure_channel(target) as ch:
        resp = rpc_pb2_grpc.AuthStub(ch).Authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password),
                                                      timeout=30)
    return resp.token


def _as_root(target: str, method: str, request: object) -> None:
    token = _token(target, "root", ROOT_PW)
    with grpc.insecure_channel(target) as ch:
        getattr(rpc_pb2_grpc.AuthStub(ch), method)(request, metadata=(("token", token),), timeout=30)
