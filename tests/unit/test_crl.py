"""raftgate/crl.py: which CRLs are trusted and which certificates they revoke.

A CRL revokes certificates of its own issuer only, and only when a CA of the client bundle signed
it; a file of several CAs' CRLs, an intermediate revoked by its root, and a CRL that verifies
only once the CA file rotates are each judged as a TLS stack that checks CRLs would."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raftgate.crl import MAX_CRL_BYTES, CRLError, RevocationList, load

NOW = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)


class CA:
    def __init__(self, name: str, *, issuer: CA | None = None) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        signer = issuer or self
        self.cert = self._issue(self.name, self.key.public_key(), signer, ca=True)

    def _issue(self, subject: x509.Name, public_key: object, signer: CA, *, ca: bool, serial: int | None = None
               ) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(signer.name)
                   .public_key(public_key).serial_number(serial or x509.random_serial_number())  # type: ignore[arg-type]
                   .not_valid_before(NOW).not_valid_after(NOW + datetime.timedelta(days=1)))
        if ca:
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        return builder.sign(signer.key, hashes.SHA256())

    def client(self, cn: str, serial: int | None = None) -> x509.Certificate:
        key = ec.generate_private_key(ec.SECP256R1())
        return self._issue(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]), key.public_key(), self,
                           ca=False, serial=serial)

    def crl(self, *revoked: x509.Certificate, signer: CA | None = None) -> x509.CertificateRevocationList:
        builder = (x509.CertificateRevocationListBuilder().issuer_name(self.name).last_update(NOW)
                   .next_update(NOW + datetime.timedelta(days=1)))
        for cert in revoked:
            builder = builder.add_revoked_certificate(x509.RevokedCertificateBuilder()
                                                      .serial_number(cert.serial_number).revocation_date(NOW).build())
        return builder.sign((signer or self).key, hashes.SHA256())


def pem(*items: x509.Certificate | x509.CertificateRevocationList) -> bytes:
    return b"".join(item.public_bytes(serialization.Encoding.PEM) for item in items)


def write(path: Path, data: bytes) -> str:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return str(path)


def test_each_crl_revokes_its_own_issuers_certificates(tmp_path: Path) -> None:
    a, b = CA("ca-a"), CA("ca-b")
    alice = a.client("alice")
    bob_same_serial = b.client("bob", serial=alice.serial_number)
    carol = b.client("carol")
    cas = write(tmp_path / "ca.pem", pem(a.cert, b.cert))
    # one file, both CAs' lists, with a certificate in between (a bundle copied whole): only CRLs count
    crl = write(tmp_path / "crl.pem", pem(a.crl(alice), a.cert, b.crl(carol)))
    revocations = RevocationList(crl, [cas])
    assert revocations.revoked([pem(alice)]) == alice.serial_number
    assert revocations.revoked([pem(carol)]) == carol.serial_number
    assert revocations.revoked([pem(bob_same_serial)]) is None  # the serial, but of another issuer


def test_a_revoked_intermediate_revokes_what_it_signed(tmp_path: Path) -> None:
    root = CA("root-ca")
    intermediate = CA("intermediate-ca", issuer=root)
    leaf = intermediate.client("root")
    cas = write(tmp_path / "ca.pem", pem(root.cert))
    revocations = RevocationList(write(tmp_path / "crl.pem", pem(root.crl(intermediate.cert))), [cas])
    assert revocations.revoked([pem(leaf), pem(leaf, intermediate.cert)]) == intermediate.cert.serial_number
    assert revocations.revoked([pem(leaf)]) is None


def test_der_and_refusals(tmp_path: Path) -> None:
    a, other = CA("ca-a"), CA("ca-a")  # the same name, another key
    alice = a.client("alice")
    cas = write(tmp_path / "ca.pem", pem(a.cert))
    der = write(tmp_path / "crl.der", a.crl(alice).public_bytes(serialization.Encoding.DER))
    assert RevocationList(der, [cas]).revoked([pem(alice)]) == alice.serial_number
    for data, words in [(pem(other.crl(alice)), "not signed by a CA of --trusted-ca-file"),
                        (pem(a.crl(alice, signer=other)), "not signed"),
                        (pem(a.cert), "no PEM 'X509 CRL' block"),
                        (b"\x30\x03\x02\x01\x00", "not a PEM or DER"),
                        (b"  \n", "is empty")]:
        with pytest.raises(CRLError, match=words):
            load(write(tmp_path / "bad.pem", data), [cas])
    huge = tmp_path / "huge.pem"
    with open(huge, "wb") as f:
        f.truncate(MAX_CRL_BYTES + 1)
    with pytest.raises(CRLError, match="larger than"):
        load(str(huge), [cas])
    with pytest.raises(CRLError, match="--trusted-ca-file"):
        load(der, [str(tmp_path / "absent.pem")])


def test_a_crl_of_a_rotated_in_ca_is_taken_when_the_ca_file_changes(tmp_path: Path) -> None:
    old, new = CA("ca-old"), CA("ca-new")
    alice = new.client("alice")
    cas = write(tmp_path / "ca.pem", pem(old.cert))
    crl = write(tmp_path / "crl.pem", pem(old.crl()))
    revocations = RevocationList(crl, [cas])
    write(tmp_path / "crl.pem", pem(new.crl(alice)))  # the CRL lands before the CA bundle
    assert revocations.revoked([pem(alice)]) is None and revocations.reloads == 0
    write(tmp_path / "ca.pem", pem(old.cert, new.cert))
    assert revocations.revoked([pem(alice)]) == alice.serial_number and revocations.reloads == 1


def test_a_file_of_unterminated_pem_blocks_is_refused_in_one_pass(tmp_path: Path) -> None:
    """Each BEGIN without an END must not make the parser scan the rest of the file again: a
    regular expression's lazy match does, which turns a 6 MB file into hours on the event loop."""
    a = CA("ca-a")
    cas = write(tmp_path / "ca.pem", pem(a.cert))
    crl = write(tmp_path / "crl.pem", b"-----BEGIN X509 CRL-----\n" * 250_000)
    with pytest.raises(CRLError, match="no PEM 'X509 CRL' block"):
        load(crl, [cas])
