"""A test OIDC issuer on 127.0.0.1: keys generated here, its discovery document and JWKS served by
a stdlib http.server in a thread, and tokens shaped like a pod's projected ServiceAccount token."""

from __future__ import annotations

import datetime
import functools
import ipaddress
import json
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt as pyjwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

DISCOVERY = "/.well-known/openid-configuration"
JWKS = "/openid/v1/jwks"
AUDIENCE = "raftgate"


@functools.cache
def rsa_key(n: int = 0) -> rsa.RSAPrivateKey:
    """RSA key number ``n``, generated once per test run (keys are slow to make)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_jwk(key: rsa.RSAPrivateKey, kid: str, alg: str | None = "RS256") -> dict[str, Any]:
    jwk = json.loads(pyjwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwk.update(kid=kid, use="sig")
    if alg:
        jwk["alg"] = alg
    return jwk


class TestIssuer:
    """Serves ``DISCOVERY`` and ``JWKS``; ``requests`` counts the GETs per path."""

    __test__ = False  # not a pytest class

    def __init__(self, tls_dir: Path | None = None) -> None:
        """``tls_dir``: serve https with a certificate for 127.0.0.1 from a CA written there as ``ca.pem``."""
        self.keys: dict[str, rsa.RSAPrivateKey] = {"k1": rsa_key(0)}
        self.published: list[dict[str, Any]] = [public_jwk(self.keys["k1"], "k1")]
        self.requests: Counter[str] = Counter()
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                issuer.requests[self.path] += 1
                if self.path == DISCOVERY:
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + JWKS}
                elif self.path == JWKS:
                    body = {"keys": list(issuer.published)}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls_dir is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*server_certificate(tls_dir))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def jwks(self) -> dict[str, Any]:
        return {"keys": list(self.published)}

    def token(self, sub: str = "system:serviceaccount:shop:cart", *, aud: str | list[str] = AUDIENCE,
              iss: str | None = None, lifetime: float = 600, nbf: float | None = None, kid: str = "k1",
              key: rsa.RSAPrivateKey | None = None, extra: dict[str, Any] | None = None) -> str:
        """A projected ServiceAccount token's claims, signed RS256 with key ``kid``."""
        now = int(time.time())
        claims: dict[str, Any] = {"iss": iss or self.url, "aud": aud if isinstance(aud, list) else [aud],
                                  "sub": sub, "iat": now, "nbf": now if nbf is None else nbf,
                                  "exp": now + lifetime,
                                  "kubernetes.io": {"namespace": sub.split(":")[2] if sub.count(":") == 3 else ""}}
        claims.update(extra or {})
        return pyjwt.encode(claims, key or self.keys[kid], algorithm="RS256", headers={"kid": kid})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def server_certificate(directory: Path) -> tuple[str, str]:
    """A CA (``ca.pem``) and a certificate it signed for IP 127.0.0.1; returns (cert, key) paths."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, public: Any, issuer: str, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                   .public_key(public).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(cert("test CA", ca_key.public_key(), "test CA", True).public_bytes(pem))
    (directory / "server.pem").write_bytes(cert("issuer", key.public_key(), "test CA", False).public_bytes(pem))
    (directory / "server.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    return str(directory / "server.pem"), str(directory / "server.key")


@contextmanager
def running_issuer(tls_dir: Path | None = None) -> Iterator[TestIssuer]:
    issuer = TestIssuer(tls_dir)
    try:
        yield issuer
    finally:
        issuer.close()
