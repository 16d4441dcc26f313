"""The store's two classes of internal caller (authstore/api/callers.py), decided by the credential.

mTLS: a client certificate is central only when a CA of --trusted-ca-file signed it directly; the
sidecar CA's certificates, and anything else (an intermediate, a certificate that does not parse),
get a sidecar's lesser powers. Development secrets: each class has its own.
"""

from __future__ import annotations

import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from authstore.api.callers import Classifier
from protos.storepb.store_pb2 import ChallengeResponse
from raftgate.internal_access import Caller
from raftgate.secret_proof import INTERNAL, Challenges, proof_metadata

NOW = datetime.datetime.now(datetime.UTC)


def _cert(cn: str, issuer: tuple[x509.Certificate, Any] | None, *, ca: bool) -> tuple[x509.Certificate, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    issuer_name, issuer_key = (issuer[0].subject, issuer[1]) if issuer else (name, key)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(NOW - datetime.timedelta(days=1))
               .not_valid_after(NOW + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    return builder.sign(issuer_key, hashes.SHA256()), key


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _Context:
    def __init__(self, pem: bytes | None = None, secret: bytes | None = None, proofs: Challenges | None = None,
                 peer: str = "ipv4:10.0.0.7:40000") -> None:
        self._pem = pem
        self._peer = peer
        self._metadata: tuple[tuple[str, str], ...] = ()
        if secret is not None:  # a proof of it over a challenge issued to this caller
            assert proofs is not None
            nonce = ChallengeResponse.FromString(proofs.issue(peer)).nonce
            self._metadata = proof_metadata(secret, INTERNAL, proofs.member_id, nonce)

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self._pem]} if self._pem else {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer


def test_certificates_are_classified_by_the_ca_that_signed_them() -> None:
    central_ca = _cert("central-ca", None, ca=True)
    sidecar_ca = _cert("sidecar-ca", None, ca=True)
    # same subject as the central CA, another key: the signature decides, not the issuer's name
    impostor_ca = _cert("central-ca", None, ca=True)
    proxy, _ = _cert("proxy", central_ca, ca=False)
    sidecar, _ = _cert("sidecar", sidecar_ca, ca=False)
    forged, _ = _cert("proxy", impostor_ca, ca=False)
    intermediate = _cert("intermediate", central_ca, ca=True)
    behind, _ = _cert("proxy", intermediate, ca=False)
    classify = Classifier(central_ca_pem=_pem(central_ca[0]), sidecar_ca_pem=_pem(sidecar_ca[0])).classify
    assert classify(_Context(_pem(proxy))) is Caller.CENTRAL
    assert classify(_Context(_pem(proxy))) is Caller.CENTRAL  # cached
    assert classify(_Context(_pem(sidecar))) is Caller.SIDECAR
    assert classify(_Context(_pem(forged))) is Caller.SIDECAR
    assert classify(_Context(_pem(behind))) is Caller.SIDECAR
    assert classify(_Context(b"not a certificate")) is Caller.SIDECAR
    assert classify(_Context(None)) is Caller.SIDECAR
    # without a sidecar CA every caller is central, as before sidecar credentials existed
    assert Classifier(central_ca_pem=_pem(central_ca[0])).classify(_Context(_pem(sidecar))) is Caller.CENTRAL


def test_development_secrets_each_name_their_class() -> None:
    classifier = Classifier(secret=b"c" * 20, sidecar_secret=b"s" * 20, member_id=7)
    assert classifier.secrets() == (b"c" * 20, b"s" * 20)
    proofs = classifier.proofs
    assert proofs is not None
    assert classifier.classify(_Context(secret=b"c" * 20, proofs=proofs)) is Caller.CENTRAL
    assert classifier.classify(_Context(secret=b"s" * 20, proofs=proofs)) is Caller.SIDECAR
    # a central proof replayed from another connection proves nothing: no credential at all
    replayed = _Context(secret=b"c" * 20, proofs=proofs)
    replayed._peer = "ipv4:10.0.0.8:40000"
    assert classifier.classify(replayed) is Caller.NONE
    alone = Classifier(secret=b"c" * 20)
    assert alone.proofs is not None
    assert alone.classify(_Context(secret=b"c" * 20, proofs=alone.proofs)) is Caller.CENTRAL
