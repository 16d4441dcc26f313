"""The store's JWT verifier (raftgate/token_verifier.py ``JwtKeys``) is the proxy's key ring
(raftgate/jwt_keys.py): its keys rotate when the files change, old tokens verify until the TTL."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import jwt as pyjwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from proxy.tokens.jwt import JwtProvider
from raftgate.token_verifier import JwtKeys


def _write_key(path: Path) -> bytes:
    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    tmp = path.with_suffix(".new")
    tmp.write_bytes(pem)
    os.replace(tmp, path)  # as Kubernetes swaps a Secret volume: a new inode
    return pem


def test_store_jwt_keys_rotate_with_their_files(tmp_path: Path) -> None:
    key = tmp_path / "jwt.key"
    first = _write_key(key)
    keys = JwtKeys.from_files("ES256", str(key), None, ttl_seconds=300, poll_interval=0)
    old = keys.sign("app", 7)
    assert asyncio.run(keys.verify(old)) is not None
    second = _write_key(key)
    new = keys.sign("app", 8)  # signed with the new key, named by its kid
    assert pyjwt.get_unverified_header(new)["kid"] != pyjwt.get_unverified_header(old)["kid"]
    found = asyncio.run(keys.verify(new))
    assert found is not None and (found.username, found.revision) == ("app", 8)
    assert asyncio.run(keys.verify(old)) is not None  # the retired key verifies until the TTL
    forged = pyjwt.encode({"username": "root", "revision": 8, "exp": 4102444800},
                          ec.generate_private_key(ec.SECP256R1()), algorithm="ES256")
    assert asyncio.run(keys.verify(forged)) is None
    assert first != second


CLAIMS_TABLE = [
    ({"username": "app", "revision": 3, "exp": 2_000_000_000}, ("app", 3)),
    ({"username": "app", "revision": 3}, ("app", 3)),  # no exp: never expires, as in etcd
    ({"username": "app", "revision": 3.0, "exp": 2_000_000_000}, ("app", 3)),
    ({"username": "app", "revision": 3.5, "exp": 2_000_000_000}, None),
    ({"username": "app", "revision": -1}, None),
    ({"username": "app", "revision": 2**64}, None),
    ({"username": "app", "revision": True}, None),
    ({"username": 7, "revision": 3}, None),
    ({"revision": 3}, None),
    ({"username": "app", "revision": 3, "exp": 1_000}, None),  # expired
    ({"username": "app", "revision": 3, "exp": "2000000000"}, None),
    ({"username": "app", "revision": 3, "nbf": 2_000_000_000}, None),  # not yet valid
    ({"username": "app", "revision": 3, "nbf": 1_000}, ("app", 3)),
]


def test_proxy_and_store_judge_etcd_claims_alike(tmp_path: Path) -> None:
    """One set of etcd claim rules: the proxy's provider and the store's keys give each token the same
    verdict (they share raftgate/token_verifier.py's engine; this keeps them from drifting apart)."""
    key = tmp_path / "jwt.key"
    pem = _write_key(key)
    store = JwtKeys.from_files("ES256", str(key), None, ttl_seconds=300, poll_interval=0)
    proxy = JwtProvider("ES256", private_key=pem, ttl_ns=300 * 10**9)
    signing = serialization.load_pem_private_key(pem, password=None)
    for claims, want in CLAIMS_TABLE:
        token = pyjwt.encode(claims, signing, algorithm="ES256")  # type: ignore[arg-type]
        by_store, by_proxy = store.verify_now(token), proxy.verify(token)
        got = [None if v is None else (v.username, v.revision) for v in (by_store, by_proxy)]
        assert got == [want, want], claims
    signed = proxy.sign("app", 9)  # the proxy's tokens verify at the store, and the store's at the proxy
    assert store.verify_now(signed) is not None and proxy.verify(store.sign("app", 9)) is not None
