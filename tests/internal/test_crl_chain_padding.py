"""A revoked intermediate CA stays revoked whatever else its holder puts into the chain it presents.

``--client-crl-file`` may list an intermediate CA (its root's CRL): every certificate it signed is
then refused, which the check finds in the chain the client presented. The client chooses that
chain: beyond the certificates its path needs it may add any the TLS stack parses. One that the
check's parser refuses (an explicitly encoded v1 version: DER forbids it, BoringSSL takes it)
made the whole chain unreadable to the check, which then skipped it: the revoked intermediate was
served again. etcd (Go's crypto/tls) refuses a handshake whose chain holds a certificate it cannot
parse; the check must refuse such a chain too.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import Program, free_port, proxy_program, store_program, wait_for, write_test_pki

pytestmark = pytest.mark.slow

NOW = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
REVOKED = "raftgate: client certificate"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(cn: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey, *,
           ca: bool) -> x509.Certificate:
    builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(NOW).not_valid_after(NOW + datetime.timedelta(days=1)))
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _unparsable_padding() -> bytes:
    """A certificate TLS stacks take in a chain but a strict DER parser refuses: its version is
    encoded explicitly as v1 (the default, which DER leaves out). Its signature does not matter:
    it is in no path."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("padding")).issuer_name(_name("padding"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(NOW).not_valid_after(NOW + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    der = cert.public_bytes(serialization.Encoding.DER)
    v3 = bytes.fromhex("a003020102")
    assert der.count(v3) == 1
    return _to_pem(der.replace(v3, bytes.fromhex("a003020100")))


def _to_pem(der: bytes) -> bytes:
    text = base64.encodebytes(der).decode().replace("\n", "")
    lines = "\n".join(text[i:i + 64] for i in range(0, len(text), 64))
    return f"-----BEGIN CERTIFICATE-----\n{lines}\n-----END CERTIFICATE-----\n".encode()


@dataclass
class Setup:
    target: str
    ca: bytes
    leaf_key: bytes
    leaf: bytes
    intermediate: bytes

    def range(self, chain: bytes) -> tuple[str, str]:
        creds = grpc.ssl_channel_credentials(self.ca, self.leaf_key, chain)
        with grpc.secure_channel(self.target, creds) as channel:
            try:
                rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=b"k"), timeout=10)
            except grpc.RpcError as e:
                return e.code().name, e.details() or ""
        return "OK", ""


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work = tmp_path_factory.mktemp("crl-chain")
    pki = write_test_pki(work / "pki", [])
    root_key = serialization.load_pem_private_key(pki["ca.key"].read_bytes(), None)
    assert isinstance(root_key, ec.EllipticCurvePrivateKey)
    root_name = x509.load_pem_x509_certificate(pki["ca"].read_bytes()).subject.rfc4514_string().removeprefix("CN=")
    inter_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    inter = _issue("intermediate-ca", inter_key, root_name, root_key, ca=True)
    leaf = _issue("root", leaf_key, "intermediate-ca", inter_key, ca=False)
    crl = (x509.CertificateRevocationListBuilder().issuer_name(_name(root_name)).last_update(NOW)
           .next_update(NOW + datetime.timedelta(days=1))
           .add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(inter.serial_number)
                                    .revocation_date(NOW).build())
           .sign(root_key, hashes.SHA256()))
    crl_file = work / "crl.pem"
    crl_file.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    store, internal = store_program(work)
    port = free_port()
    proxy = proxy_program(work, internal, f"https://127.0.0.1:{port}", f"--cert-file={pki['server.crt']}",
                          f"--key-file={pki['server.key']}", f"--trusted-ca-file={pki['ca']}", "--client-cert-auth",
                          f"--client-crl-file={crl_file}")
    started: list[Program] = []
    try:
        store.start()
        started.append(store)
        proxy.start()
        started.append(proxy)
        built = Setup(f"127.0.0.1:{port}", pki["ca"].read_bytes(),
                      leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()), _pem(leaf), _pem(inter))
        wait_for(lambda: built.range(built.leaf + built.intermediate)[0] == "UNAVAILABLE", 60,
                 "the proxy to serve and refuse the revoked intermediate")
        yield built
    finally:
        for program in reversed(started):
            program.stop()


def test_a_revoked_intermediate_is_refused(setup: Setup) -> None:
    code, message = setup.range(setup.leaf + setup.intermediate)
    assert code == "UNAVAILABLE" and message.startswith(REVOKED), (code, message)


def test_padding_the_chain_does_not_hide_a_revoked_intermediate(setup: Setup) -> None:
    for chain in (setup.leaf + setup.intermediate + _unparsable_padding(),
                  setup.leaf + _unparsable_padding() + setup.intermediate):
        code, message = setup.range(chain)
        assert code == "UNAVAILABLE" and message.startswith(REVOKED), (code, message)
