"""A leaked key stops working once it is rotated out, on every path (issue 21, item 3).

One store (it verifies what sidecars forward: etcd JWTs with its key files, workload tokens with a
JWKS file and a user map), a central proxy reading the same files, and a ``--sidecar`` proxy. A
token is used on both paths first (so both cached it), then its key is rotated out of the files,
or the user map is deleted: both paths must refuse it within the retirement TTL (3 s here), even
though its ``exp`` is years away. Before the fix, the caches answered it until its ``exp``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import grpc
import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.errors import Err
from raftgate.jwt_keys import jwk_thumbprint, public_jwk
from tests.support.oidc_issuer import AUDIENCE, rsa_key
from tests.support.oidc_issuer import public_jwk as rsa_jwk
from tests.support.processes import wait_for
from tests.support.rotating_keys import ISSUER, Cluster, jwt_files, rotating_key_cluster, swap

pytestmark = pytest.mark.slow

YEAR_2100 = 4102444800
#: how long a path may take to refuse: the TTL, the file polls, a loaded machine
REFUSED_WITHIN = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    keys = [rsa_jwk(rsa_key(0), "k1"), rsa_jwk(rsa_key(1), "k2")]
    with rotating_key_cluster(tmp_path_factory.mktemp("rotated-key-cache"), keys) as built:
        yield built


def _answer(channel: grpc.Channel, token: str) -> tuple[grpc.StatusCode, str]:
    """A Range as the token's holder (app has no permission: a verified token gets permission denied)."""
    try:
        rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=b"k"), metadata=(("token", token),), timeout=10)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _verified(cluster: Cluster, token: str) -> None:
    for channel in (cluster.central, cluster.sidecar):
        assert _answer(channel, token) == Err.PERMISSION_DENIED.value


def _refused_everywhere(cluster: Cluster, token: str, what: str) -> None:
    for name, channel in (("central proxy", cluster.central), ("sidecar through the store", cluster.sidecar)):
        wait_for(lambda ch=channel: _answer(ch, token) == Err.INVALID_AUTH_TOKEN.value, timeout=REFUSED_WITHIN,
                 what=f"the {name} to refuse a token {what}", interval=0.2)


def _auth_revision(cluster: Cluster) -> int:
    return rpc_pb2_grpc.AuthStub(cluster.central).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10).authRevision


def test_a_leaked_etcd_jwt_key_dies_with_its_rotation(cluster: Cluster) -> None:
    leaked = ec.generate_private_key(ec.SECP256R1())
    jwt_files(cluster.work, leaked)  # the key in force when it leaked
    minted = pyjwt.encode({"username": "app", "revision": _auth_revision(cluster), "exp": YEAR_2100},
                          leaked.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()),
                          algorithm="ES256", headers={"kid": jwk_thumbprint(public_jwk(leaked))})
    wait_for(lambda: _answer(cluster.central, minted) == Err.PERMISSION_DENIED.value
             and _answer(cluster.sidecar, minted) == Err.PERMISSION_DENIED.value, timeout=REFUSED_WITHIN,
             what="both paths to take the leaked key", interval=0.2)
    for _ in range(3):
        _verified(cluster, minted)  # used, and cached, on both paths
    jwt_files(cluster.work, ec.generate_private_key(ec.SECP256R1()))  # the operator rotates
    _refused_everywhere(cluster, minted, "signed with a key rotated out")
    fresh = rpc_pb2_grpc.AuthStub(cluster.central).Authenticate(
        rpc_pb2.AuthenticateRequest(name="app", password="apppw"), timeout=10).token
    _verified(cluster, fresh)  # the new key works on both paths


def test_a_watch_opened_with_a_leaked_key_ends_with_its_rotation(cluster: Cluster) -> None:
    """A stream opened with the token before the rotation keeps no watch once the key is gone
    (the central proxy verifies JWTs itself; it re-checks its open streams' tokens)."""
    leaked = ec.generate_private_key(ec.SECP256R1())
    jwt_files(cluster.work, leaked)
    minted = pyjwt.encode({"username": "app", "revision": _auth_revision(cluster), "exp": YEAR_2100},
                          leaked.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()),
                          algorithm="ES256", headers={"kid": jwk_thumbprint(public_jwk(leaked))})
    wait_for(lambda: _answer(cluster.central, minted) == Err.PERMISSION_DENIED.value, timeout=REFUSED_WITHIN,
             what="the central proxy to take the leaked key", interval=0.2)
    create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"app/w"))
    stream = rpc_pb2_grpc.WatchStub(cluster.central).Watch(iter([create]), metadata=(("token", minted),),
                                                           timeout=REFUSED_WITHIN * 2)
    try:
        created = next(stream)
        assert created.created and not created.canceled
        jwt_files(cluster.work, ec.generate_private_key(ec.SECP256R1()))  # the operator rotates
        ended = next(stream)  # no event can come: nobody writes app/w
        assert ended.canceled and "invalid auth token" in ended.cancel_reason
    finally:
        stream.cancel()


def test_a_sidecar_watch_opened_with_a_leaked_key_ends_with_its_rotation(cluster: Cluster) -> None:
    """The same through a sidecar: the store verified the token when the watch was created; once
    the key is rotated out, the watch must end as it does through a central proxy (else a leaked
    key, used once, reads a prefix's every change for as long as the stream stays open)."""
    leaked = ec.generate_private_key(ec.SECP256R1())
    jwt_files(cluster.work, leaked)
    minted = pyjwt.encode({"username": "app", "revision": _auth_revision(cluster), "exp": YEAR_2100},
                          leaked.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()),
                          algorithm="ES256", headers={"kid": jwk_thumbprint(public_jwk(leaked))})
    wait_for(lambda: _answer(cluster.sidecar, minted) == Err.PERMISSION_DENIED.value, timeout=REFUSED_WITHIN,
             what="the store to take the leaked key", interval=0.2)
    create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"app/w"))
    stream = rpc_pb2_grpc.WatchStub(cluster.sidecar).Watch(iter([create]), metadata=(("token", minted),),
                                                           timeout=REFUSED_WITHIN * 2)
    try:
        created = next(stream)
        assert created.created and not created.canceled
        jwt_files(cluster.work, ec.generate_private_key(ec.SECP256R1()))  # the operator rotates
        _refused_everywhere(cluster, minted, "signed with a key rotated out")
        ended = next(stream)  # no event can come: nobody writes app/w
        assert ended.canceled and "invalid auth token" in ended.cancel_reason, ended
    finally:
        stream.cancel()


def _workload_token(kid: str, key_number: int) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": [AUDIENCE], "sub": "system:serviceaccount:shop:web", "iat": now, "nbf": now,
              "exp": now + 30 * 86400}
    return pyjwt.encode(claims, rsa_key(key_number), algorithm="RS256", headers={"kid": kid})


def test_a_workload_key_removed_from_the_jwks_file_stops_verifying(cluster: Cluster) -> None:
    token = _workload_token("k1", 0)
    for _ in range(3):
        _verified(cluster, token)
    swap(cluster.work / "jwks.json", json.dumps({"keys": [rsa_jwk(rsa_key(1), "k2")]}).encode())
    _refused_everywhere(cluster, token, "signed with a key removed from the JWKS file")
    _verified(cluster, _workload_token("k2", 1))


def test_a_deleted_user_map_refuses_workload_tokens_until_it_is_back(cluster: Cluster) -> None:
    token = _workload_token("k2", 1)
    for _ in range(3):
        _verified(cluster, token)
    rules = (cluster.work / "user-map.json").read_bytes()
    (cluster.work / "user-map.json").unlink()
    try:
        _refused_everywhere(cluster, token, "mapped by a user map that was deleted")
    finally:
        swap(cluster.work / "user-map.json", rules)
    wait_for(lambda: _answer(cluster.central, token) == Err.PERMISSION_DENIED.value
             and _answer(cluster.sidecar, token) == Err.PERMISSION_DENIED.value, timeout=REFUSED_WITHIN,
             what="workload tokens to work again with the map back", interval=0.2)
