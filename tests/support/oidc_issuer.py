"""A test OIDC issuer on 127.0.0.1: keys generated here, its discovery document and JWKS served by
a stdlib http.server in a thread, and tokens shaped like a pod's projected ServiceAccount token."""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt as pyjwt
from cryptography.hazmat.primitives.asymmetric import rsa

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

    def __init__(self) -> None:
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
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
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


@contextmanager
def running_issuer() -> Iterator[TestIssuer]:
    issuer = TestIssuer()
    try:
        yield issuer
    finally:
        issuer.close()
