"""A watch opened through a sidecar ends when its token stops verifying (issue 21, item 3).

The store verifies the token a sidecar forwards when each watch request arrives. It must also
judge it again while the stream's watches are open, as the central proxy does for the tokens it
verifies itself: once the token's key is rotated out (past the retirement TTL), its ``exp``
passes, or its workload user-map rule is gone, the watches end with etcd's ``invalid auth token``
cancel. A sidecar is not trusted to end them itself: the ``exp`` case is also tried straight at
the store's WatchBatches stream with only the sidecar secret, as a compromised sidecar would hold
a watch open.

One store (etcd JWTs with its key files and a 3 s TTL, workload tokens with a JWKS file and a
user map), a central proxy for the set-up, and a ``raftgate proxy --sidecar``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization as s
from cryptography.hazmat.primitives.asymmetric import ec

from authstore.api.watch.hub import MAX_TOKENS_PER_STREAM
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err, EtcdError
from raftgate.jwt_keys import jwk_thumbprint, public_jwk
from raftgate.secret_proof import proving_channel
from tests.support.oidc_issuer import AUDIENCE, rsa_key
from tests.support.oidc_issuer import public_jwk as rsa_jwk
from tests.support.processes import wait_for
from tests.support.rotating_keys import ISSUER, SIDECAR_SECRET, Cluster, jwt_files, rotating_key_cluster, swap

pytestmark = pytest.mark.slow

WATCH_BATCHES = "/raftgate.storepb.Store/WatchBatches"
YEAR_2100 = 4102444800
#: how long a watch may take to end: the TTL, the file polls, the re-check interval, a loaded machine
ENDS_WITHIN = 60.0
INVALID_TOKEN = EtcdError(Err.INVALID_AUTH_TOKEN).status_string()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with rotating_key_cluster(tmp_path_factory.mktemp("sidecar-watch-token"), [rsa_jwk(rsa_key(0), "k1")]) as built:
        yield built


def _answer(channel: grpc.Channel, token: str) -> tuple[grpc.StatusCode, str]:
    """A Range as the token's holder on a key app may not read: a verified token gets permission denied."""
    try:
        rpc_pb2_grpc.KVStub(channel).Range(rpc_pb2.RangeRequest(key=b"k"), metadata=(("token", token),), timeout=10)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _auth_revision(cluster: Cluster) -> int:
    return rpc_pb2_grpc.AuthStub(cluster.central).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10).authRevision


def _mint(cluster: Cluster, key: Any, exp: int) -> str:
    return pyjwt.encode({"username": "app", "revision": _auth_revision(cluster), "exp": exp},
                        key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()),
                        algorithm="ES256", headers={"kid": jwk_thumbprint(public_jwk(key))})


def _key_in_force(cluster: Cluster) -> Any:
    """A fresh signing key written to the files, once the store verifies what it signs."""
    key = ec.generate_private_key(ec.SECP256R1())
    jwt_files(cluster.work, key)
    probe = _mint(cluster, key, YEAR_2100)
    wait_for(lambda: _answer(cluster.sidecar, probe) == Err.PERMISSION_DENIED.value, timeout=ENDS_WITHIN,
             what="the store to take the new key", interval=0.2)
    return key


def _sidecar_watch(cluster: Cluster, token: str, key: bytes) -> Any:
    """A watch on ``key`` through the sidecar proxy, created; the stream is returned open."""
    create = rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=key))
    stream = rpc_pb2_grpc.WatchStub(cluster.sidecar).Watch(iter([create]), metadata=(("token", token),),
                                                           timeout=ENDS_WITHIN * 2)
    created = next(stream)
    assert created.created and not created.canceled, created
    return stream


def _ended(stream: Any) -> rpc_pb2.WatchResponse:
    """The next answer of a stream no event can reach (nobody writes its key): its cancel."""
    ended = next(stream)
    assert (ended.canceled, ended.cancel_reason) == (True, INVALID_TOKEN), ended
    return ended


def test_a_sidecar_watch_ends_when_its_jwt_key_is_rotated_out(cluster: Cluster) -> None:
    leaked = _key_in_force(cluster)
    stream = _sidecar_watch(cluster, _mint(cluster, leaked, YEAR_2100), b"app/rotated")
    try:
        jwt_files(cluster.work, ec.generate_private_key(ec.SECP256R1()))  # the operator rotates
        _ended(stream)
    finally:
        stream.cancel()


def test_a_sidecar_watch_ends_when_its_workload_rule_is_gone(cluster: Cluster) -> None:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": [AUDIENCE], "sub": "system:serviceaccount:shop:web", "iat": now, "nbf": now,
              "exp": now + 30 * 86400}
    token = pyjwt.encode(claims, rsa_key(0), algorithm="RS256", headers={"kid": "k1"})
    stream = _sidecar_watch(cluster, token, b"app/workload")
    rules = (cluster.work / "user-map.json").read_bytes()
    try:
        swap(cluster.work / "user-map.json", b"[]")  # the rule that mapped the pod is removed
        _ended(stream)
    finally:
        stream.cancel()
        swap(cluster.work / "user-map.json", rules)


def test_a_sidecar_watch_ends_at_its_jwts_exp(cluster: Cluster) -> None:
    key = _key_in_force(cluster)
    exp = int(time.time()) + 6
    stream = _sidecar_watch(cluster, _mint(cluster, key, exp), b"app/exp")
    try:
        _ended(stream)
        assert time.time() >= exp  # never before it
    finally:
        stream.cancel()


def test_a_watch_a_sidecar_holds_open_past_exp_is_ended_by_the_store(cluster: Cluster) -> None:
    """Straight at the store with the sidecar secret: a caller that never cancels anything itself
    (a compromised sidecar) still loses the watch at the token's ``exp``."""
    key = _key_in_force(cluster)
    exp = int(time.time()) + 6
    token = _mint(cluster, key, exp)
    create = rpc_pb2.WatchCreateRequest(key=b"app/held", watch_id=7)
    request = spb.WatchStreamRequest(request=rpc_pb2.WatchRequest(create_request=create), token=token)
    with grpc.insecure_channel(cluster.store) as base:
        ch = proving_channel(base, SIDECAR_SECRET)  # the sidecar secret, proven
        method = ch.stream_stream(WATCH_BATCHES, request_serializer=None, response_deserializer=None)
        done = threading.Event()

        def requests() -> Iterator[bytes]:
            yield request.SerializeToString()
            done.wait(ENDS_WITHIN * 2)  # the stream stays open, as a sidecar holding the watch keeps it

        answers = method(requests(), timeout=ENDS_WITHIN * 2)
        try:
            seen: list[rpc_pb2.WatchResponse] = []
            for raw in answers:
                seen += [rpc_pb2.WatchResponse.FromString(r) for r in spb.WatchBatch.FromString(raw).responses]
                if any(r.canceled for r in seen):
                    break
            created, ended = seen[0], seen[-1]
            assert (created.watch_id, created.created, created.canceled) == (7, True, False), created
            assert (ended.watch_id, ended.canceled, ended.cancel_reason) == (7, True, INVALID_TOKEN), ended
            assert time.time() >= exp
        finally:
            done.set()
            answers.cancel()


class _RawStream:
    """A WatchBatches stream straight at the store with the sidecar secret, kept open until closed."""

    def __init__(self, cluster: Cluster) -> None:
        self._channel = grpc.insecure_channel(cluster.store)
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        proving = proving_channel(self._channel, SIDECAR_SECRET)  # the sidecar secret, proven
        method = proving.stream_stream(WATCH_BATCHES, request_serializer=None, response_deserializer=None)
        self._answers = method(iter(self._requests.get, None), timeout=ENDS_WITHIN * 2)
        self._seen: list[rpc_pb2.WatchResponse] = []

    def send(self, token: str, **request: Any) -> None:
        self._requests.put(spb.WatchStreamRequest(request=rpc_pb2.WatchRequest(**request),
                                                  token=token).SerializeToString())

    def create(self, token: str, key: bytes, watch_id: int) -> None:
        self.send(token, create_request=rpc_pb2.WatchCreateRequest(key=key, watch_id=watch_id))

    def next(self) -> rpc_pb2.WatchResponse:
        while not self._seen:
            raw = next(self._answers)
            self._seen += [rpc_pb2.WatchResponse.FromString(r) for r in spb.WatchBatch.FromString(raw).responses]
        return self._seen.pop(0)

    def close(self) -> None:
        self._requests.put(None)
        self._answers.cancel()
        self._channel.close()


def test_one_stream_ends_only_the_watches_of_the_token_that_died(cluster: Cluster) -> None:
    """A stream holding watches made with two tokens: the one whose exp passes loses its watch;
    the other's watch is still open (the caller's own cancel gets an ordinary answer)."""
    key = _key_in_force(cluster)
    short, long = _mint(cluster, key, int(time.time()) + 6), _mint(cluster, key, YEAR_2100)
    stream = _RawStream(cluster)
    try:
        stream.create(long, b"app/long", 1)
        stream.create(short, b"app/short", 2)
        for watch_id in (1, 2):
            created = stream.next()
            assert (created.watch_id, created.created, created.canceled) == (watch_id, True, False), created
        ended = stream.next()
        assert (ended.watch_id, ended.canceled, ended.cancel_reason) == (2, True, INVALID_TOKEN), ended
        stream.send(long, cancel_request=rpc_pb2.WatchCancelRequest(watch_id=1))
        asked = stream.next()
        assert (asked.watch_id, asked.canceled, asked.cancel_reason) == (1, True, ""), asked
    finally:
        stream.close()


def test_one_stream_holds_a_bounded_number_of_tokens(cluster: Cluster) -> None:
    """Each distinct token a stream's watches hold is judged again every interval: past the bound,
    a create with one more is refused (etcd's ``too many requests``); one with a held token is not."""
    key = _key_in_force(cluster)
    tokens = [_mint(cluster, key, YEAR_2100 - i) for i in range(MAX_TOKENS_PER_STREAM + 1)]
    stream = _RawStream(cluster)
    try:
        for i, token in enumerate(tokens):
            stream.create(token, f"app/t{i}".encode(), i + 1)
        for i in range(MAX_TOKENS_PER_STREAM):
            created = stream.next()
            assert (created.watch_id, created.created, created.canceled) == (i + 1, True, False), created
        refused = stream.next()
        assert (refused.watch_id, refused.created, refused.canceled) == (-1, True, True), refused
        assert refused.cancel_reason == EtcdError(Err.TOO_MANY_REQUESTS).status_string()
        stream.create(tokens[0], b"app/again", 100)
        again = stream.next()
        assert (again.watch_id, again.created, again.canceled) == (100, True, False), again
    finally:
        stream.close()
