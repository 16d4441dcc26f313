"""TLS on the client port, in process: the flags (proxy and local), certificate rotation while the
server runs, and the CN identity the proxy stamps (with the store's auth revision, re-read when
the store says it is old)."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import raft_internal_pb2, rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2, store_pb2_grpc
from proxy import config as proxy_config
from proxy.config import ConfigError, load
from proxy.server import ProxyServer
from proxy.tls import ClientTLS, ServerTLS, common_name
from raftgate import local
from raftgate.errors import Err
from raftgate.secret_proof import INTERNAL, Challenges, ProofCheck
from tests.support.processes import write_test_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_test_pki(tmp_path_factory.mktemp("pki"), ["alice", "other"])


@pytest.fixture
def secret(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_text("dev-secret\n")
    return str(path)


def base(secret: str, *more: str) -> list[str]:
    return ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}", *more]


def tls_args(pki: dict[str, Path]) -> list[str]:
    return [f"--cert-file={pki['server.crt']}", f"--key-file={pki['server.key']}"]


# --- flags -------------------------------------------------------------------------------------


def test_https_urls_are_served_with_the_certificate(secret: str, pki: dict[str, Path]) -> None:
    cfg = load(base(secret, "--listen-client-urls=https://127.0.0.1:1,http://127.0.0.1:2", *tls_args(pki),
                    f"--trusted-ca-file={pki['ca']}", "--client-cert-auth"), env={})
    assert cfg.listen == ("127.0.0.1:1", "127.0.0.1:2") and cfg.tls_listen == ("127.0.0.1:1",)
    assert cfg.client_tls == ClientTLS(str(pki["server.crt"]), str(pki["server.key"]), str(pki["ca"]), True)
    assert cfg.client_tls.require_client_certificate
    # a CA without --client-cert-auth: certificates are still required, the CN is not used
    cfg = load(base(secret, "--listen-client-urls=https://127.0.0.1:1", *tls_args(pki),
                    f"--trusted-ca-file={pki['ca']}"), env={})
    assert cfg.client_tls is not None and cfg.client_tls.require_client_certificate
    assert not cfg.client_tls.client_cert_auth
    assert load(base(secret), env={}).client_tls is None


def test_the_flags_come_from_the_environment_too(secret: str, pki: dict[str, Path]) -> None:
    env = {"RAFTGATE_PROXY_LISTEN_CLIENT_URLS": "https://127.0.0.1:1",
           "RAFTGATE_PROXY_CERT_FILE": str(pki["server.crt"]),
           "RAFTGATE_PROXY_KEY_FILE": str(pki["server.key"]), "RAFTGATE_PROXY_TRUSTED_CA_FILE": str(pki["ca"]),
           "RAFTGATE_PROXY_CLIENT_CERT_AUTH": "true"}
    cfg = load(base(secret), env=env)
    assert cfg.client_tls is not None and cfg.client_tls.client_cert_auth and cfg.tls_listen == ("127.0.0.1:1",)
    assert not load(base(secret, "--client-cert-auth=false"), env=env).client_tls.client_cert_auth  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"RAFTGATE_PROXY_CLIENT_CERT_AUTH: 'maybe' .*--client-cert-auth"):
        load(base(secret), env=env | {"RAFTGATE_PROXY_CLIENT_CERT_AUTH": "maybe"})


@pytest.mark.parametrize("case, needle", [
    ("https-alone", "--listen-client-urls: https:// needs --cert-file and --key-file"),
    ("cert-alone", "--key-file is required with --cert-file"),
    ("ca-alone", "--cert-file is required with --trusted-ca-file"),
    ("cert-auth-without-ca", "--client-cert-auth needs --trusted-ca-file"),
    ("missing-cert", "--cert-file: cannot read"),
    ("missing-ca", "--trusted-ca-file: cannot read"),
    ("other-key", "--key-file: the key does not match the certificate of --cert-file"),
    ("not-pem", "--cert-file/--key-file: not a PEM certificate"),
    ("ca-not-pem", "--trusted-ca-file:"),
])
def test_bad_combinations_name_the_flag(secret: str, pki: dict[str, Path], tmp_path: Path, case: str,
                                        needle: str) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    https = "--listen-client-urls=https://127.0.0.1:1"
    args = {
        "https-alone": [https],
        "cert-alone": [https, f"--cert-file={pki['server.crt']}"],
        "ca-alone": [f"--trusted-ca-file={pki['ca']}"],
        "cert-auth-without-ca": [https, *tls_args(pki), "--client-cert-auth"],
        "missing-cert": [https, f"--cert-file={tmp_path / 'none'}", f"--key-file={pki['server.key']}"],
        "missing-ca": [https, *tls_args(pki), f"--trusted-ca-file={tmp_path / 'none'}"],
        "other-key": [https, f"--cert-file={pki['server.crt']}", f"--key-file={pki['alice.key']}"],
        "not-pem": [https, f"--cert-file={junk}", f"--key-file={pki['server.key']}"],
        "ca-not-pem": [https, *tls_args(pki), f"--trusted-ca-file={junk}"],
    }[case]
    with pytest.raises(ConfigError) as e:
        load(base(secret, *args), env={})
    assert needle in str(e.value)


def test_local_serves_https_with_the_certificate(pki: dict[str, Path]) -> None:
    a = local.parse(["--cert-file", str(pki["server.crt"]), "--key-file", str(pki["server.key"]),
                     "--trusted-ca-file", str(pki["ca"]), "--client-cert-auth"], {})
    assert a.tls and a.scheme == "https"
    assert dict(a.proxy_flags) == {"cert_file": str(pki["server.crt"]), "key_file": str(pki["server.key"]),
                                   "trusted_ca_file": str(pki["ca"]), "client_cert_auth": "true"}
    assert local.parse([], {"RAFTGATE_PROXY_CERT_FILE": str(pki["server.crt"])}).scheme == "https"
    assert local.parse([], {}).scheme == "http"


# --- rotation ----------------------------------------------------------------------------------


def _swap(directory: Path, version: str, files: dict[str, bytes]) -> None:
    """cert-manager's (kubelet's) atomic update: a new ``..data`` symlink replaces the old one."""
    target = directory / version
    target.mkdir()
    for name, data in files.items():
        (target / name).write_bytes(data)
    staged = directory / "..data_tmp"
    staged.symlink_to(version)
    os.replace(staged, directory / "..data")


def _peer_certificate(port: int, pki: dict[str, Path], cn: str) -> bytes:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    context.load_cert_chain(pki[f"{cn}.crt"], pki[f"{cn}.key"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der).encode()


def _whoami(channel: grpc.Channel) -> str:
    return channel.unary_unary("/test.T/WhoAmI")(b"", timeout=10).decode()


def test_rotated_certificate_and_ca_are_taken_by_new_connections(tmp_path: Path) -> None:
    old = write_test_pki(tmp_path / "old", ["alice"])
    new = write_test_pki(tmp_path / "new", ["alice"], ca_name="rotated-ca")
    mounted = tmp_path / "mounted"
    mounted.mkdir()

    def files(p: dict[str, Path]) -> dict[str, bytes]:
        return {"tls.crt": p["server.crt"].read_bytes(), "tls.key": p["server.key"].read_bytes(),
                "ca.crt": p["ca"].read_bytes()}

    _swap(mounted, "..v1", files(old))
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (mounted / name).symlink_to(f"..data/{name}")
    tls = ServerTLS(ClientTLS(str(mounted / "tls.crt"), str(mounted / "tls.key"), str(mounted / "ca.crt"), True))

    def whoami(request: bytes, context: grpc.ServicerContext) -> bytes:
        return (common_name(context.auth_context()) or "").encode()

    handler = grpc.method_handlers_generic_handler("test.T", {"WhoAmI": grpc.unary_unary_rpc_method_handler(whoami)})
    server = grpc.server(ThreadPoolExecutor(2), handlers=[handler])
    port = server.add_secure_port("127.0.0.1:0", tls.credentials())
    server.start()

    def channel(p: dict[str, Path]) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(p["ca"].read_bytes(), p["alice.key"].read_bytes(),
                                             p["alice.crt"].read_bytes())
        return grpc.secure_channel(f"127.0.0.1:{port}", creds)

    try:
        before = channel(old)
        assert _whoami(before) == "alice"
        assert _peer_certificate(port, old, "alice") == old["server.crt"].read_bytes()
        _swap(mounted, "..v2", files(new))
        # a new connection: the new server certificate, clients of the new CA only
        assert _peer_certificate(port, new, "alice") == new["server.crt"].read_bytes()
        assert tls.reloads == 1
        with channel(new) as after:
            assert _whoami(after) == "alice"
        with pytest.raises(ssl.SSLError):
            _peer_certificate(port, old, "alice")  # the old CA no longer verifies the server
        # the server kept running: the connection made before the rotation still works
        assert _whoami(before) == "alice"
        before.close()
        # a half-done rotation (a key that does not match) keeps the current files
        broken = files(old) | {"tls.crt": new["server.crt"].read_bytes()}
        _swap(mounted, "..v3", broken)
        assert _peer_certificate(port, new, "alice") == new["server.crt"].read_bytes()
        assert tls.reloads == 1
    finally:
        server.stop(0)


# --- the CN identity through the proxy ---------------------------------------------------------


class _Refused(Exception):
    def __init__(self, err: Err) -> None:
        super().__init__(err.message)
        self.err = err


class MiniStore(store_pb2_grpc.StoreServicer):
    """The store's Do contract for AuthStatus, Range and Authenticate's Credentials, with an auth revision."""

    def __init__(self) -> None:
        self.revision = 5
        self.headers: list[raft_internal_pb2.RequestHeader] = []
        self.status_calls = 0

    def do(self, request: raft_internal_pb2.InternalRaftRequest) -> store_pb2.InternalResponse:
        if request.HasField("auth_status"):
            self.status_calls += 1
            return store_pb2.InternalResponse(auth_status=rpc_pb2.AuthStatusResponse(enabled=True,
                                                                                     authRevision=self.revision))
        h = request.header
        self.headers.append(h)
        if h.invalid_token:
            raise _Refused(Err.INVALID_AUTH_TOKEN)
        if not h.username:
            raise _Refused(Err.USER_EMPTY)
        if h.auth_revision < self.revision:
            raise _Refused(Err.AUTH_OLD_REVISION)
        kv = {"key": request.range.key, "value": h.username.encode()}
        return store_pb2.InternalResponse(range=rpc_pb2.RangeResponse(kvs=[kv], count=1))

    async def DoStream(self, batches: AsyncIterator[store_pb2.DoBatch], context: Any) -> AsyncIterator[Any]:
        await context.send_initial_metadata(())
        async for batch in batches:
            results = []
            for call in batch.calls:
                if call.method == store_pb2.DoCall.RESOLVE_TOKEN:
                    answer: Any = store_pb2.ResolveTokenResponse(auth_enabled=True, auth_revision=self.revision)
                    results.append(store_pb2.DoResult(id=call.id, response=answer.SerializeToString()))
                    continue
                try:
                    answer = self.do(raft_internal_pb2.InternalRaftRequest.FromString(call.request))
                    results.append(store_pb2.DoResult(id=call.id, response=answer.SerializeToString()))
                except _Refused as e:
                    results.append(store_pb2.DoResult(id=call.id, code=e.err.code.value[0], message=e.err.message))
            yield store_pb2.DoResultBatch(results=results)


Scenario = Callable[[MiniStore, rpc_pb2_grpc.KVStub], Awaitable[None]]


def _through_proxy(tmp_path: Path, pki: dict[str, Path], extra: list[str], scenario: Scenario,
                   cn: str | None = "alice") -> None:
    """A ProxyServer on an https:// URL in front of MiniStore; ``scenario`` gets a KV stub of a TLS
    channel with ``cn``'s certificate (None: no certificate)."""
    async def main() -> None:
        store = MiniStore()
        store_server = grpc.aio.server(interceptors=[ProofCheck(Challenges(INTERNAL, (b"s3cret",)), "no")])
        store_pb2_grpc.add_StoreServicer_to_server(store, store_server)
        store_port = store_server.add_insecure_port("127.0.0.1:0")
        await store_server.start()
        secret = tmp_path / "secret"
        secret.write_text("s3cret\n")
        cfg = proxy_config.load([
            "--listen-client-urls=https://127.0.0.1:0", f"--store-endpoints=127.0.0.1:{store_port}",
            f"--internal-secret-file={secret}", *tls_args(pki), f"--trusted-ca-file={pki['ca']}",
            "--bcrypt-cost=4", "--bcrypt-workers=1", *extra,
        ], env={})
        proxy = ProxyServer(cfg)
        (address,) = await proxy.start()
        key = pki[f"{cn}.key"].read_bytes() if cn else None
        cert = pki[f"{cn}.crt"].read_bytes() if cn else None
        channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(pki["ca"].read_bytes(), key, cert))
        try:
            await scenario(store, rpc_pb2_grpc.KVStub(channel))
        finally:
            await channel.close()
            await proxy.stop(0)
            await store_server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_the_cn_is_the_user_only_without_a_token(tmp_path: Path, pki: dict[str, Path]) -> None:
    async def scenario(store: MiniStore, kv: rpc_pb2_grpc.KVStub) -> None:
        answer = await kv.Range(rpc_pb2.RangeRequest(key=b"k"))
        assert answer.kvs[0].value == b"alice"
        assert (store.headers[-1].username, store.headers[-1].auth_revision) == ("alice", 5)
        await kv.Range(rpc_pb2.RangeRequest(key=b"k"))
        assert store.status_calls == 1  # the revision is kept: no round trip per request
        store.revision = 6  # an auth change: the store refuses the kept revision as old, the proxy retries
        await kv.Range(rpc_pb2.RangeRequest(key=b"k"))
        assert [h.auth_revision for h in store.headers[-2:]] == [5, 6] and store.status_calls == 2
        # a token, even a bad one, wins over the certificate
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=(("token", "junk"),))
        assert (e.value.code(), e.value.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)
        assert store.headers[-1].username == ""

    _through_proxy(tmp_path, pki, ["--client-cert-auth"], scenario)


def test_a_ca_without_client_cert_auth_requires_a_certificate_and_ignores_its_cn(
        tmp_path: Path, pki: dict[str, Path]) -> None:
    """etcd 3.5.1's answers (tests/conformance/test_client_cert_auth.py measures them)."""
    async def ignored(store: MiniStore, kv: rpc_pb2_grpc.KVStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Range(rpc_pb2.RangeRequest(key=b"k"))
        assert (e.value.code(), e.value.details()) == (Err.USER_EMPTY.code, Err.USER_EMPTY.message)

    async def refused(store: MiniStore, kv: rpc_pb2_grpc.KVStub) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Range(rpc_pb2.RangeRequest(key=b"k"), timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert store.headers == []

    _through_proxy(tmp_path, pki, [], ignored)
    _through_proxy(tmp_path, pki, [], refused, cn=None)
