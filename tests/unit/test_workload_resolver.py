"""The proxy's side of workload identity (proxy/identity.py): a verified workload token becomes the
mapped user at the store's current auth revision, marked re-resolvable; refusals name no token."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from protos.etcdserverpb import raft_internal_pb2
from protos.storepb import store_pb2
from proxy.identity import UNRESOLVED, Resolver
from proxy.pipeline import stamp
from proxy.tokens.jwt import JwtProvider
from raftgate.methods import METHODS
from raftgate.workload_identity import build
from tests.support.oidc_issuer import AUDIENCE, TestIssuer, running_issuer

RULES = [{"match": "system:serviceaccount:shop:*", "user": "shop"},
         {"match": "system:serviceaccount:gone:*", "user": "nobody"}]


class Store:
    """The one store call a workload resolution makes: Credentials (does the user exist, at which revision)."""

    def __init__(self) -> None:
        self.users = {"shop"}
        self.revision = 7
        self.calls = 0

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        self.calls += 1
        return store_pb2.CredentialsResponse(auth_enabled=True, auth_revision=self.revision, found=name in self.users)


@pytest.fixture(scope="module")
def issuer() -> Iterator[TestIssuer]:
    with running_issuer() as it:
        yield it


def resolver(issuer: TestIssuer, tmp_path: Path, store: Store, jwt: JwtProvider | None = None) -> Resolver:
    rules = tmp_path / "map.json"
    rules.write_text(json.dumps(RULES))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps(issuer.jwks()))
    verifier = build(issuer.url, AUDIENCE, jwks_file=str(jwks), ca_file=None, user_map_file=str(rules))
    return Resolver(store, jwt=jwt, simple=None, workload=verifier)  # type: ignore[arg-type]


def test_a_workload_token_is_the_mapped_user_at_the_current_revision(issuer: TestIssuer, tmp_path: Path) -> None:
    store = Store()
    r = resolver(issuer, tmp_path, store)
    token = issuer.token("system:serviceaccount:shop:cart")

    async def go() -> None:
        identity = await r.resolve(token, defer_invalid=True)
        assert (identity.username, identity.revision, identity.reresolvable) == ("shop", 7, True)
        assert identity.expires_at is not None
        put = next(m for m in METHODS if m.service == "KV" and m.name == "Put")
        header = raft_internal_pb2.InternalRaftRequest.FromString(stamp(identity, put, b"")).header
        assert header.simple_token  # revocable: refused as old after any auth change, then resolved again
        assert store.calls == 1
        assert await r.resolve(token) == identity  # cached: no store call within a second
        assert store.calls == 1
        store.revision = 8  # an auth change; the store said "old revision": resolve again
        r.invalidate(identity)
        assert (await r.resolve(token)).revision == 8
        assert store.calls == 2

    asyncio.run(go())


def test_refusals_are_invalid_auth_token_and_log_no_token(issuer: TestIssuer, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    r = resolver(issuer, tmp_path, Store())
    tokens = [issuer.token("system:serviceaccount:gone:x"),  # mapped, but no such user in the store
              issuer.token("system:serviceaccount:bank:x"),  # no rule
              issuer.token(aud="other"), issuer.token(lifetime=-1)]

    async def go() -> None:
        for token in tokens:
            assert await r.resolve(token, defer_invalid=True) is UNRESOLVED

    with caplog.at_level(logging.INFO):
        asyncio.run(go())
    text = caplog.text
    assert "not in the auth store" in text and "no rule maps" in text and "wrong audience" in text
    assert "expired" in text
    assert not any(token in text for token in tokens)


def test_raftgate_jwts_still_go_to_the_jwt_provider(issuer: TestIssuer, tmp_path: Path) -> None:
    provider = JwtProvider("RS256", private_key=_pem(issuer))
    r = resolver(issuer, tmp_path, Store(), jwt=provider)
    own = provider.sign("alice", 3)

    async def go() -> None:
        identity = await r.resolve(own)
        assert (identity.username, identity.revision, identity.reresolvable) == ("alice", 3, False)
        # signed by the issuer's key but claiming another issuer: not a workload token, not a raftgate one
        assert await r.resolve(issuer.token(iss="https://other.example"), defer_invalid=True) is UNRESOLVED

    asyncio.run(go())


def _pem(issuer: TestIssuer) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return issuer.keys["k1"].private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
