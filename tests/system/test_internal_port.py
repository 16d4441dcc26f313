"""The store trusts a RequestHeader only from an authenticated proxy: mTLS or an explicit secret."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from raftgate.secret_proof import proving_channel
from tests.support.processes import SECRET, Program, etcdctl, free_port


def _do(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] | None = None) -> store_pb2.InternalResponse:
    call = channel.unary_unary("/raftgate.storepb.Store/Do",
                               request_serializer=ipb.InternalRaftRequest.SerializeToString,
                               response_deserializer=store_pb2.InternalResponse.FromString)
    req = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root", auth_revision=1),
                                  auth_status=rpc_pb2.AuthStatusRequest())
    return call(req, metadata=metadata, timeout=10)


def _do_stream(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] | None = None) -> list[store_pb2.DoResult]:
    """Two calls in one batch on the proxies' stream; their results, in id order."""
    call = channel.stream_stream("/raftgate.storepb.Store/DoStream",
                                 request_serializer=store_pb2.DoBatch.SerializeToString,
                                 response_deserializer=store_pb2.DoResultBatch.FromString)
    status = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root", auth_revision=1),
                                     auth_status=rpc_pb2.AuthStatusRequest()).SerializeToString()
    empty_key = ipb.InternalRaftRequest(range=rpc_pb2.RangeRequest()).SerializeToString()
    batch = store_pb2.DoBatch(calls=[store_pb2.DoCall(id=1, request=status),
                                     store_pb2.DoCall(id=2, request=empty_key)])
    results: list[store_pb2.DoResult] = []
    for answer in call(iter([batch]), metadata=metadata, timeout=10):
        results.extend(answer.results)
    return sorted(results, key=lambda r: r.id)


@pytest.fixture
def secret_store(tmp_path: Path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    port = free_port()
    store = Program(tmp_path / "store", ["store", "--data-dir", str(tmp_path / "data"), "--listen-internal-urls",
                                         f"http://127.0.0.1:{port}", "--internal-secret-file", str(secret),
                                         *_peer_flags(secret)], "raftgate store:")
    store.start()
    yield f"127.0.0.1:{port}"
    store.stop()


def test_internal_port_refuses_callers_without_the_secret(secret_store: str) -> None:
    with grpc.insecure_channel(secret_store) as channel:
        # no credential, the secret itself (it is proven, never sent), a proof of another secret
        for caller, metadata in ((channel, None), (channel, (("x-raftgate-internal-secret", SECRET),)),
                                 (proving_channel(channel, "wrong-secret-0123456789"), None)):
            with pytest.raises(grpc.RpcError) as err:
                _do(caller, metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as err:
                _do_stream(caller, metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        proven = proving_channel(channel, SECRET)
        answer = _do(proven)
        assert answer.auth_status.authRevision == 1
        ok, refused = _do_stream(proven)
        answer = store_pb2.InternalResponse.FromString(ok.response)
        assert ok.code == 0 and answer.auth_status.authRevision == 1
        assert (refused.code, refused.message) == (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                   "etcdserver: key is not provided")
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes need no credentials


def _peer_flags(secret: Path) -> list[str]:
    peer = f"http://127.0.0.1:{free_port()}"
    return ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--peer-secret-file", str(secret)]


def test_store_will_not_start_unauthenticated(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    store = Program(tmp_path, ["store", "--data-dir", str(tmp_path / "data"), "--listen-internal-urls",
                               f"http://127.0.0.1:{free_port()}", *_peer_flags(secret)], "raftgate store:")
    with pytest.raises(RuntimeError, match="exited with 2"):
        store.start(timeout=30)
    assert "the internal port must be authenticated" in store.output()


def _cert(name: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
          *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_pki(d: Path) -> dict[str, Path]:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftgate test CA")])
    ca = _cert("raftgate test CA", ca_key, ca_name, ca_key, ca=True)
    files = {"ca": d / "ca.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for who in ("store", "proxy"):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert(who, key, ca_name, ca_key, ca=False)
        files[who + "_cert"] = d / f"{who}.pem"
        files[who + "_key"] = d / f"{who}-key.pem"
        files[who + "_cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[who + "_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    # sidecars' certificates come from a CA of their own (THREAT_MODEL.md)
    sidecar_ca_key = ec.generate_private_key(ec.SECP256R1())
    sidecar_ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "raftgate test sidecar CA")])
    sidecar_ca = _cert("raftgate test sidecar CA", sidecar_ca_key, sidecar_ca_name, sidecar_ca_key, ca=True)
    files["sidecar_ca"] = d / "sidecar-ca.pem"
    files["sidecar_ca"].write_bytes(sidecar_ca.public_bytes(serialization.Encoding.PEM))
    key = ec.generate_private_key(ec.SECP256R1())
    files["sidecar_cert"], files["sidecar_key"] = d / "sidecar.pem", d / "sidecar-key.pem"
    files["sidecar_cert"].write_bytes(_cert("sidecar", key, sidecar_ca_name, sidecar_ca_key, ca=False)
                                      .public_bytes(serialization.Encoding.PEM))
    files["sidecar_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return files


def _credentials_call(channel: grpc.Channel) -> grpc.StatusCode:
    call = channel.unary_unary("/raftgate.storepb.Store/Credentials",
                               request_serializer=store_pb2.CredentialsRequest.SerializeToString,
                               response_deserializer=store_pb2.CredentialsResponse.FromString)
    try:
        call(store_pb2.CredentialsRequest(name="root"), timeout=10)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_mtls_between_proxy_and_store(tmp_path: Path) -> None:
    pki = _write_pki(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    store_port, client_port = free_port(), free_port()
    store = Program(tmp_path / "s", ["store", "--data-dir", str(tmp_path / "data"),
                                     "--listen-internal-urls", f"https://127.0.0.1:{store_port}",
                                     "--cert-file", str(pki["store_cert"]), "--key-file", str(pki["store_key"]),
                                     "--trusted-ca-file", str(pki["ca"]), "--sidecar-trusted-ca-file",
                                     str(pki["sidecar_ca"]), *_peer_flags(secret)], "raftgate store:")
    proxy = Program(tmp_path / "p", ["proxy", "--listen-client-urls", f"http://127.0.0.1:{client_port}",
                                     "--store-endpoints", f"127.0.0.1:{store_port}",
                                     "--internal-cert", str(pki["proxy_cert"]), "--internal-key",
                                     str(pki["proxy_key"]), "--internal-ca", str(pki["ca"])], "raftgate proxy:")
    with store, proxy:
        endpoint = f"127.0.0.1:{client_port}"
        assert etcdctl(endpoint, "put", "k", "v")[0] == 0
        assert etcdctl(endpoint, "get", "k", "--print-value-only") == (0, "v\n", "")
        # Without a client certificate the store does not even complete the handshake.
        creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{store_port}", creds) as channel, pytest.raises(grpc.RpcError) as err:
            _do(channel)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # A sidecar CA's certificate is accepted, with a sidecar's powers only: no password hashes.
        for who, code in (("proxy", grpc.StatusCode.OK), ("sidecar", grpc.StatusCode.PERMISSION_DENIED)):
            creds = grpc.ssl_channel_credentials(root_certificates=pki["ca"].read_bytes(),
                                                 private_key=pki[f"{who}_key"].read_bytes(),
                                                 certificate_chain=pki[f"{who}_cert"].read_bytes())
            with grpc.secure_channel(f"127.0.0.1:{store_port}", creds) as channel:
                assert _credentials_call(channel) == code, who
