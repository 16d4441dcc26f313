"""Sidecar identity mode end to end: an etcdctl with no credentials, on loopback (or a Unix socket),
works as the mounted identity - within its grants only - and keeps working after the identity's
password changes (in the store and in the mounted Secret) and after unrelated auth changes. Clients
from the network without a token stay anonymous; clients with a token are handled as usual."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import jwt as pyjwt
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.probes import sample, scrape
from tests.support.processes import etcdctl, free_port, pem_rsa_keypair, proxy_program, store_program, wait_serving

pytestmark = pytest.mark.slow

DENIED = "Error: etcdserver: permission denied\n"
USER_EMPTY = "Error: etcdserver: user name is empty\n"
ROOT = "root:rootpw"


def secret_volume(root: Path, version: str, username: str, password: str) -> None:
    """Writes a Secret volume as kubelet does: a new ..<version> dir, then an atomic ..data swap."""
    root.mkdir(exist_ok=True)
    data = root / f"..{version}"
    data.mkdir()
    (data / "username").write_text(username)
    (data / "password").write_text(password)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    for name in ("username", "password"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def non_loopback_ip() -> str | None:
    """An address of this host that is not loopback (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ipaddress.ip_address(ip).is_loopback else ip


def ok(endpoint: str, *args: str, user: str | None = None, stdin: str | None = None) -> str:
    rc, out, err = etcdctl(endpoint, *args, user=user, stdin=stdin)
    assert rc == 0, f"etcdctl {' '.join(args)}: {err}"
    return out


def fails(endpoint: str, *args: str, user: str | None = None) -> str:
    rc, _, err = etcdctl(endpoint, *args, user=user)
    assert rc != 0
    return "".join(line + "\n" for line in err.splitlines() if line.startswith("Error:"))


@dataclass
class Pod:
    """A store and an identity-mode proxy, as an application pod sees them."""

    local: str  # 127.0.0.1:port, lends the identity
    socket: str  # unix:path, lends the identity
    network: str | None  # <host ip>:port, never lends
    metrics: str
    volume: Path


def enable_auth(endpoint: str) -> None:
    """root, alice (readwrite /app/ prefix), auth on. Passes --user where it matters: before auth is
    enabled the lent identity goes anonymous, after it alice could not do this."""
    ok(endpoint, "user", "add", ROOT)
    ok(endpoint, "user", "add", "alice:alicepw")
    ok(endpoint, "role", "add", "app")
    ok(endpoint, "role", "grant-permission", "app", "readwrite", "/app/", "--prefix")
    ok(endpoint, "user", "grant-role", "alice", "app")
    ok(endpoint, "auth", "enable")


@pytest.fixture(params=["simple", "jwt"])
def pod(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pod]:
    volume = tmp_path / "identity"
    secret_volume(volume, "v1", "alice", "alicepw\n")
    store, internal = store_program(tmp_path)
    port, metrics = free_port(), f"127.0.0.1:{free_port()}"
    sock = tmp_path / "etcd.sock"
    listen = [f"http://127.0.0.1:{port}", f"unix://{sock}"]
    ip = non_loopback_ip()
    network_port = free_port()
    if ip is not None:
        listen.append(f"http://{ip}:{network_port}")
    extra = ["--identity-file", str(volume), "--metrics-addr", metrics]
    if request.param == "jwt":
        priv, pub = pem_rsa_keypair(tmp_path)
        extra += ["--auth-token", f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256,ttl=10m"]
    proxy = proxy_program(tmp_path, internal, ",".join(listen), *extra)
    with store, proxy:
        local = f"127.0.0.1:{port}"
        wait_serving(local)
        yield Pod(local, f"unix:{sock}", f"{ip}:{network_port}" if ip else None, metrics, volume)
        for secret in ("alicepw", "newpw"):
            assert secret not in proxy.output()


def test_lent_identity_within_its_grants_and_through_changes(pod: Pod) -> None:
    ep = pod.local
    # Before auth is enabled the lent identity is anonymous: everything works, as in etcd.
    assert ok(ep, "put", "/app/before", "1") == "OK\n"
    enable_auth(ep)
    assert ok(ep, "put", "/app/k", "v1") == "OK\n"
    assert ok(ep, "get", "/app/k", "--print-value-only") == "v1\n"
    assert fails(ep, "put", "/other", "x") == DENIED
    assert fails(ep, "get", "/other") == DENIED
    assert fails(ep, "user", "list") == DENIED  # alice is not root
    assert ok(ep, "user", "list", user=ROOT) == "alice\nroot\n"  # a token of its own wins

    # The same through a Unix socket listener.
    with grpc.insecure_channel(pod.socket) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        assert kv.Range(rpc_pb2.RangeRequest(key=b"/app/k"), timeout=10).kvs[0].value == b"v1"
        with pytest.raises(grpc.RpcError) as err:
            kv.Put(rpc_pb2.PutRequest(key=b"/other", value=b"x"), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # The password changes: in the store first, then in the mounted Secret.
    ok(ep, "user", "passwd", "alice", "--interactive=false", user=ROOT, stdin="newpw\n")
    secret_volume(pod.volume, "v2", "alice", "newpw")
    assert ok(ep, "put", "/app/k", "v2") == "OK\n"
    assert ok(ep, "get", "/app/k", "--print-value-only") == "v2\n"
    assert fails(ep, "put", "/other", "x") == DENIED

    # An unrelated auth change makes the identity's revision old: re-authenticated transparently.
    ok(ep, "role", "add", "unrelated", user=ROOT)
    assert ok(ep, "put", "/app/k", "v3") == "OK\n"
    ok(ep, "user", "add", "bob:bobpw", user=ROOT)
    assert ok(ep, "get", "/app/k", "--print-value-only") == "v3\n"

    metrics = scrape(pod.metrics)
    assert sample(metrics, "raftgate_proxy_authentications_total", result="ok") >= 3
    refreshed = sum(v for (name, _), v in metrics.items() if name == "raftgate_proxy_identity_refreshes_total")
    assert refreshed >= 2  # user_empty after auth enable, then the password change


def test_the_identity_is_never_lent_to_the_network(pod: Pod) -> None:
    if pod.network is None:
        pytest.skip("this host has no non-loopback address")
    enable_auth(pod.local)
    ok(pod.local, "put", "/app/k", "v")
    assert fails(pod.network, "get", "/app/k") == USER_EMPTY
    assert ok(pod.network, "get", "/app/k", "--print-value-only", user="alice:alicepw") == "v\n"


def test_identity_jwt_file_in_verify_only_mode(tmp_path: Path) -> None:
    """A token minted outside (the proxy holds only the public key) is lent; after an auth change
    the minter's new token is picked up from the file."""
    priv, pub = pem_rsa_keypair(tmp_path)
    store, internal = store_program(tmp_path)
    setup_port, port = free_port(), free_port()
    setup = proxy_program(tmp_path, internal, f"http://127.0.0.1:{setup_port}", name="setup-proxy")
    token_file = tmp_path / "token"
    token_file.write_text("not.yet.minted\n")
    with store, setup:
        admin = f"127.0.0.1:{setup_port}"
        wait_serving(admin)
        enable_auth(admin)

        def mint() -> None:
            with grpc.insecure_channel(admin) as channel:
                status = rpc_pb2_grpc.AuthStub(channel).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)
            claims = {"username": "alice", "revision": status.authRevision, "exp": int(time.time()) + 600}
            tmp = tmp_path / "token.tmp"
            tmp.write_text(pyjwt.encode(claims, priv.read_bytes(), algorithm="RS256"))
            os.replace(tmp, token_file)

        mint()
        proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}", "--identity-jwt-file", str(token_file),
                              "--auth-token", f"jwt,pub-key={pub},sign-method=RS256")
        with proxy:
            ep = f"127.0.0.1:{port}"
            wait_serving(ep)
            assert ok(ep, "put", "/app/k", "v") == "OK\n"
            assert fails(ep, "put", "/other", "x") == DENIED
            ok(admin, "role", "add", "unrelated", user=ROOT)
            # Nothing newer to lend: the refusal reaches the client (etcdctl prints its raw status).
            assert fails(ep, "get", "/app/k").endswith("etcdserver: revision of auth store is old\n")
            mint()
            assert ok(ep, "get", "/app/k", "--print-value-only") == "v\n"
