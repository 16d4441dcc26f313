"""Kubernetes workload identity end to end: `raftgate local --nodes 1` (auth on) whose proxy accepts
tokens of a test issuer served on 127.0.0.1, with a user map; a pod's token is the mapped user and
that user's roles decide. Then a sidecar in identity mode lends the pod's own projected token
(``--identity-oidc-token-file``), re-read when kubelet rotates it."""

from __future__ import annotations

import json
import os
import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.oidc_issuer import AUDIENCE, TestIssuer, running_issuer
from tests.support.processes import Program, RaftgateLocal, etcdctl, free_port, wait_for, wait_serving

pytestmark = pytest.mark.slow

RULES = [
    {"match": "system:serviceaccount:shop:reports", "user": "reader"},
    {"match": "system:serviceaccount:shop:*", "user": "shop"},
    {"match": "system:serviceaccount:ghost:*", "user": "ghost"},  # no such user in the store
]
DENIED = (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
INVALID = (grpc.StatusCode.UNAUTHENTICATED, "etcdserver: invalid auth token")


def ok(endpoint: str, *args: str, user: str | None = "root:rootpw") -> str:
    rc, out, err = etcdctl(endpoint, *args, user=user)
    assert rc == 0, f"etcdctl {' '.join(args)}: {err}"
    return out


@dataclass
class Cluster:
    local: RaftgateLocal
    issuer: TestIssuer
    oidc_args: list[str]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("workload")
    user_map = workdir / "user-map.json"
    user_map.write_text(json.dumps(RULES))
    with running_issuer() as issuer, pytest.MonkeyPatch.context() as env:
        oidc = {"OIDC_ISSUER": issuer.url, "OIDC_AUDIENCE": AUDIENCE, "OIDC_USER_MAP": str(user_map)}
        for name, value in oidc.items():  # raftgate local passes its environment on to its proxies
            env.setenv(f"RAFTGATE_PROXY_{name}", value)
        local = RaftgateLocal(workdir / "local", extra_args=["--nodes", "1"])
        with local:
            env.delenv("RAFTGATE_PROXY_OIDC_ISSUER")  # the sidecar below gets them as flags
            env.delenv("RAFTGATE_PROXY_OIDC_AUDIENCE")
            env.delenv("RAFTGATE_PROXY_OIDC_USER_MAP")
            ep = local.endpoint
            ok(ep, "user", "add", "root:rootpw", user=None)
            ok(ep, "user", "grant-role", "root", "root", user=None)
            for user, role, perm in (("shop", "shop-rw", "readwrite"), ("reader", "shop-ro", "read")):
                ok(ep, "user", "add", f"{user}:unused-{user}-pw", user=None)
                ok(ep, "role", "add", role, user=None)
                ok(ep, "role", "grant-permission", role, perm, "/shop/", "--prefix", user=None)
                ok(ep, "user", "grant-role", user, role, user=None)
            ok(ep, "auth", "enable", user=None)
            args = ["--oidc-issuer", issuer.url, "--oidc-audience", AUDIENCE, "--oidc-user-map", str(user_map)]
            yield Cluster(local, issuer, args)


def call(target: str, token: str | None, request: rpc_pb2.PutRequest | rpc_pb2.RangeRequest) -> object:
    metadata = (("token", token),) if token else None
    with grpc.insecure_channel(target) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        method = kv.Put if isinstance(request, rpc_pb2.PutRequest) else kv.Range
        return method(request, metadata=metadata, timeout=15)


def refused(target: str, token: str | None, request: rpc_pb2.PutRequest | rpc_pb2.RangeRequest) -> tuple[object, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(target, token, request)
    return err.value.code(), err.value.details()


def put(key: str) -> rpc_pb2.PutRequest:
    return rpc_pb2.PutRequest(key=key.encode(), value=b"v")


def get(key: str) -> rpc_pb2.RangeRequest:
    return rpc_pb2.RangeRequest(key=key.encode())


def test_a_workload_token_is_its_mapped_user_and_its_roles_decide(cluster: Cluster) -> None:
    target, issuer = cluster.local.target, cluster.issuer
    cart = issuer.token("system:serviceaccount:shop:cart")  # -> shop (readwrite /shop/)
    reports = issuer.token("system:serviceaccount:shop:reports")  # -> reader (read /shop/)
    call(target, cart, put("/shop/a"))
    assert call(target, cart, get("/shop/a")).kvs[0].value == b"v"  # type: ignore[attr-defined]
    assert refused(target, cart, put("/bank/a")) == DENIED
    assert call(target, reports, get("/shop/a")).kvs[0].value == b"v"  # type: ignore[attr-defined]
    assert refused(target, reports, put("/shop/a")) == DENIED
    # a watch made with the token sees the user's writes
    with grpc.insecure_channel(target) as channel:
        requests: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        create = rpc_pb2.WatchCreateRequest(key=b"/shop/", range_end=b"/shop0")
        requests.put(rpc_pb2.WatchRequest(create_request=create))
        stream = rpc_pb2_grpc.WatchStub(channel).Watch(iter(requests.get, None), metadata=(("token", reports),),
                                                      timeout=30)
        assert next(stream).created
        call(target, cart, put("/shop/watched"))
        events = next(stream).events
        assert [e.kv.key for e in events] == [b"/shop/watched"]
        requests.put(None)
        stream.cancel()
    # every refusal of the token itself is etcd's invalid auth token
    for bad in (issuer.token("system:serviceaccount:bank:cart"),  # no rule
                issuer.token("system:serviceaccount:ghost:x"),  # mapped to a user the store lacks
                issuer.token(aud="someone-else"), issuer.token(lifetime=-1),
                issuer.token(iss="https://other.example")):  # neither a workload token nor raftgate's
        assert refused(target, bad, get("/shop/a")) == INVALID
    # an auth change after the (cached) resolution is seen at once: the role loses its grant
    ok(cluster.local.endpoint, "role", "revoke-permission", "shop-ro", "/shop/", "--prefix")
    try:
        assert refused(target, reports, get("/shop/a")) == DENIED
    finally:
        ok(cluster.local.endpoint, "role", "grant-permission", "shop-ro", "read", "/shop/", "--prefix")
    # the proxy logs why (with the token's fingerprint), never a token
    assert any("workload token" in line and "no rule maps" in line for line in cluster.local.lines)
    assert not any(cart in line or reports in line for line in cluster.local.lines)


def write_token(volume: Path, token: str) -> None:
    """As kubelet rotates a projected token: a new file swapped in."""
    tmp = volume / ".token.tmp"
    tmp.write_text(token)
    os.replace(tmp, volume / "token")


def test_identity_mode_sidecar_lends_the_pods_projected_token(cluster: Cluster, tmp_path: Path) -> None:
    issuer, local = cluster.issuer, cluster.local
    volume = tmp_path / "sa-token"
    volume.mkdir()
    write_token(volume, issuer.token("system:serviceaccount:shop:cart"))
    layout = json.loads((local.data_dir / "layout.json").read_text())
    port = free_port()
    sidecar = Program(tmp_path / "sidecar", [
        "proxy", "--listen-client-urls", f"http://127.0.0.1:{port}",
        "--store-endpoints", f"127.0.0.1:{layout[0]['internal_port']}",
        "--internal-secret-file", str(local.data_dir / "internal-secret"),
        *cluster.oidc_args, "--identity-oidc-token-file", str(volume),
    ], "raftgate proxy:", name="sidecar")
    with sidecar:
        ep = f"127.0.0.1:{port}"
        wait_serving(ep)
        assert ok(ep, "put", "/shop/side", "1", user=None) == "OK\n"  # no credentials in the client
        rc, _, err = etcdctl(ep, "put", "/bank/side", "1")
        assert rc != 0 and "permission denied" in err
        # kubelet rotates the token; this one's service account maps to the read-only user
        write_token(volume, issuer.token("system:serviceaccount:shop:reports"))

        def read_only() -> bool:
            rc, _, err = etcdctl(ep, "put", "/shop/side", "2")
            return rc != 0 and "permission denied" in err

        wait_for(read_only, 30, "the sidecar to lend the rotated token")
        assert ok(ep, "get", "/shop/side", "--print-value-only", user=None) in ("1\n", "2\n")  # may still read
    assert "eyJ" not in sidecar.output()  # no token (a JWT starts so) in its log
