"""Two classes of internal caller: central proxies (trusted to name the user) and sidecars (not).

A central proxy resolves tokens, checks passwords (it reads the hashes: ``Credentials``) and
stamps the user into each request; the store believes the stamp. A sidecar runs in an
application's pod, where whoever reads that namespace's Secrets holds its credential, so the store
believes nothing it says about identity: it verifies the client's token itself (the sidecar
forwards it) and checks Authenticate passwords itself. THREAT_MODEL.md explains the choice.

The class comes from the credential alone:
* mTLS: with ``--sidecar-trusted-ca-file`` the port accepts client certificates of both CAs; a
  certificate counts as central only when a CA of ``--trusted-ca-file`` signed it directly (its
  signature verifies with that CA's key). Anything else - signed by the sidecar CA, or through an
  intermediate - is a sidecar: an unexpected certificate gets the lesser powers, never root's.
  A sidecar CA that is also a central CA (it would make every sidecar central) is refused.
* development secrets: ``--internal-secret-file`` is central, ``--sidecar-secret-file`` sidecar;
  neither presented (or a wrong one): NONE, which reaches only what raftgate/internal_access.py
  opens to it. Each secret is proven over a challenge, never sent (raftgate/secret_proof.py).
Both in use: central only if every credential presented says central.
"""

from __future__ import annotations

import logging
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from raftgate.internal_access import Caller
from raftgate.secret_proof import INTERNAL, Challenges
from raftgate.trust_cache import TrustCache

__all__ = ["Classifier", "metadata_value"]

log = logging.getLogger("raftgate.store.callers")

#: certificates classified, by the sha256 of their PEM (one classification per certificate)
CACHE_SIZE = 1024


def metadata_value(context: Any, key: str) -> bytes | None:
    for k, value in context.invocation_metadata() or ():
        if k == key:
            return value.encode() if isinstance(value, str) else bytes(value)
    return None


class Classifier:
    """Says which class a call's credential belongs to (``classify``); cheap per call."""

    def __init__(self, *, secret: bytes | None = None, sidecar_secret: bytes | None = None,
                 central_ca_pem: bytes | None = None, sidecar_ca_pem: bytes | None = None,
                 member_id: int = 0) -> None:
        self._secret = secret
        self._sidecar_secret = sidecar_secret
        #: the proofs of the secrets (central first); None without secrets
        self.proofs = (Challenges(INTERNAL, self.secrets(), member_id) if secret or sidecar_secret else None)
        #: set only when sidecar certificates exist: then each client certificate is classified
        self._central_cas = _load_cas(central_ca_pem) if sidecar_ca_pem and central_ca_pem else None
        if self._central_cas is not None and sidecar_ca_pem:
            _refuse_shared_keys(self._central_cas, _load_cas(sidecar_ca_pem))
        #: certificate -> its class; depends on the CA files, read once at start-up (a change of
        #: them takes a restart, which empties this)
        self._by_cert: TrustCache[Caller] = TrustCache(CACHE_SIZE)

    def secrets(self) -> tuple[bytes, ...]:
        """The secrets the internal port accepts (the interceptor checks one is presented)."""
        return tuple(s for s in (self._secret, self._sidecar_secret) if s)

    def classify(self, context: Any) -> Caller:
        if self.proofs is not None:
            # the secret proven; index 0 is central's when a central secret is set
            proven = self.proofs.verify(context.invocation_metadata(), context.peer())
            if proven < 0:
                return Caller.NONE
            if not (self._secret is not None and proven == 0):
                return Caller.SIDECAR
        if self._central_cas is not None:
            pems = context.auth_context().get("x509_pem_cert") or []
            if not pems:
                return Caller.SIDECAR
            return self._certificate(pems[0])
        return Caller.CENTRAL

    def _certificate(self, pem: bytes) -> Caller:
        hit = self._by_cert.get(pem)
        if hit is not None:
            return hit
        found = Caller.SIDECAR
        try:
            cert = x509.load_pem_x509_certificate(pem)
            assert self._central_cas is not None
            for ca in self._central_cas:
                try:
                    cert.verify_directly_issued_by(ca)
                except (ValueError, TypeError, InvalidSignature):
                    continue
                found = Caller.CENTRAL
                break
        except ValueError:
            log.warning("a client certificate that does not parse: treated as a sidecar's")
        self._by_cert.put(pem, found)
        return found


def _load_cas(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


def _refuse_shared_keys(central: list[x509.Certificate], sidecar: list[x509.Certificate]) -> None:
    """A sidecar CA whose key is also a central CA's (the same file twice, one issuer for both, a
    central bundle holding it) signs certificates that verify as central: every sidecar would be
    root. A start-up error rather than that."""
    central_keys = {_spki(ca) for ca in central}
    if any(_spki(ca) in central_keys for ca in sidecar):
        raise ValueError("a sidecar CA is also a central CA (--trusted-ca-file): every sidecar "
                         "certificate would be central; give sidecars a CA of their own")


def _spki(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
