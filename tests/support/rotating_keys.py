"""A store whose keys rotate under a central proxy and a sidecar: the set-up of the leaked-key tests.

One store verifies what sidecars forward (etcd JWTs with its key files, workload tokens with a
JWKS file and a user map); a central proxy reads the same files; a ``--sidecar`` proxy proves the
sidecar secret. Users: root, and ``app`` with READ on ``app/``; auth is on. The files are swapped
as Kubernetes swaps a Secret or ConfigMap volume (a new inode), so a test rotates a key by
writing it with ``jwt_files`` or ``swap``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.oidc_issuer import AUDIENCE
from tests.support.processes import Program, free_port, proxy_program, stop_together, store_program, wait_serving

SIDECAR_SECRET = "sidecar-secret-for-tests-0123456789"
ISSUER = "https://issuer.invalid"
RULES = [{"match": "system:serviceaccount:shop:*", "user": "app"}]
#: the retirement TTL of a rotated-out etcd JWT key
TTL = "3s"


@dataclass
class Cluster:
    work: Path
    #: the store's internal address
    store: str
    central: grpc.Channel
    sidecar: grpc.Channel


def swap(path: Path, data: bytes) -> None:
    """A new inode, as Kubernetes swaps a Secret or ConfigMap volume."""
    tmp = path.with_name(path.name + ".swap")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def jwt_files(work: Path, key: Any) -> None:
    """Makes ``key`` the etcd JWT key in force (private and public files)."""
    swap(work / "jwt.key", key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    swap(work / "jwt.pub", key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))


@contextlib.contextmanager
def rotating_key_cluster(work: Path, workload_keys: list[dict[str, Any]]) -> Iterator[Cluster]:
    """The store, the central proxy and the sidecar, with ``workload_keys`` (JWKs) in the issuer's
    JWKS file; every process stopped and channel closed on the way out."""
    jwt_files(work, ec.generate_private_key(ec.SECP256R1()))
    (work / "sidecar-secret").write_text(SIDECAR_SECRET)
    (work / "jwks.json").write_text(json.dumps({"keys": workload_keys}))
    (work / "user-map.json").write_text(json.dumps(RULES))
    jwt = f"jwt,pub-key={work / 'jwt.pub'},priv-key={work / 'jwt.key'},sign-method=ES256,ttl={TTL}"
    oidc = ["--oidc-issuer", ISSUER, "--oidc-audience", AUDIENCE, "--oidc-jwks-file", str(work / "jwks.json"),
            "--oidc-user-map", str(work / "user-map.json")]
    store, internal = store_program(work, "--sidecar-secret-file", str(work / "sidecar-secret"),
                                    "--auth-token", jwt, "--bcrypt-cost", "4", *oidc)
    started: list[Program] = []
    channels: list[grpc.Channel] = []
    try:
        store.start()
        started.append(store)
        central_port, sidecar_port = free_port(), free_port()
        central = proxy_program(work, internal, f"http://127.0.0.1:{central_port}", "--auth-token", jwt, *oidc)
        central.start()
        started.append(central)
        sidecar = Program(work / "sidecar", [
            "proxy", "--sidecar", "--listen-client-urls", f"http://127.0.0.1:{sidecar_port}", "--store-endpoints",
            internal, "--internal-secret-file", str(work / "sidecar-secret")], "raftgate proxy:")
        sidecar.start()
        started.append(sidecar)
        wait_serving(f"127.0.0.1:{central_port}")
        wait_serving(f"127.0.0.1:{sidecar_port}")
        c = grpc.insecure_channel(f"127.0.0.1:{central_port}")
        sc = grpc.insecure_channel(f"127.0.0.1:{sidecar_port}")
        channels += [c, sc]
        auth = rpc_pb2_grpc.AuthStub(c)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="app", password="apppw"), timeout=10)
        auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="app"), timeout=10)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=b"app/", range_end=b"app0")
        auth.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm), timeout=10)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="app", role="app"), timeout=10)
        auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=10)
        yield Cluster(work, internal, c, sc)
    finally:
        for ch in channels:
            ch.close()
        stop_together(started)
