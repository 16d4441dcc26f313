"""No cached verification outlives what it relied on (issue 21, item 3).

For each kind of key - the etcd JWT key in the proxy (files, and keys followed through
``jwks-url``), the etcd JWT key in the store's sidecar verifier, the workload issuer's JWKS file,
the workload issuer's keys fetched over HTTP, and the workload user map - a token is verified
(and so cached) first; then the key is rotated out, deleted or corrupted, and every path must
refuse that token within the retirement TTL (or the documented bound), however far its ``exp``.
A leaked key mints ``exp`` = 2100 once; rotation must stop it without a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec

from proxy.tokens.jwt import JwtProvider
from raftgate.jwt_keys import JwksFollower, KeyMaterial, KeyRing, jwk_thumbprint, public_jwk
from raftgate.token_verifier import JwtKeys
from raftgate.workload_identity import (
    DiscoverySource,
    Fetcher,
    FileSource,
    KeySet,
    UserMapFile,
    WorkloadRefused,
    WorkloadTokens,
    WorkloadVerifier,
)
from tests.support.oidc_issuer import AUDIENCE, TestIssuer, rsa_key, running_issuer
from tests.support.oidc_issuer import public_jwk as rsa_jwk

TTL = 300.0
#: 2100-01-01: what an attacker holding a leaked key writes into ``exp``
YEAR_2100 = 4102444800
DAY = 86400.0
RULES = [{"match": "system:serviceaccount:shop:*", "user": "shop"}]


class Clock:
    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now

    def __call__(self) -> float:
        return self.now


def _priv_pem(key: Any) -> bytes:
    return key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())


def _pub_pem(key: Any) -> bytes:
    return key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)


def _kid(key: Any) -> str:
    return jwk_thumbprint(public_jwk(key))


def _swap(path: Path, data: bytes) -> None:
    """Replaces a file as Kubernetes swaps a Secret volume: a new inode."""
    tmp = path.with_suffix(".swap")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _leaked(key: Any, **claims: Any) -> str:
    """What the holder of a leaked etcd JWT key mints once: a token valid until 2100."""
    return pyjwt.encode({"username": "root", "revision": 1, "exp": YEAR_2100, **claims}, _priv_pem(key),
                        algorithm="ES256", headers={"kid": _kid(key)})


@pytest.fixture
def ec_keys() -> list[Any]:
    return [ec.generate_private_key(ec.SECP256R1()) for _ in range(3)]


# ---- the etcd JWT key in the proxy --------------------------------------------------------------


def test_proxy_cached_jwt_dies_with_its_rotated_out_key(tmp_path: Path, ec_keys: list[Any]) -> None:
    clock = Clock(1_000_000.0)
    priv, pub = tmp_path / "jwt.key", tmp_path / "jwt.pub"
    priv.write_bytes(_priv_pem(ec_keys[0]))
    pub.write_bytes(_pub_pem(ec_keys[0]))
    ring = KeyRing.from_files("ES256", str(priv), str(pub), retain_seconds=TTL, clock=clock, poll_interval=0)
    proxy = JwtProvider("ES256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)
    token = _leaked(ec_keys[0])
    assert proxy.verify(token) is not None  # verified, and cached
    _swap(priv, _priv_pem(ec_keys[1]))
    _swap(pub, _pub_pem(ec_keys[1]))
    assert proxy.sign("alice", 2)  # the signer now uses the new key
    clock.now += TTL - 1
    assert proxy.verify(token) is not None  # the retired key's documented grace: one TTL
    clock.now += 2
    assert proxy.verify(token) is None  # the key left the ring: so does every token it signed
    assert proxy.verify(token) is None


def test_proxy_cached_jwt_dies_when_the_key_file_rotates_without_a_signature(tmp_path: Path,
                                                                           ec_keys: list[Any]) -> None:
    """A verify-only proxy (pub-key only): nothing it does signs or polls except verifying."""
    clock = Clock(1_000_000.0)
    pub = tmp_path / "jwt.pub"
    pub.write_bytes(_pub_pem(ec_keys[0]))
    ring = KeyRing.from_files("ES256", None, str(pub), retain_seconds=TTL, clock=clock, poll_interval=0)
    proxy = JwtProvider("ES256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring)
    token = _leaked(ec_keys[0])
    assert proxy.verify(token) is not None
    _swap(pub, _pub_pem(ec_keys[1]))
    assert proxy.verify(token) is not None  # the retired key's grace, counted from when the change is seen
    clock.now += TTL + 1
    assert proxy.verify(token) is None


class _JwksServer:
    """Serves a JWKS document that a test changes; ``down`` answers 503."""

    def __init__(self) -> None:
        self.doc: dict[str, Any] = {"keys": []}
        self.down = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if outer.down:
                    self.send_error(503)
                    return
                data = json.dumps(outer.doc).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks.json"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def publish(self, *keys: Any) -> None:
        self.doc = {"keys": [{**public_jwk(k), "kid": _kid(k), "alg": "ES256", "use": "sig"} for k in keys]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def jwks_server() -> Iterator[_JwksServer]:
    server = _JwksServer()
    try:
        yield server
    finally:
        server.close()


def _follower(url: str, clock: Clock, mono: Clock) -> tuple[JwtProvider, JwksFollower]:
    ring = KeyRing("ES256", KeyMaterial(None, ()), retain_seconds=TTL, clock=clock, monotonic=mono)
    follower = JwksFollower(ring, url, min_interval=0, monotonic=mono)
    return JwtProvider("ES256", ttl_ns=int(TTL * 1e9), clock=clock, keys=ring, follower=follower), follower


def test_proxy_following_a_jwks_url_drops_cached_tokens_of_a_key_the_signer_removed(
        jwks_server: _JwksServer, ec_keys: list[Any]) -> None:
    clock, mono = Clock(1_000_000.0), Clock(50.0)
    proxy, follower = _follower(jwks_server.url, clock, mono)
    jwks_server.publish(ec_keys[0])
    token = _leaked(ec_keys[0])

    async def go() -> None:
        assert await follower.refresh()
        assert proxy.verify(token) is not None  # verified, and cached
        jwks_server.publish(ec_keys[1])  # the signer's retirement grace is over: the key is gone
        assert await follower.refresh()
        assert proxy.verify(token) is None

    asyncio.run(go())


def test_proxy_stops_trusting_jwks_url_keys_it_cannot_refresh(jwks_server: _JwksServer, ec_keys: list[Any],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Fetched keys that cannot be refreshed for a bounded time stop verifying (cached tokens too);
    the failure is logged once, not once per attempt; keys come back with the next good fetch."""
    clock, mono = Clock(1_000_000.0), Clock(50.0)
    proxy, follower = _follower(jwks_server.url, clock, mono)
    jwks_server.publish(ec_keys[0])
    token = _leaked(ec_keys[0])

    async def go() -> None:
        assert await follower.refresh()
        assert proxy.verify(token) is not None
        jwks_server.down = True
        with caplog.at_level(logging.WARNING, logger="raftgate.jwt_keys"):
            for _ in range(3):
                mono.now += 60
                assert not await follower.refresh()
            assert proxy.verify(token) is not None  # a short outage: the keys fetched before still verify
            mono.now += DAY
            assert not await follower.refresh()
            assert proxy.verify(token) is None  # not refreshed for a day: no longer trusted
            assert not await follower.refresh()
        failures = [r for r in caplog.records if "not refreshed" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in caplog.records]
        jwks_server.down = False
        assert await follower.refresh()
        assert proxy.verify(token) is not None

    asyncio.run(go())


# ---- the etcd JWT key in the store's sidecar verifier -------------------------------------------


def test_store_cached_jwt_dies_with_its_rotated_out_key(tmp_path: Path, ec_keys: list[Any]) -> None:
    clock = Clock(1_000_000.0)
    priv = tmp_path / "jwt.key"
    priv.write_bytes(_priv_pem(ec_keys[0]))
    store = JwtKeys.from_files("ES256", str(priv), None, ttl_seconds=TTL, clock=clock, poll_interval=0)
    token = _leaked(ec_keys[0])
    assert asyncio.run(store.verify(token)) is not None
    _swap(priv, _priv_pem(ec_keys[1]))
    assert asyncio.run(store.verify(token)) is not None  # the retired key's grace (and cached again)
    clock.now += TTL - 1
    assert asyncio.run(store.verify(token)) is not None
    clock.now += 2
    assert asyncio.run(store.verify(token)) is None
    assert asyncio.run(store.verify(store.sign("app", 3))) is not None


def test_store_cached_jwt_dies_with_a_key_removed_from_its_pub_key_jwks(tmp_path: Path, ec_keys: list[Any]) -> None:
    """Verify-only store (a JWKS ``pub-key``): a removed key's tokens go after the grace."""
    clock = Clock(1_000_000.0)
    jwks = tmp_path / "jwks.json"

    def publish(*keys: Any) -> None:
        _swap(jwks, json.dumps({"keys": [{**public_jwk(k), "kid": _kid(k), "alg": "ES256"} for k in keys]}).encode())

    publish(ec_keys[0], ec_keys[1])
    store = JwtKeys.from_files("ES256", None, str(jwks), ttl_seconds=TTL, clock=clock, poll_interval=0)
    token = _leaked(ec_keys[0])
    assert asyncio.run(store.verify(token)) is not None
    publish(ec_keys[1])
    assert asyncio.run(store.verify(token)) is not None  # the grace, counted from when the change is seen
    clock.now += TTL + 1
    assert asyncio.run(store.verify(token)) is None
    assert asyncio.run(store.verify(_leaked(ec_keys[1]))) is not None


# ---- workload identity --------------------------------------------------------------------------


def _jwks_doc(*pairs: tuple[str, Any]) -> bytes:
    return json.dumps({"keys": [rsa_jwk(key, kid) for kid, key in pairs]}).encode()


def _workload(tmp_path: Path, issuer_url: str, keys: KeySet) -> WorkloadVerifier:
    rules = tmp_path / "map.json"
    rules.write_text(json.dumps(RULES))
    return WorkloadVerifier(issuer_url, AUDIENCE, keys, UserMapFile(str(rules), poll_interval=0))


def _refused(v: WorkloadVerifier, token: str) -> str:
    assert v.cached(token) is None
    with pytest.raises(WorkloadRefused) as err:
        v.verify(token)
    assert asyncio.run(WorkloadTokens(v).verify(token)) is None  # the store's path, same verifier
    return str(err.value)


def _accepted(v: WorkloadVerifier, token: str) -> None:
    assert v.verify(token).user == "shop"
    assert asyncio.run(WorkloadTokens(v).verify(token)) is not None


@pytest.fixture(scope="module")
def issuer() -> Iterator[TestIssuer]:
    with running_issuer() as it:
        yield it


def _long_token(issuer: TestIssuer, iss: str, kid: str = "k1", key: Any = None) -> str:
    return issuer.token("system:serviceaccount:shop:cart", iss=iss, kid=kid, key=key, lifetime=30 * DAY)


@pytest.mark.parametrize("change", ["rotate", "delete", "corrupt", "huge"])
def test_workload_cached_result_dies_with_the_jwks_file(tmp_path: Path, issuer: TestIssuer, change: str) -> None:
    mono = Clock(100.0)
    path = tmp_path / "jwks.json"
    path.write_bytes(_jwks_doc(("k1", rsa_key(0)), ("k2", rsa_key(1))))
    keys = KeySet(FileSource(str(path)), clock=mono)
    keys.load()
    v = _workload(tmp_path, "https://issuer.test", keys)
    token = _long_token(issuer, "https://issuer.test")
    _accepted(v, token)
    assert v.cached(token) is not None
    if change == "rotate":
        _swap(path, _jwks_doc(("k2", rsa_key(1))))
    elif change == "delete":
        path.unlink()
    elif change == "huge":  # the same keys, padded over the size bound
        _swap(path, _jwks_doc(("k1", rsa_key(0))) + b" " * (300 * 1024))
    else:
        _swap(path, b'{"keys": [{"kty": "RSA", "kid": "k1"')
    mono.now += FileSource.max_age + 1  # the file is looked at again
    _refused(v, token)
    mono.now += DAY  # and never comes back by itself
    _refused(v, token)
    if change == "rotate":  # the key that stayed still verifies
        _accepted(v, _long_token(issuer, "https://issuer.test", kid="k2", key=rsa_key(1)))


def test_workload_cached_result_dies_with_a_key_the_issuer_removed(tmp_path: Path) -> None:
    mono = Clock(100.0)
    with running_issuer() as it:
        it.keys["k2"] = rsa_key(1)
        it.published.append(rsa_jwk(rsa_key(1), "k2"))
        keys = KeySet(DiscoverySource(it.url, Fetcher()), clock=mono, refetch_interval=30.0)
        v = _workload(tmp_path, it.url, keys)
        token = _long_token(it, it.url)
        _accepted(v, token)
        it.published.pop(0)  # the issuer rotates k1 out
        mono.now += keys.max_age + 1
        _refused(v, token)
        _accepted(v, _long_token(it, it.url, kid="k2"))


def test_workload_keys_the_issuer_no_longer_serves_are_trusted_for_a_bounded_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An issuer that cannot be reached: its keys keep verifying for a while (an outage is not a
    rotation), then not; the failure is logged once; they come back with the issuer."""
    mono = Clock(100.0)
    with running_issuer() as it:
        keys = KeySet(DiscoverySource(it.url, Fetcher()), clock=mono)
        v = _workload(tmp_path, it.url, keys)
        token = _long_token(it, it.url)
        _accepted(v, token)
        published = list(it.published)
        it.published.clear()  # no usable key any more: every refresh fails
        try:
            with caplog.at_level(logging.WARNING, logger="raftgate.workload_identity"):
                for _ in range(3):
                    mono.now += keys.max_age + 1
                    _accepted(v, token)  # still within the bound: the keys fetched before
                mono.now += DAY
                _refused(v, token)
                mono.now += keys.max_age + 1
                _refused(v, token)
            failures = [r for r in caplog.records if "cannot fetch keys" in r.getMessage()]
            assert len(failures) == 1, [r.getMessage() for r in caplog.records]
        finally:
            it.published[:] = published
        mono.now += keys.max_age + 1
        _accepted(v, token)


@pytest.mark.parametrize("change", ["delete", "corrupt", "invalid", "huge"])
def test_an_unusable_user_map_fails_closed(tmp_path: Path, issuer: TestIssuer, change: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "jwks.json"
    path.write_bytes(_jwks_doc(("k1", rsa_key(0))))
    keys = KeySet(FileSource(str(path)))
    keys.load()
    v = _workload(tmp_path, "https://issuer.test", keys)
    rules = tmp_path / "map.json"
    token = _long_token(issuer, "https://issuer.test")
    _accepted(v, token)
    with caplog.at_level(logging.WARNING, logger="raftgate.workload_identity"):
        if change == "delete":
            rules.unlink()
        elif change == "corrupt":
            _swap(rules, b"[{not json")
        elif change == "huge":  # valid JSON, over the size bound
            _swap(rules, json.dumps(RULES + [{"match": "x" * 1024, "user": "y"}] * 300).encode())
        else:
            _swap(rules, b'[{"match": "system:serviceaccount:shop:*"}]')
        for _ in range(3):
            assert "user map" in _refused(v, token)
    errors = [r for r in caplog.records if "user map" in r.getMessage()]
    assert len(errors) == 1 and errors[0].levelno >= logging.ERROR, [r.getMessage() for r in caplog.records]
    _swap(rules, json.dumps(RULES).encode())  # a valid map is back
    _accepted(v, token)
