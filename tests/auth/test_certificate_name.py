"""The user a client certificate names (``--client-cert-auth``) must be the one etcd takes from the
same certificate, or a CA whose policy checks one CN and a server that reads another disagree on
who the caller is. Go's x509 (etcd's AuthInfoFromTLS) takes the subject's *last* CN; grpc-core's
``x509_common_name`` is the first one.

Finding: with several CNs the proxy took the first (grpc-core) where etcd takes the last (failed
before the fix).
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from proxy.tls import ClientTLS, ServerTLS, common_name
from tests.support.processes import write_test_pki


def _pki(cns: list[str]) -> dict[str, bytes]:
    """A CA and a client certificate of it whose subject holds ``cns`` in that order (PEM)."""
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "multi-cn-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, cn)]) for cn in cns])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return {"ca": ca.public_bytes(serialization.Encoding.PEM), "crt": cert.public_bytes(serialization.Encoding.PEM),
            "key": key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption())}


def test_the_last_cn_names_the_user_as_in_etcd(tmp_path: Path) -> None:
    """A subject CN=alice, CN=root: etcd's user is root, so raftgate's must be too."""
    server_pki = write_test_pki(tmp_path / "server", [])
    client = _pki(["alice", "root"])
    (tmp_path / "client-ca.crt").write_bytes(client["ca"])
    tls = ServerTLS(ClientTLS(str(server_pki["server.crt"]), str(server_pki["server.key"]),
                              str(tmp_path / "client-ca.crt"), True))

    def whoami(request: bytes, context: grpc.ServicerContext) -> bytes:
        return (common_name(context.auth_context()) or "").encode()

    handler = grpc.method_handlers_generic_handler("test.T", {"WhoAmI": grpc.unary_unary_rpc_method_handler(whoami)})
    server = grpc.server(ThreadPoolExecutor(2), handlers=[handler])
    port = server.add_secure_port("127.0.0.1:0", tls.credentials())
    server.start()
    try:
        creds = grpc.ssl_channel_credentials(server_pki["ca"].read_bytes(), client["key"], client["crt"])
        with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
            assert channel.unary_unary("/test.T/WhoAmI")(b"", timeout=10).decode() == "root"
    finally:
        server.stop(0)
