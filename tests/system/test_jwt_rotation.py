"""JWT keys that rotate, with real processes: a signing proxy whose key Secret is swapped (as kubelet
does) under a bounded load, and a verify-only proxy following it through ``jwks-url`` (the signer's
``/.well-known/jwks.json`` on its metrics port): no request fails, old and new tokens both verify.
And tokens minted by a real etcd (``--auth-token jwt,...``, no ``kid``) verify with raftgate's key
set, whether ``pub-key`` is the PEM file, a directory or a JWKS file."""

from __future__ import annotations

import base64
import json
import os
import threading
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import rsa

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from proxy.tokens.jwt import JwtProvider
from raftgate.auth_token import jwt_options
from raftgate.jwt_keys import JWKS_PATH, jwk_thumbprint, public_jwk
from tests.support.processes import (
    EtcdServer,
    etcdctl,
    free_port,
    proxy_program,
    store_program,
    wait_for,
    wait_serving,
)

pytestmark = pytest.mark.slow

ROOT = "root:rootpw"
MAX_REQUESTS = 4000  # the load thread's bound (it stops earlier when the test is done)


def _pem(key: Any) -> dict[str, bytes]:
    return {
        "jwt.key": key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()),
        "jwt.pub": key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo),
    }


def secret_volume(root: Path, version: str, files: dict[str, bytes]) -> None:
    """Writes a Secret volume as kubelet does: a new ..<version> dir, then an atomic ..data swap."""
    root.mkdir(exist_ok=True)
    data = root / f"..{version}"
    data.mkdir()
    for name, content in files.items():
        (data / name).write_bytes(content)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    for name in files:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def ctl_ok(endpoint: str, *args: str, user: str | None = None) -> None:
    rc, _, err = etcdctl(endpoint, *args, user=user)
    assert rc == 0, f"etcdctl {' '.join(args)}: {err}"


def enable_auth(endpoint: str) -> None:
    ctl_ok(endpoint, "user", "add", ROOT)
    ctl_ok(endpoint, "user", "add", "alice:alicepw")
    ctl_ok(endpoint, "role", "add", "app")
    ctl_ok(endpoint, "role", "grant-permission", "app", "readwrite", "app/", "--prefix")
    ctl_ok(endpoint, "user", "grant-role", "alice", "app")
    ctl_ok(endpoint, "auth", "enable")


def authenticate(target: str, name: str, password: str) -> str:
    with grpc.insecure_channel(target) as channel:
        return rpc_pb2_grpc.AuthStub(channel).Authenticate(
            rpc_pb2.AuthenticateRequest(name=name, password=password), timeout=10).token


def kid(token: str) -> str | None:
    return json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "==")).get("kid")


def test_rotation_under_load_with_a_verify_only_follower(tmp_path: Path) -> None:
    keys = [rsa.generate_private_key(65537, 2048) for _ in range(2)]
    kids = [jwk_thumbprint(public_jwk(k)) for k in keys]
    secret = tmp_path / "jwt-secret"
    secret_volume(secret, "v1", _pem(keys[0]))
    store, internal = store_program(tmp_path)
    sport, vport, mport = free_port(), free_port(), free_port()
    signer = proxy_program(tmp_path, internal, f"http://127.0.0.1:{sport}", "--metrics-addr", f"127.0.0.1:{mport}",
                           "--auth-token", f"jwt,sign-method=RS256,priv-key={secret}/jwt.key,pub-key={secret}/jwt.pub",
                           name="signer")
    jwks_url = f"http://127.0.0.1:{mport}{JWKS_PATH}"
    verifier = proxy_program(tmp_path, internal, f"http://127.0.0.1:{vport}",
                             "--auth-token", f"jwt,sign-method=RS256,jwks-url={jwks_url}", name="verifier")
    targets = [f"127.0.0.1:{sport}", f"127.0.0.1:{vport}"]
    with store, signer:
        wait_serving(f"http://{targets[0]}")
        enable_auth(f"http://{targets[0]}")
        ctl_ok(f"http://{targets[0]}", "put", "app/k", "v", user="alice:alicepw")
        with verifier:
            tokens = [authenticate(targets[0], "alice", "alicepw")]
            assert kid(tokens[0]) == kids[0]
            failures: list[tuple[str, str]] = []
            served = [0]
            stop = threading.Event()

            def load() -> None:
                """Range calls on both proxies with the newest token, until stopped (bounded)."""
                channels = [grpc.insecure_channel(t) for t in targets]
                try:
                    stubs = [rpc_pb2_grpc.KVStub(c) for c in channels]
                    for _ in range(MAX_REQUESTS):
                        if stop.is_set():
                            return
                        for stub in stubs:
                            try:
                                stub.Range(rpc_pb2.RangeRequest(key=b"app/k"), metadata=(("token", tokens[-1]),),
                                           timeout=30)
                                served[0] += 1
                            except grpc.RpcError as e:
                                failures.append((str(e.code()), e.details() or ""))
                finally:
                    for c in channels:
                        c.close()

            worker = threading.Thread(target=load, daemon=True)
            worker.start()
            try:
                wait_for(lambda: served[0] >= 20 or failures, timeout=60, what="load before the rotation")
                secret_volume(secret, "v2", _pem(keys[1]))  # the key rotates

                def rotated() -> bool:
                    tokens.append(authenticate(targets[0], "alice", "alicepw"))
                    return kid(tokens[-1]) == kids[1]

                wait_for(rotated, timeout=60, what="the signer to sign with the new key", interval=0.2)
                after = served[0]
                wait_for(lambda: served[0] >= after + 40 or failures, timeout=60, what="load with the new token")
            finally:
                stop.set()
                worker.join(timeout=60)
            assert not failures, failures[:5]
            # Both the token from before the rotation and the new one verify on both proxies.
            for target in targets:
                with grpc.insecure_channel(target) as channel:
                    kv = rpc_pb2_grpc.KVStub(channel)
                    for token in (tokens[0], tokens[-1]):
                        got = kv.Range(rpc_pb2.RangeRequest(key=b"app/k"), metadata=(("token", token),), timeout=10)
                        assert [kv_.value for kv_ in got.kvs] == [b"v"]
            with urllib.request.urlopen(jwks_url, timeout=10) as answer:
                published = json.load(answer)
            assert {k["kid"] for k in published["keys"]} == set(kids)  # the old key until its tokens expire
            assert not any("d" in k or "p" in k for k in published["keys"])  # nothing private


def test_tokens_minted_by_real_etcd_verify(tmp_path: Path) -> None:
    """etcd's own tokens have no kid: they verify against the configured keys, in every pub-key form."""
    if not EtcdServer.available():
        pytest.skip("real etcd binary not installed")
    key, other = rsa.generate_private_key(65537, 2048), rsa.generate_private_key(65537, 2048)
    files = _pem(key)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    folder = tmp_path / "pub-dir"
    folder.mkdir()
    (folder / "current.pem").write_bytes(files["jwt.pub"])
    (folder / "next.pem").write_bytes(_pem(other)["jwt.pub"])
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public_jwk(other), "kid": "next"}, {**public_jwk(key), "kid": "now"}]}))
    etcd = EtcdServer(tmp_path / "etcd", extra_args=[
        f"--auth-token=jwt,pub-key={tmp_path}/jwt.pub,priv-key={tmp_path}/jwt.key,sign-method=RS256,ttl=5m"])
    with etcd:
        ctl_ok(etcd.endpoint, "user", "add", ROOT)
        ctl_ok(etcd.endpoint, "auth", "enable")
        token = authenticate(etcd.target, "root", "rootpw")
    assert kid(token) is None
    for pub in (tmp_path / "jwt.pub", folder, jwks):
        provider = JwtProvider.from_options(jwt_options({"sign-method": "RS256", "pub-key": str(pub)}))
        found = provider.verify(token)
        assert found is not None and found.username == "root", pub
    signer = JwtProvider.from_options(jwt_options({"sign-method": "RS256", "pub-key": str(tmp_path / "jwt.pub"),
                                                   "priv-key": str(tmp_path / "jwt.key")}))
    assert signer.verify(token) is not None
