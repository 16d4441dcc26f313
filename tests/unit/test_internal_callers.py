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

from authstore.api.callers import Caller, Classifier
from protos.internal import INTERNAL_SECRET_METADATA

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
    def __init__(self, pem: bytes | None = None, secret: str | None = None) -> None:
        self._pem = pem
        self._secret = secret

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self._pem]} if self._pem else {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((INTERNAL_SECRET_METADATA, self._secret),) if self._secret else ()


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
    classifier = Classifier(secret=b"c" * 20, sidecar_secret=b"s" * 20)
    assert classifier.secrets() == (b"c" * 20, b"s" * 20)
    assert classifier.classify(_Context(secret="c" * 20)) is Caller.CENTRAL
    assert classifier.classify(_Context(secret="s" * 20)) is Caller.SIDECAR
    assert Classifier(secret=b"c" * 20).classify(_Context(secret="c" * 20)) is Caller.CENTRAL
