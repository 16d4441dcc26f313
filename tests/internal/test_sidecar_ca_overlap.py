"""A sidecar CA that is also a central CA must fail start-up, never make every sidecar root.

A client certificate is central when a CA of ``--trusted-ca-file`` signed it directly. If the
sidecar CA is one of those (the same file named twice, the same issuer in the chart's
``sidecarIssuerRef``, or a bundle that holds both CAs), every sidecar certificate verifies with a
central CA: the store would silently give each application pod root's powers. The store must
refuse such a configuration.

Finding: a sidecar CA that is also a central CA was accepted, making every sidecar root (failed
before the fix).
"""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from authstore.api.callers import Classifier


def _ca(cn: str) -> bytes:
    """A self-signed CA certificate (PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_the_same_ca_for_both_classes_is_refused() -> None:
    ca = _ca("internal-ca")
    with pytest.raises(ValueError, match="sidecar"):
        Classifier(central_ca_pem=ca, sidecar_ca_pem=ca)


def test_a_central_bundle_holding_the_sidecar_ca_is_refused() -> None:
    central = _ca("central-ca")
    sidecar = _ca("sidecar-ca")
    with pytest.raises(ValueError, match="sidecar"):
        Classifier(central_ca_pem=central + sidecar, sidecar_ca_pem=sidecar)
    Classifier(central_ca_pem=central, sidecar_ca_pem=sidecar)  # two CAs of their own: fine
