"""TLS on the client port and certificate CN auth, side by side: etcdctl 3.5.1 with
``--cacert/--cert/--key`` against a real etcd 3.5.1 and ``raftgate local --nodes 1`` started with
the same flags (``--cert-file --key-file --trusted-ca-file --client-cert-auth``) and the same
certificates (made here).

Both servers get the same steps; every answer (exit code, stdout, stderr without etcdctl's own
log lines, or a gRPC code and message) must be the same. One server per backend per module.
"""

from __future__ import annotations

import queue
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.ctl_steps import strip_client_logs
from tests.support.processes import (
    BACKENDS,
    etcdctl,
    skip_unless_available,
    write_test_pki,
)
from tests.support.tls_servers import TLSEtcd, TLSRaftgate, ctl_env

pytestmark = pytest.mark.slow

CLIENTS = ("alice", "bob", "mallory", "root")
ROOT = "root:rootpw"


class Side:
    """One backend: runs etcdctl with a chosen client certificate and keeps the answers."""

    def __init__(self, server: TLSEtcd | TLSRaftgate, pki: dict[str, Path]) -> None:
        self.server = server
        self.pki = pki

    def ctl(self, cn: str | None, *args: str, user: str | None = None, endpoint: str | None = None,
            dial_timeout: str = "5s") -> tuple[int, str, str]:
        rc, out, err = etcdctl(endpoint or self.server.endpoint, *args, user=user, env=ctl_env(self.pki, cn),
                               dial_timeout=dial_timeout)
        return rc, out, strip_client_logs(err)

    def address(self) -> tuple[str, int]:
        host, port = self.server.endpoint.removeprefix("https://").rsplit(":", 1)
        return host, int(port)

    def grpc(self, cn: str | None, call: str, request: object, token: str | None = None) -> tuple[str, str]:
        """One unary call on a TLS channel with ``cn``'s certificate: (code name, message)."""
        key = self.pki[f"{cn}.key"].read_bytes() if cn else None
        cert = self.pki[f"{cn}.crt"].read_bytes() if cn else None
        creds = grpc.ssl_channel_credentials(self.pki["ca"].read_bytes(), key, cert)
        target = self.server.endpoint.removeprefix("https://")
        with grpc.secure_channel(target, creds) as channel:
            service, method = call.split(".")
            stub = getattr(rpc_pb2_grpc, f"{service}Stub")(channel)
            try:
                getattr(stub, method)(request, timeout=10, metadata=[("token", token)] if token is not None else None)
            except grpc.RpcError as e:
                return e.code().name, e.details() or ""
            return "OK", ""

    def watch(self, cn: str, key: bytes) -> tuple[bool, bool, str]:
        """One watch create on a TLS stream with ``cn``'s certificate: (created, canceled, reason)."""
        creds = grpc.ssl_channel_credentials(self.pki["ca"].read_bytes(), self.pki[f"{cn}.key"].read_bytes(),
                                             self.pki[f"{cn}.crt"].read_bytes())
        with grpc.secure_channel(self.server.endpoint.removeprefix("https://"), creds) as channel:
            create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key))
            stream = rpc_pb2_grpc.WatchStub(channel).Watch(iter([create]), timeout=10)
            first = next(stream)
            stream.cancel()
            return first.created, first.canceled, first.cancel_reason


@pytest.fixture(scope="module", params=BACKENDS)
def side(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    skip_unless_available(request.param)
    work = tmp_path_factory.mktemp(f"tls-{request.param}")
    pki = write_test_pki(work / "pki", CLIENTS)
    server = TLSEtcd(work, pki) if request.param == "etcd" else TLSRaftgate(work, pki)
    server.start()
    s = Side(server, pki)
    for step in (("user", "add", ROOT), ("auth", "enable")):
        assert s.ctl("root", *step)[0] == 0, step
    for step in (("role", "add", "reader"), ("role", "grant-permission", "reader", "read", "allowed/", "--prefix"),
                 ("user", "add", "alice", "--no-password"), ("user", "grant-role", "alice", "reader"),
                 ("user", "add", "bob:bobpw"), ("put", "allowed/k", "v1"), ("put", "denied/k", "v2")):
        assert s.ctl("root", *step, user=ROOT)[0] == 0, step
    yield s
    server.stop()


# Every expected answer below is what etcd 3.5.1 answers: the etcd run asserts it, the raftgate
# run must answer the same.

DENIED = "Error: etcdserver: permission denied\n"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_cn_user_reads_what_its_roles_allow(side: Side) -> None:
    assert side.ctl("alice", "get", "allowed/k") == (0, "allowed/k\nv1\n", "")
    assert side.ctl("alice", "get", "denied/k") == (1, "", DENIED)
    assert side.ctl("alice", "put", "allowed/k", "x") == (1, "", DENIED)
    # root's certificate is root: the CN names the user, no password needed
    assert side.ctl("root", "get", "denied/k") == (0, "denied/k\nv2\n", "")


def test_watches_use_the_cn(side: Side) -> None:
    assert side.watch("alice", b"allowed/k") == (True, False, "")
    assert side.watch("alice", b"denied/k") == (True, True, "rpc error: code = PermissionDenied desc = "
                                                            "etcdserver: permission denied")
    assert side.watch("mallory", b"allowed/k")[1]


def test_unknown_cn_is_permission_denied(side: Side) -> None:
    assert side.ctl("mallory", "get", "allowed/k") == (1, "", DENIED)
    assert side.ctl("root", "user", "get", "mallory") == (1, "", "Error: etcdserver: user name not found\n")


def test_token_beats_the_certificate(side: Side) -> None:
    # alice's certificate, bob's password: bob (no role) is the caller
    assert side.ctl("alice", "get", "allowed/k", user="bob:bobpw") == (1, "", DENIED)
    # mallory's certificate, root's password: root
    assert side.ctl("mallory", "get", "denied/k", user=ROOT) == (0, "denied/k\nv2\n", "")


def test_bad_token_with_a_certificate_is_invalid_never_the_cn(side: Side) -> None:
    request = rpc_pb2.RangeRequest(key=b"allowed/k")
    assert side.grpc("root", "KV.Range", request, token="not-a-token") == (
        "UNAUTHENTICATED", "etcdserver: invalid auth token")
    assert side.grpc("alice", "KV.Range", request) == ("OK", "")
    assert side.grpc("mallory", "KV.Range", request) == ("PERMISSION_DENIED", "etcdserver: permission denied")


def test_no_password_user_cannot_authenticate_with_a_password(side: Side) -> None:
    request = rpc_pb2.AuthenticateRequest(name="alice", password="anything")
    assert side.grpc("alice", "Auth.Authenticate", request) == (
        "UNKNOWN", "auth: authentication failed, password was given for no password user")
    assert side.ctl("alice", "get", "allowed/k", user="alice:anything") == (2, "", (
        "Error: rpc error: code = Unknown desc = auth: authentication failed, password was given for no password "
        "user\n"))


def test_no_client_certificate_fails_the_handshake(side: Side) -> None:
    """etcd (Go) answers the certificate-less handshake with a `bad certificate` alert; grpc-core
    (BoringSSL) closes the connection without an alert. Either way the client gets no byte of
    service: etcdctl's answer is `context deadline exceeded` from both (checked by hand; 5 s of
    dial timeout per run is left out here). TLS 1.2: etcd 3.5.1 refuses 1.3 (`protocol version`)."""
    assert side.grpc(None, "KV.Range", rpc_pb2.RangeRequest(key=b"allowed/k"))[0] == "UNAVAILABLE"
    context = ssl.create_default_context(cafile=str(side.pki["ca"]))
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    with socket.create_connection(side.address(), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                conn.sendall(HTTP2_PREFACE)
                got = conn.recv(4096)
        except ssl.SSLError as e:
            got = b""
            assert isinstance(side.server, TLSRaftgate) or "BAD_CERTIFICATE" in str(e), e
    assert got == b""


def test_plaintext_to_the_tls_port_gets_nothing(side: Side) -> None:
    """An HTTP/2 client without TLS: the server closes without answering a byte."""
    with socket.create_connection(side.address(), timeout=10) as conn:
        conn.sendall(HTTP2_PREFACE)
        got = b""
        while chunk := conn.recv(4096):
            got += chunk
    assert got == b""


def test_a_watch_by_cn_is_rechecked_when_its_permission_goes(side: Side) -> None:
    """raftgate re-checks open watches on every auth change (etcd checks only at creation, see
    docs/watch.md): a CN identity is re-checked like a token's."""
    if isinstance(side.server, TLSEtcd):
        pytest.skip("etcd 3.5.1 checks a watch only when it is created")
    assert side.ctl("root", "role", "add", "watcher", user=ROOT)[0] == 0
    assert side.ctl("root", "role", "grant-permission", "watcher", "read", "watched", user=ROOT)[0] == 0
    assert side.ctl("root", "user", "grant-role", "bob", "watcher", user=ROOT)[0] == 0
    creds = grpc.ssl_channel_credentials(side.pki["ca"].read_bytes(), side.pki["bob.key"].read_bytes(),
                                         side.pki["bob.crt"].read_bytes())
    with grpc.secure_channel(side.server.endpoint.removeprefix("https://"), creds) as channel:
        create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"watched"))
        requests: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        requests.put(create)
        stream = rpc_pb2_grpc.WatchStub(channel).Watch(iter(requests.get, None), timeout=30)
        try:
            first = next(stream)
            assert first.created and not first.canceled
            assert side.ctl("root", "role", "revoke-permission", "watcher", "watched", user=ROOT)[0] == 0
            gone = next(stream)
            assert (gone.canceled, gone.cancel_reason) == (
                True, "rpc error: code = PermissionDenied desc = etcdserver: permission denied")
        finally:
            requests.put(None)
            stream.cancel()


def test_a_ca_without_client_cert_auth_requires_a_certificate_and_ignores_its_cn(
        tmp_path: Path) -> None:
    """etcd 3.5.1 measured: with --trusted-ca-file alone a client certificate is required (TLS
    handshake) but its CN names nobody. raftgate's side: tests/unit/test_client_tls.py."""
    skip_unless_available("etcd")
    pki = write_test_pki(tmp_path / "pki", CLIENTS)
    server = TLSEtcd(tmp_path, pki)
    server.extra_args.remove("--client-cert-auth")
    server.start()
    try:
        s = Side(server, pki)
        assert s.ctl("root", "user", "add", ROOT)[0] == 0
        assert s.ctl("root", "auth", "enable")[0] == 0
        assert s.ctl("root", "get", "k") == (1, "", "Error: etcdserver: user name is empty\n")
        assert s.ctl("root", "get", "k", user=ROOT) == (0, "", "")
        assert s.grpc(None, "KV.Range", rpc_pb2.RangeRequest(key=b"k"))[0] == "UNAVAILABLE"
    finally:
        server.stop()
