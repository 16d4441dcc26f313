"""JWT keys that rotate (raftgate/jwt_keys.py, through the proxy's JwtProvider): a directory or a JWKS
file of verification keys, ``kid`` headers, re-reading changed files (Kubernetes' symlink swap),
old keys verifying for the token TTL only, a bad new file keeping the old keys, algorithm
confusion through a ``kid``, and a verify-only key set following a published JWKS."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import Any

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from prometheus_client.registry import CollectorRegistry

from proxy.tokens.jwt import JwtProvider
from raftgate.auth_token import ERR_INVALID_AUTH_OPTS, ERR_MISSING_KEY, AuthOptionError, jwt_options, parse_auth_token
from raftgate.jwt_keys import (
    JWKS_PATH,
    MAX_UNKEYED_TRIES,
    JwksFollower,
    KeyMaterial,
    KeyRing,
    jwk_thumbprint,
    public_jwk,
)
from raftgate.observe import ListenAddr, ObserveConfig, start_observability

TTL = 300.0


def _priv_pem(key: Any) -> bytes:
    return key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())


def _pub_pem(key: Any) -> bytes:
    return key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)


def _kid(key: Any) -> str:
    return jwk_thumbprint(public_jwk(key))


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(user: str = "alice", exp: float | None = None) -> dict[str, Any]:
    return {"username": user, "revision": 2, **({} if exp is None else {"exp": int(exp)})}


def _mint(key: Any, alg: str = "RS256", kid: str | None = None, **claims: Any) -> str:
    """A token minted elsewhere (etcd's own have no kid)."""
    return pyjwt.encode({**_claims(), **claims}, _priv_pem(key), algorithm=alg, headers={"kid": kid} if kid else None)


def _hs256(claims: dict[str, Any], secret: bytes, kid: str | None) -> str:
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(hmac.new(secret, f'{head}.{body}'.encode(), hashlib.sha256).digest())}"


def _header(token: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))


@pytest.fixture(scope="module")
def rsa_keys() -> list[Any]:
    return [rsa.generate_private_key(65537, 2048) for _ in range(3)]


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class SecretVolume:
    """A Kubernetes Secret volume: ``..data`` -> a timestamped directory; the keys link through it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.version = 0

    def publish(self, files: dict[str, bytes]) -> None:
        self.version += 1
        target = self.root / f"..v{self.version}"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(target.name)
        os.replace(tmp, self.root / "..data")  # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")

    def path(self, name: str) -> str:
        return str(self.root / name)


def test_thumbprint_is_rfc7638s() -> None:
    """The example of RFC 7638 section 3.1."""
    n = ("0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiF"
         "V4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0"
         "zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-cs"
         "FCur-kEgU8awapJzKnqDKgw")
    jwk = {"kty": "RSA", "n": n, "e": "AQAB", "alg": "RS256", "kid": "2011-04-29"}
    assert jwk_thumbprint(jwk) == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"


def test_pub_key_directory(tmp_path: Path, rsa_keys: list[Any]) -> None:
    """Every PEM key of the directory verifies, with or without kid; Kubernetes' dot entries are skipped."""
    keys = tmp_path / "keys"
    keys.mkdir()
    for i, key in enumerate(rsa_keys[:2]):
        (keys / f"k{i}.pem").write_bytes(_pub_pem(key))
    (keys / "..data").mkdir()
    (keys / "..data" / "junk").write_text("not a key")
    provider = JwtProvider.from_options(jwt_options(parse_auth_token(f"jwt,sign-method=RS256,pub-key={keys}").options))
    assert provider.verify_only
    for key in rsa_keys[:2]:
        assert provider.verify(_mint(key)) is not None  # etcd's tokens: no kid
        assert provider.verify(_mint(key, kid=_kid(key))) is not None
    assert provider.verify(_mint(rsa_keys[2])) is None
    # A known kid means that key only: key 0's kid on a token key 1 signed is refused.
    assert provider.verify(_mint(rsa_keys[1], kid=_kid(rsa_keys[0]), username="x", revision=2)) is None
    # An unknown kid is tried like no kid (tokens minted with their own kid kept verifying before).
    assert provider.verify(_mint(rsa_keys[1], kid="their-own-name", username="y", revision=2)) is not None
    doc = json.loads(provider.jwks_document() or b"")
    assert sorted(k["kid"] for k in doc["keys"]) == sorted(_kid(k) for k in rsa_keys[:2])
    assert all(set(k) == {"kty", "n", "e", "kid", "alg", "use"} for k in doc["keys"])  # public members only


def test_jwks_file_keeps_its_kids_and_algorithms(tmp_path: Path, rsa_keys: list[Any]) -> None:
    es = ec.generate_private_key(ec.SECP256R1())
    jwks = {"keys": [
        {**public_jwk(rsa_keys[0]), "kid": "rsa-2026", "alg": "PS256", "use": "sig"},
        {**public_jwk(es), "kid": "ec-1"},  # no alg: ES256 from its curve
        {**public_jwk(rsa_keys[1]), "kid": "enc", "use": "enc"},  # not a signature key: skipped
    ]}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    provider = JwtProvider.from_options(jwt_options({"sign-method": "RS256", "pub-key": str(path)}))
    assert provider.verify(_mint(rsa_keys[0], "PS256", "rsa-2026")) is not None
    assert provider.verify(_mint(es, "ES256", "ec-1")) is not None
    assert provider.verify(_mint(es, "ES256")) is not None
    # Each key's own algorithm: RS256 with the PS256 key is refused, whatever the header says.
    assert provider.verify(_mint(rsa_keys[0], "RS256", "rsa-2026")) is None
    assert provider.verify(_mint(rsa_keys[1], "RS256", "enc")) is None
    with pytest.raises(AuthOptionError) as e:
        path.write_text('{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}')
        JwtProvider.from_options(jwt_options({"sign-method": "RS256", "pub-key": str(path)}))
    assert e.value.etcd_text == ERR_INVALID_AUTH_OPTS


def test_alg_confusion_through_kid(tmp_path: Path, rsa_keys: list[Any]) -> None:
    """A kid naming an RSA key with an HS256 header (keyed with the public key's bytes), an HMAC key
    in a JWKS, and an RS256 token at an HMAC proxy: all refused."""
    rsa_key = rsa_keys[0]
    secret = b"shared-secret-in-a-jwks"
    jwks = {"keys": [{**public_jwk(rsa_key), "kid": "r", "alg": "RS256"},
                     {"kty": "oct", "kid": "h", "alg": "HS256", "k": _b64(secret)}]}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    provider = JwtProvider.from_options(jwt_options({"sign-method": "RS256", "pub-key": str(path)}))
    assert provider.verify(_mint(rsa_key, kid="r")) is not None
    for material in (_pub_pem(rsa_key), json.dumps(public_jwk(rsa_key)).encode(),
                     base64.urlsafe_b64decode(public_jwk(rsa_key)["n"] + "==")):
        for kid in ("r", None):
            assert provider.verify(_hs256(_claims(), material, kid)) is None
    assert provider.verify(_hs256(_claims(), secret, "h")) is None  # oct keys never load from a JWKS
    hmac_provider = JwtProvider("HS256", private_key=secret)
    assert hmac_provider.verify(_hs256(_claims(), secret, None)) is not None
    assert hmac_provider.verify(_mint(rsa_key)) is None
    assert hmac_provider.verify(_mint(rsa_key, kid="r")) is None
    assert hmac_provider.jwks_document() is None  # a secret is never published
    assert "kid" not in _header(hmac_provider.sign("u", 1))


def _ring_files(vol: SecretVolume, key: Any) -> None:
    vol.publish({"jwt.key": _priv_pem(key), "jwt.pub": _pub_pem(key)})


def _signer(vol: SecretVolume, clock: Clock, reloads: list[tuple[str, str]]) -> JwtProvider:
    ring = KeyRing.from_files("RS256", vol.path("jwt.key"), vol.path("jwt.pub"), retain_seconds=TTL, clock=clock,
                              poll_interval=0, on_reload=lambda source, result: reloads.append((source, result)))
    return JwtProvider("RS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)


def test_rotation_keeps_old_keys_for_the_ttl(tmp_path: Path, rsa_keys: list[Any]) -> None:
    clock, reloads = Clock(), []
    vol = SecretVolume(tmp_path / "secret")
    _ring_files(vol, rsa_keys[0])
    signer = _signer(vol, clock, reloads)
    old = signer.sign("alice", 2)
    old_etcd = _mint(rsa_keys[0], exp=clock.now + TTL)  # etcd-minted, no kid, same key
    assert _header(old)["kid"] == _kid(rsa_keys[0])
    clock.now += 100
    _ring_files(vol, rsa_keys[1])  # priv and pub swap together, as a Secret update does
    new = signer.sign("alice", 2)
    assert reloads == [("files", "ok")]
    assert _header(new)["kid"] == _kid(rsa_keys[1])
    fresh = JwtProvider("RS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=signer.keys)  # an empty token cache
    for token in (old, old_etcd, new):
        assert fresh.verify(token) is not None
    assert {k["kid"] for k in json.loads(signer.jwks_document() or b"")["keys"]} == {_kid(k) for k in rsa_keys[:2]}
    # The old key outlives its last token (signed at t+0 < rotation, exp t+TTL), then is dropped.
    clock.now += TTL - 1
    late = _mint(rsa_keys[0], kid=_kid(rsa_keys[0]), username="late", revision=2)  # no exp: never expires
    assert fresh.verify(late) is not None
    clock.now += 2
    again = JwtProvider("RS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=signer.keys)
    assert again.verify(late) is None
    assert again.verify(_mint(rsa_keys[0], username="late2", revision=2)) is None  # no kid either
    assert again.verify(signer.sign("alice", 2)) is not None
    assert [k["kid"] for k in json.loads(signer.jwks_document() or b"")["keys"]] == [_kid(rsa_keys[1])]


def test_a_bad_new_file_keeps_the_keys_in_force(tmp_path: Path, rsa_keys: list[Any]) -> None:
    clock, reloads = Clock(), []
    vol = SecretVolume(tmp_path / "secret")
    _ring_files(vol, rsa_keys[0])
    signer = _signer(vol, clock, reloads)
    good = signer.sign("alice", 2)
    for files in ({"jwt.key": b"garbage", "jwt.pub": _pub_pem(rsa_keys[1])},  # unparseable
                  {"jwt.key": _priv_pem(rsa_keys[1]), "jwt.pub": _pub_pem(rsa_keys[2])},  # mismatched pair
                  {"jwt.key": _priv_pem(ec.generate_private_key(ec.SECP256R1())), "jwt.pub": b""}):  # wrong family
        vol.publish(files)
        token = signer.sign("bob", 2)
        assert _header(token)["kid"] == _kid(rsa_keys[0])
        assert signer.verify(token) is not None and signer.verify(good) is not None
        signer.sign("carol", 2)  # the same bad files again: not re-read, not counted twice
    assert reloads == [("files", "error")] * 3
    _ring_files(vol, rsa_keys[1])
    assert _header(signer.sign("dave", 2))["kid"] == _kid(rsa_keys[1])
    assert reloads[-1] == ("files", "ok")


def test_a_rewritten_file_in_place_is_seen(tmp_path: Path, rsa_keys: list[Any]) -> None:
    """Not only symlink swaps: a file rewritten in place (mtime/size) too; HMAC secrets rotate the same way."""
    clock = Clock()
    secret = tmp_path / "secret"
    secret.write_bytes(b"first-secret")
    ring = KeyRing.from_files("HS256", str(secret), None, retain_seconds=TTL, clock=clock, poll_interval=0)
    provider = JwtProvider("HS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)
    old = provider.sign("alice", 2)
    secret.write_bytes(b"second-secret, longer")
    new = provider.sign("alice", 2)
    assert old != new
    fresh = JwtProvider("HS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)
    assert fresh.verify(old) is not None and fresh.verify(new) is not None
    clock.now += TTL + 1
    later = JwtProvider("HS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)
    assert later.verify(_hs256(_claims(), b"first-secret", None)) is None
    assert later.verify(_hs256(_claims(), b"second-secret, longer", None)) is not None


def test_unkeyed_tokens_try_a_bounded_number_of_keys(tmp_path: Path) -> None:
    keys = [ec.generate_private_key(ec.SECP256R1()) for _ in range(MAX_UNKEYED_TRIES + 1)]
    folder = tmp_path / "keys"
    folder.mkdir()
    for i, key in enumerate(keys):
        (folder / f"k{i:02}.pem").write_bytes(_pub_pem(key))
    provider = JwtProvider.from_options(jwt_options({"sign-method": "ES256", "pub-key": str(folder)}))
    assert provider.verify(_mint(keys[MAX_UNKEYED_TRIES - 1], "ES256")) is not None
    assert provider.verify(_mint(keys[MAX_UNKEYED_TRIES], "ES256")) is None  # beyond the bound: needs its kid
    assert provider.verify(_mint(keys[MAX_UNKEYED_TRIES], "ES256", _kid(keys[MAX_UNKEYED_TRIES]))) is not None


def test_jwks_url_options(tmp_path: Path, rsa_keys: list[Any]) -> None:
    pub = tmp_path / "k.pub"
    pub.write_bytes(_pub_pem(rsa_keys[0]))
    ok = JwtProvider.from_options(jwt_options(parse_auth_token("jwt,sign-method=RS256,jwks-url=http://127.0.0.1:1/x").options))
    assert ok.verify_only and ok.follower is not None
    for text, want in [
        ("jwt,sign-method=HS256,priv-key={pub},jwks-url=http://127.0.0.1:1/x", ERR_INVALID_AUTH_OPTS),
        ("jwt,sign-method=RS256,jwks-url=file:///etc/passwd", ERR_INVALID_AUTH_OPTS),
        ("jwt,sign-method=RS256,pub-key={pub},jwks-ca={pub}", ERR_INVALID_AUTH_OPTS),
        ("jwt,sign-method=RS256,jwks-url=https://127.0.0.1:1/x,jwks-ca={tmp}/missing", ERR_INVALID_AUTH_OPTS),
        ("jwt,sign-method=RS256", ERR_MISSING_KEY),
    ]:
        with pytest.raises(AuthOptionError) as e:
            JwtProvider.from_options(jwt_options(parse_auth_token(text.format(pub=pub, tmp=tmp_path)).options))
        assert e.value.etcd_text == want, text


def test_a_verify_only_ring_follows_the_published_jwks(tmp_path: Path, rsa_keys: list[Any]) -> None:
    """The signer's keys published on a metrics port; a follower learns a rotation on the first
    token with the new kid, rate-limited; an HMAC signer publishes nothing (404)."""
    clock, reloads = Clock(), []
    vol = SecretVolume(tmp_path / "secret")
    _ring_files(vol, rsa_keys[0])
    signer = _signer(vol, clock, [])

    async def go() -> None:
        obs = await start_observability(ObserveConfig(metrics_addr=ListenAddr("127.0.0.1", 0)),
                                        registry=CollectorRegistry(),
                                        documents={JWKS_PATH: signer.jwks_document, "/none": lambda: None,
                                                   "/huge": lambda: b" " * (2 << 20)})
        try:
            url = f"http://{obs.metrics_address}{JWKS_PATH}"
            ring = KeyRing("RS256", KeyMaterial(None, ()), retain_seconds=TTL, clock=clock)
            follower = JwksFollower(ring, url, min_interval=0.5,
                                    on_reload=lambda source, result: reloads.append((source, result)))
            verifier = JwtProvider("RS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring, follower=follower)
            assert await follower.refresh()
            old = signer.sign("alice", 2)
            assert verifier.unknown_kid(old) is None and verifier.verify(old) is not None
            _ring_files(vol, rsa_keys[1])
            new = signer.sign("alice", 2)
            kid = verifier.unknown_kid(new)
            assert kid == _kid(rsa_keys[1])
            before = len(reloads)
            await asyncio.gather(*(verifier.refresh_keys(kid) for _ in range(5)))  # callers share one fetch
            assert reloads[before:] == [("jwks_url", "ok")]
            assert verifier.verify(new) is not None and verifier.verify(old) is not None
            # A kid nobody has: at most one more fetch per min_interval, however many ask.
            await asyncio.gather(*(verifier.refresh_keys("nobody-has-it") for _ in range(5)))
            assert len(reloads) - before <= 3
            for path in ("/none", "/huge"):  # 404 (an HMAC signer publishes nothing); over the size bound
                bad = JwksFollower(ring, f"http://{obs.metrics_address}{path}",
                                   on_reload=lambda source, result: reloads.append((source, result)))
                assert not await bad.refresh()
                assert reloads[-1] == ("jwks_url", "error")
            assert verifier.verify(new) is not None  # a failed fetch keeps the keys fetched before
        finally:
            await obs.close(0)

    asyncio.run(go())


def test_a_cached_token_without_exp_dies_with_its_key(tmp_path: Path, rsa_keys: list[Any]) -> None:
    """A token without ``exp`` (etcd: never expires) is not answered from the cache forever: once its
    key has left the files and the retention passed, it is refused like an uncached one."""
    clock = Clock()
    vol = SecretVolume(tmp_path / "secret")
    vol.publish({"jwt.pub": _pub_pem(rsa_keys[0])})
    ring = KeyRing.from_files("RS256", None, vol.path("jwt.pub"), retain_seconds=TTL, clock=clock, poll_interval=0)
    provider = JwtProvider("RS256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)
    token = _mint(rsa_keys[0])
    assert provider.verify(token) is not None
    vol.publish({"jwt.pub": _pub_pem(rsa_keys[1])})
    assert provider.verify(_mint(rsa_keys[1])) is not None  # (the poll sees the new file)
    clock.now += TTL - 1
    assert provider.verify(token) is not None
    clock.now += 2
    assert provider.verify(token) is None
