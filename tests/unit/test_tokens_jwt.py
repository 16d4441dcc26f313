"""JWT provider: every algorithm, verify-only, key checks, etcd's bad-option matrix, claim rules."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from proxy.tokens.jwt import JwtProvider
from raftgate.auth_token import (
    ERR_INVALID_AUTH_METHOD,
    ERR_INVALID_AUTH_OPTS,
    ERR_KEY_MISMATCH,
    ERR_MISSING_KEY,
    AuthOptionError,
    AuthTokenSpec,
    JwtOptions,
    parse_auth_token,
)
from raftgate.errors import Err, EtcdError
from raftgate.go_duration import parse_go_duration
from raftgate.jwt_keys import jwk_thumbprint, public_jwk


def _priv_pem(key: Any) -> bytes:
    return key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())


def _pub_pem(key: Any) -> bytes:
    return key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)


def _cert_pem(key: Any) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jwt")])
    now = datetime.datetime.now(datetime.UTC)
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, algorithm)
    )
    return cert.public_bytes(s.Encoding.PEM)


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    return {
        "rsa": rsa.generate_private_key(65537, 2048),
        "rsa2": rsa.generate_private_key(65537, 2048),
        "ES256": ec.generate_private_key(ec.SECP256R1()),
        "ES384": ec.generate_private_key(ec.SECP384R1()),
        "ES512": ec.generate_private_key(ec.SECP521R1()),
        "EdDSA": ed25519.Ed25519PrivateKey.generate(),
    }


def _key_for(alg: str, keys: dict[str, Any]) -> Any:
    return keys["rsa"] if alg[:2] in ("RS", "PS") else keys[alg]


ASYMMETRIC = ["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]


@pytest.mark.parametrize("alg", ASYMMETRIC)
def test_asymmetric_sign_verify_and_verify_only(alg: str, keys: dict[str, Any]) -> None:
    key = _key_for(alg, keys)
    full = JwtProvider(alg, private_key=_priv_pem(key), public_key=_pub_pem(key))
    priv_only = JwtProvider(alg, private_key=_priv_pem(key))
    assert not full.verify_only and not priv_only.verify_only
    token = full.sign("alice", 7)
    for provider in (full, priv_only):
        found = provider.verify(token)
        assert found is not None and (found.username, found.revision) == ("alice", 7)
    for pub in (_pub_pem(key), _cert_pem(key)):
        verifier = JwtProvider(alg, public_key=pub)
        assert verifier.verify_only
        assert verifier.verify(token) is not None
        with pytest.raises(EtcdError) as e:
            verifier.sign("alice", 7)
        assert e.value.err is Err.VERIFY_ONLY


@pytest.mark.parametrize("alg", ["HS256", "HS384", "HS512"])
def test_hmac_uses_raw_key_file_bytes(alg: str, keys: dict[str, Any]) -> None:
    for secret in (b"short", _priv_pem(keys["ES256"])):  # even PEM-looking bytes are just a secret (etcd)
        provider = JwtProvider(alg, private_key=secret)
        token = provider.sign("bob", 3)
        assert provider.verify(token) is not None
        assert not provider.verify_only
        # Same token must verify against an independent HMAC computation.
        head, payload, sig = token.split(".")
        digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
        expected = hmac.new(secret, f"{head}.{payload}".encode(), digest).digest()
        assert base64.urlsafe_b64decode(sig + "==") == expected
        # pub-key is ignored for HMAC
        assert JwtProvider(alg, private_key=secret, public_key=b"ignored").verify(token) is not None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hs256(claims: Any, secret: bytes = b"k", header: dict[str, Any] | None = None) -> str:
    head = _b64(json.dumps(header or {"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(claims).encode())
    sig = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(sig)}"


def test_claims_are_exactly_etcds(keys: dict[str, Any]) -> None:
    provider = JwtProvider(
        "ES256", private_key=_priv_pem(keys["ES256"]), ttl_ns=parse_go_duration("90s"), clock=lambda: 1000.5
    )
    head, payload, _ = provider.sign("alice", 9).split(".")
    # etcd's header plus the key's RFC 7638 thumbprint as kid (etcd ignores kid when it verifies).
    kid = jwk_thumbprint(public_jwk(keys["ES256"]))
    assert json.loads(base64.urlsafe_b64decode(head + "==")) == {"alg": "ES256", "typ": "JWT", "kid": kid}
    assert json.loads(base64.urlsafe_b64decode(payload + "==")) == {"username": "alice", "revision": 9, "exp": 1090}


@pytest.mark.parametrize(
    "claims, ok",
    [
        ({"username": "u", "revision": 1}, True),  # no exp: never expires (golang-jwt v5 default)
        ({"username": "u", "revision": 1.0}, True),
        ({"username": "u", "revision": 1, "exp": 2000}, True),
        ({"revision": 1}, False),
        ({"username": "u"}, False),
        ({"username": 5, "revision": 1}, False),
        ({"username": "u", "revision": "1"}, False),
        ({"username": "u", "revision": True}, False),
        ({"username": "u", "revision": -1}, False),
        ({"username": "u", "revision": 1.5}, False),
        ({"username": "u", "revision": 1, "exp": 1000}, False),  # exp == now is expired
        ({"username": "u", "revision": 1, "exp": "2000"}, False),
        ({"username": "u", "revision": 1, "nbf": 1001}, False),
        ({"username": "u", "revision": 1, "nbf": 999}, True),
        (["not", "an", "object"], False),
    ],
)
def test_claim_rules(claims: Any, ok: bool) -> None:
    provider = JwtProvider("HS256", private_key=b"k", clock=lambda: 1000.0)
    assert (provider.verify(_hs256(claims)) is not None) is ok


def test_expiry_respected_by_cache() -> None:
    now = [1000.0]
    provider = JwtProvider("HS256", private_key=b"k", ttl_ns=parse_go_duration("5m"), clock=lambda: now[0])
    token = provider.sign("u", 1)
    assert provider.verify(token) is not None
    now[0] += 299
    assert provider.verify(token) is not None  # cached
    now[0] += 1
    assert provider.verify(token) is None
    assert provider.verify(token) is None


def test_algorithm_is_pinned(keys: dict[str, Any]) -> None:
    key = keys["rsa"]
    provider = JwtProvider("RS256", public_key=_pub_pem(key))
    # The classic confusion: HS256 keyed with the public key's PEM.
    assert provider.verify(_hs256({"username": "u", "revision": 1}, _pub_pem(key))) is None
    # alg none
    none_head = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    none = f"{none_head}.{_b64(json.dumps({'username': 'u', 'revision': 1}).encode())}."
    assert provider.verify(none) is None
    # Same key, another RSA algorithm.
    assert provider.verify(JwtProvider("RS512", private_key=_priv_pem(key)).sign("u", 1)) is None
    assert provider.verify(JwtProvider("PS256", private_key=_priv_pem(key)).sign("u", 1)) is None
    # Same algorithm, another key.
    assert provider.verify(JwtProvider("RS256", private_key=_priv_pem(keys["rsa2"])).sign("u", 1)) is None
    # Tampered payload.
    token = JwtProvider("RS256", private_key=_priv_pem(key)).sign("u", 1)
    head, _, sig = token.split(".")
    forged = f"{head}.{_b64(json.dumps({'username': 'root', 'revision': 1}).encode())}.{sig}"
    assert provider.verify(forged) is None
    assert provider.verify("x" * 20000) is None
    assert provider.verify("") is None
    assert provider.verify("a.b.c") is None


def test_key_mismatch(keys: dict[str, Any]) -> None:
    for alg, a, b in [
        ("RS256", keys["rsa"], keys["rsa2"]),
        ("ES256", keys["ES256"], ec.generate_private_key(ec.SECP256R1())),
        ("EdDSA", keys["EdDSA"], ed25519.Ed25519PrivateKey.generate()),
    ]:
        with pytest.raises(AuthOptionError) as e:
            JwtProvider(alg, private_key=_priv_pem(a), public_key=_pub_pem(b))
        assert str(e.value) == ERR_KEY_MISMATCH == "auth: public and private keys don't match"


def _files(tmp_path: Path, keys: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name, data in {
        "rsa.key": _priv_pem(keys["rsa"]),
        "rsa.pub": _pub_pem(keys["rsa"]),
        "ec.key": _priv_pem(keys["ES256"]),
        "ec.pub": _pub_pem(keys["ES256"]),
        "ec384.key": _priv_pem(keys["ES384"]),
    }.items():
        (tmp_path / name).write_bytes(data)
        out[name] = str(tmp_path / name)
    return out


def _jwt(spec: AuthTokenSpec) -> JwtOptions:
    assert spec.jwt is not None, spec
    return spec.jwt


def test_bad_option_matrix(tmp_path: Path, keys: dict[str, Any]) -> None:
    f = _files(tmp_path, keys)
    missing = str(tmp_path / "missing-file")
    cases: dict[str, tuple[str, str]] = {
        "no options": ("jwt", ERR_INVALID_AUTH_METHOD),
        "invalid method": ("jwt,sign-method=invalid", ERR_INVALID_AUTH_METHOD),
        "method none": ("jwt,sign-method=none", ERR_INVALID_AUTH_METHOD),
        "method ES256K (not in etcd)": (f"jwt,sign-method=ES256K,priv-key={f['ec.key']}", ERR_INVALID_AUTH_METHOD),
        "rsa no key": ("jwt,sign-method=RS256", ERR_MISSING_KEY),
        "invalid ttl": (f"jwt,sign-method=RS256,priv-key={f['rsa.key']},ttl=forever", ERR_INVALID_AUTH_OPTS),
        "zero ttl": (f"jwt,sign-method=RS256,priv-key={f['rsa.key']},ttl=0s", ERR_INVALID_AUTH_OPTS),
        "rsa invalid public key": (
            f"jwt,sign-method=RS256,pub-key={f['rsa.key']},priv-key={f['rsa.key']}",
            ERR_INVALID_AUTH_OPTS,
        ),
        "rsa invalid private key": (
            f"jwt,sign-method=RS256,pub-key={f['rsa.pub']},priv-key={f['rsa.pub']}",
            ERR_INVALID_AUTH_OPTS,
        ),
        "rsa with ec key": (f"jwt,sign-method=RS256,priv-key={f['ec.key']}", ERR_INVALID_AUTH_OPTS),
        "es256 with p384 key": (f"jwt,sign-method=ES256,priv-key={f['ec384.key']}", ERR_INVALID_AUTH_OPTS),
        "hmac no key": ("jwt,sign-method=HS256", ERR_MISSING_KEY),
        "hmac pub key": (f"jwt,sign-method=HS256,pub-key={f['rsa.pub']}", ERR_MISSING_KEY),
        "missing public key file": (f"jwt,sign-method=HS256,pub-key={missing}", ERR_INVALID_AUTH_OPTS),
        "missing private key file": (f"jwt,sign-method=HS256,priv-key={missing}", ERR_INVALID_AUTH_OPTS),
        "ecdsa no key": ("jwt,sign-method=ES256", ERR_MISSING_KEY),
        "ecdsa invalid public key": (
            f"jwt,sign-method=ES256,pub-key={f['ec.key']},priv-key={f['ec.key']}",
            ERR_INVALID_AUTH_OPTS,
        ),
        "ecdsa invalid private key": (
            f"jwt,sign-method=ES256,pub-key={f['ec.pub']},priv-key={f['ec.pub']}",
            ERR_INVALID_AUTH_OPTS,
        ),
        "ecdsa mismatch": (
            f"jwt,sign-method=ES256,pub-key={f['ec.pub']},priv-key={f['ec384.key']}",
            ERR_INVALID_AUTH_OPTS,
        ),
        "duplicate key": (f"jwt,sign-method=RS256,priv-key={f['rsa.key']},sign-method=RS256", ERR_INVALID_AUTH_OPTS),
        "malformed pair": ("jwt,sign-method", ERR_INVALID_AUTH_OPTS),
        "pair with two =": ("jwt,sign-method=RS256=x", ERR_INVALID_AUTH_OPTS),
        "unknown type": ("opaque", ERR_INVALID_AUTH_OPTS),
    }
    for name, (text, expected) in cases.items():
        with pytest.raises(AuthOptionError) as e:
            spec = parse_auth_token(text)
            JwtProvider.from_options(_jwt(spec))
        assert e.value.etcd_text == expected, name
        assert str(e.value).startswith(expected), name


def test_good_options(tmp_path: Path, keys: dict[str, Any]) -> None:
    f = _files(tmp_path, keys)
    spec = parse_auth_token(f"jwt,pub-key={f['rsa.pub']},priv-key={f['rsa.key']},sign-method=RS256,ttl=2h45m,x=y")
    assert spec.kind == "jwt"
    provider = JwtProvider.from_options(_jwt(spec))
    assert provider.ttl_seconds == 9900 and not provider.verify_only
    assert JwtProvider.from_options(_jwt(parse_auth_token(f"jwt,sign-method=ES256,priv-key={f['ec.key']}")))
    assert parse_auth_token("simple").kind == "simple"
    assert parse_auth_token("").kind == ""


@pytest.mark.parametrize(
    "text, ns",
    [
        ("5m", 300 * 10**9),
        ("300ms", 3 * 10**8),
        ("1.5h", 5400 * 10**9),
        ("2h45m", 9900 * 10**9),
        ("0", 0),
        ("1us", 1000),
        ("1\u00b5s", 1000),
        ("-1s", -(10**9)),
        (".5s", 5 * 10**8),
    ],
)
def test_go_duration(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize("text", ["", "5", "forever", "1d", ".s", "1.2.3s", "-", "s", "1m1", "\u0661h", "1\u0660s",
                                  "\uff15m"])
def test_go_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_go_duration(text)
