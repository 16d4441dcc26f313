"""The store's JWT verifier (raftgate/token_verifier.py ``JwtKeys``) is the proxy's key ring
(raftgate/jwt_keys.py): its keys rotate when the files change, old tokens verify until the TTL."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import jwt as pyjwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

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
