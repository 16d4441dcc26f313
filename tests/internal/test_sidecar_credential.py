"""A sidecar's credential is not root (issue 12, item 6).

One store node with two classes of internal credential (development secrets here:
``--internal-secret-file`` for central proxies, ``--sidecar-secret-file`` for sidecars), a central
proxy with today's powers, and a ``raftgate proxy --sidecar`` holding only the sidecar secret. With
the sidecar secret, straight at the store's internal port: a stamped user name is ignored (the
store verifies the token itself), ``Credentials``/``ResolveToken`` are refused, a password-less
``authenticate`` entry is refused, store-only entries are refused. Through the sidecar proxy: a
wrong password gets etcd's answer, the right one a token the store minted; simple tokens (from
the central proxy) and JWTs are checked by the store with the right permissions; a revoked simple
token is refused; the central proxy works as before.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from protos import wire
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.internal import AUTHENTICATE_FIELD
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err
from raftgate.secret_proof import proving_channel
from tests.support.oidc_issuer import AUDIENCE, public_jwk, rsa_key
from tests.support.processes import (
    SECRET,
    Program,
    free_port,
    proxy_program,
    store_program,
    wait_for,
    wait_serving,
)

SIDECAR_SECRET = "sidecar-secret-for-tests-0123456789"
#: workload tokens: the store reads the issuer's keys from a JWKS file (never contacted here)
ISSUER = "https://issuer.invalid"
RULES = [{"match": "system:serviceaccount:shop:app", "user": "app"},
         {"match": "system:serviceaccount:ghost:*", "user": "ghost"}]  # no such user in the store
STORE = "/raftgate.storepb.Store/"
pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    store: str
    central: grpc.Channel
    sidecar: grpc.Channel
    identity: grpc.Channel
    priv_pem: bytes
    root_md: tuple[tuple[str, str], ...]
    audit: Path


def _pem_pair() -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return priv, pub


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("sidecar-credential")
    priv, pub = _pem_pair()
    (work / "jwt.key").write_bytes(priv)
    (work / "jwt.pub").write_bytes(pub)
    (work / "sidecar-secret").write_text(SIDECAR_SECRET)
    (work / "jwks.json").write_text(json.dumps({"keys": [public_jwk(rsa_key(0), "k1")]}))
    (work / "user-map.json").write_text(json.dumps(RULES))
    store, internal = store_program(
        work, "--sidecar-secret-file", str(work / "sidecar-secret"), "--auth-token",
        f"jwt,pub-key={work / 'jwt.pub'},priv-key={work / 'jwt.key'},sign-method=ES256", "--bcrypt-cost", "4",
        "--oidc-issuer", ISSUER, "--oidc-audience", AUDIENCE, "--oidc-jwks-file", str(work / "jwks.json"),
        "--oidc-user-map", str(work / "user-map.json"))
    started: list[Program] = []
    channels: list[grpc.Channel] = []
    try:
        store.start()
        started.append(store)
        central_port, sidecar_port, identity_port = free_port(), free_port(), free_port()
        central = proxy_program(work, internal, f"http://127.0.0.1:{central_port}")
        central.start()
        started.append(central)
        sidecar = Program(work / "sidecar", [
            "proxy", "--sidecar", "--listen-client-urls", f"http://127.0.0.1:{sidecar_port}", "--store-endpoints",
            internal, "--internal-secret-file", str(work / "sidecar-secret"), "--bcrypt-cost", "4",
            "--audit-log", str(work / "sidecar-audit.jsonl"), "--audit-level", "all"],
            "raftgate proxy:")
        sidecar.start()
        started.append(sidecar)
        # identity mode in a sidecar: it logs in with the password file; the store checks it
        (work / "identity").write_text("app\napppw\n")
        lending = Program(work / "identity-sidecar", [
            "proxy", "--sidecar", "--listen-client-urls", f"http://127.0.0.1:{identity_port}", "--store-endpoints",
            internal, "--internal-secret-file", str(work / "sidecar-secret"), "--identity-file",
            str(work / "identity")], "raftgate proxy:")
        lending.start()
        started.append(lending)
        wait_serving(f"127.0.0.1:{central_port}")
        wait_serving(f"127.0.0.1:{sidecar_port}")
        c = grpc.insecure_channel(f"127.0.0.1:{central_port}")
        s = grpc.insecure_channel(f"127.0.0.1:{sidecar_port}")
        i = grpc.insecure_channel(f"127.0.0.1:{identity_port}")
        channels += [c, s, i]
        auth = rpc_pb2_grpc.AuthStub(c)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="app", password="apppw"), timeout=10)
        auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="app"), timeout=10)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"app/", range_end=b"app0")
        auth.RoleGrantPermission(rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm), timeout=10)
        auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="app", role="app"), timeout=10)
        auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=10)
        token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw"), timeout=10).token
        yield Cluster(internal, c, s, i, priv, (("token", token),), work / "sidecar-audit.jsonl")
    finally:
        for ch in channels:
            ch.close()
        for p in reversed(started):
            p.stop()


# ---- straight at the store, with the sidecar secret ----


def _store_call(cluster: Cluster, method: str, body: bytes,
                secret: str = SIDECAR_SECRET) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(cluster.store) as ch:
        call = proving_channel(ch, secret).unary_unary(STORE + method, request_serializer=None,
                                                       response_deserializer=None)
        try:
            call(body, timeout=10)
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _stream_call(cluster: Cluster, method: int, body: bytes) -> tuple[int, str]:
    with grpc.insecure_channel(cluster.store) as ch:
        call = proving_channel(ch, SIDECAR_SECRET).stream_stream(STORE + "DoStream", request_serializer=None,
                                                                 response_deserializer=None)
        batch = spb.DoBatch(calls=[spb.DoCall(id=1, request=body, method=method)]).SerializeToString()
        answers = call(iter([batch]), timeout=10)
        for raw in answers:
            for result in spb.DoResultBatch.FromString(raw).results:
                return result.code, result.message
    raise AssertionError("no answer on DoStream")


def _auth_revision(cluster: Cluster) -> int:
    status = rpc_pb2_grpc.AuthStub(cluster.central).AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)
    return status.authRevision


def test_sidecar_cannot_read_password_hashes(cluster: Cluster) -> None:
    body = spb.CredentialsRequest(name="root").SerializeToString()
    assert _store_call(cluster, "Credentials", body)[0] == grpc.StatusCode.PERMISSION_DENIED
    code, _ = _stream_call(cluster, spb.DoCall.CREDENTIALS, body)
    assert code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    # the central credential still may (the central proxy's Authenticate needs it)
    assert _store_call(cluster, "Credentials", body, SECRET)[0] == grpc.StatusCode.OK


def test_sidecar_cannot_resolve_tokens_for_others(cluster: Cluster) -> None:
    body = spb.ResolveTokenRequest(token=cluster.root_md[0][1]).SerializeToString()
    assert _store_call(cluster, "ResolveToken", body)[0] == grpc.StatusCode.PERMISSION_DENIED
    code, _ = _stream_call(cluster, spb.DoCall.RESOLVE_TOKEN, body)
    assert code == grpc.StatusCode.PERMISSION_DENIED.value[0]


def test_stamped_user_name_is_ignored(cluster: Cluster) -> None:
    header = wire.encode_header("root", _auth_revision(cluster))
    put = rpc_pb2.PutRequest(key=b"stamped", value=b"v").SerializeToString()
    data = wire.build_internal_request(header, 4, put)
    assert _store_call(cluster, "Do", data) == Err.USER_EMPTY.value
    code, message = _stream_call(cluster, spb.DoCall.DO, data)
    assert (code, message) == (Err.USER_EMPTY.code.value[0], Err.USER_EMPTY.message)
    got = rpc_pb2_grpc.KVStub(cluster.central).Range(rpc_pb2.RangeRequest(key=b"stamped"), metadata=cluster.root_md,
                                                     timeout=10)
    assert got.count == 0


def test_passwordless_authenticate_is_refused(cluster: Cluster) -> None:
    entry = ipb.InternalAuthenticateRequest(name="root", simple_token="A" * 16,
                                            checked_revision=_auth_revision(cluster), ttl_seconds=300)
    data = wire.build_internal_request(None, AUTHENTICATE_FIELD, entry.SerializeToString())
    assert _store_call(cluster, "Do", data)[0] == grpc.StatusCode.PERMISSION_DENIED
    code, _ = _stream_call(cluster, spb.DoCall.DO, data)
    assert code == grpc.StatusCode.PERMISSION_DENIED.value[0]


def test_store_only_entries_are_refused(cluster: Cluster) -> None:
    data = ipb.InternalRaftRequest(expire_tokens=ipb.ExpireTokensRequest(token_digests=[b"x" * 32])).SerializeToString()
    assert _store_call(cluster, "Do", data)[0] == grpc.StatusCode.PERMISSION_DENIED


# ---- through the sidecar proxy ----


def _err(call: object, *args: object, **kw: object) -> tuple[grpc.StatusCode, str]:
    try:
        call(*args, timeout=10, **kw)  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def test_wrong_password_is_refused_as_by_etcd(cluster: Cluster) -> None:
    auth = rpc_pb2_grpc.AuthStub(cluster.sidecar)
    assert _err(auth.Authenticate, rpc_pb2.AuthenticateRequest(name="app", password="nope")) == Err.AUTH_FAILED.value
    assert _err(auth.Authenticate, rpc_pb2.AuthenticateRequest(name="ghost", password="x")) == Err.AUTH_FAILED.value


def _permissions_are_those_of_app(channel: grpc.Channel, md: tuple[tuple[str, str], ...]) -> None:
    kv = rpc_pb2_grpc.KVStub(channel)
    kv.Put(rpc_pb2.PutRequest(key=b"app/x", value=b"1"), metadata=md, timeout=10)
    assert _err(kv.Put, rpc_pb2.PutRequest(key=b"other", value=b"1"), metadata=md) == Err.PERMISSION_DENIED.value
    assert _err(rpc_pb2_grpc.AuthStub(channel).UserList, rpc_pb2.AuthUserListRequest(),
                metadata=md) == Err.PERMISSION_DENIED.value


def test_right_password_through_the_sidecar_gets_a_working_token(cluster: Cluster) -> None:
    auth = rpc_pb2_grpc.AuthStub(cluster.sidecar)
    token = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="app", password="apppw"), timeout=10).token
    assert token.count(".") == 2  # the store minted a JWT (it holds priv-key); the sidecar holds no key
    _permissions_are_those_of_app(cluster.sidecar, (("token", token),))


def test_jwt_checked_by_the_store(cluster: Cluster) -> None:
    rev = _auth_revision(cluster)
    good = pyjwt.encode({"username": "app", "revision": rev, "exp": 4102444800}, cluster.priv_pem, algorithm="ES256")
    _permissions_are_those_of_app(cluster.sidecar, (("token", good),))
    other, _ = _pem_pair()
    forged = pyjwt.encode({"username": "root", "revision": rev, "exp": 4102444800}, other, algorithm="ES256")
    kv = rpc_pb2_grpc.KVStub(cluster.sidecar)
    assert _err(kv.Put, rpc_pb2.PutRequest(key=b"app/y", value=b"1"),
                metadata=(("token", forged),)) == Err.INVALID_AUTH_TOKEN.value
    none_alg = ".".join(pyjwt.utils.base64url_encode(json.dumps(p).encode()).decode() for p in (
        {"alg": "none", "typ": "JWT"}, {"username": "root", "revision": rev})) + "."
    assert _err(kv.Put, rpc_pb2.PutRequest(key=b"app/y", value=b"1"),
                metadata=(("token", none_alg),)) == Err.INVALID_AUTH_TOKEN.value


def test_simple_token_checked_by_the_store_and_revoked(cluster: Cluster) -> None:
    central_auth = rpc_pb2_grpc.AuthStub(cluster.central)
    central_auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="temp", password="temppw"), metadata=cluster.root_md,
                         timeout=10)
    central_auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="temp", role="app"), metadata=cluster.root_md,
                               timeout=10)
    simple = central_auth.Authenticate(rpc_pb2.AuthenticateRequest(name="temp", password="temppw"), timeout=10).token
    assert simple.count(".") == 1  # the central proxy issues simple tokens
    md = (("token", simple),)
    _permissions_are_those_of_app(cluster.sidecar, md)
    central_auth.UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(name="temp", password="new"),
                                    metadata=cluster.root_md, timeout=10)
    kv = rpc_pb2_grpc.KVStub(cluster.sidecar)
    assert _err(kv.Put, rpc_pb2.PutRequest(key=b"app/z", value=b"1"), metadata=md) == Err.INVALID_AUTH_TOKEN.value


def test_no_token_is_anonymous(cluster: Cluster) -> None:
    kv = rpc_pb2_grpc.KVStub(cluster.sidecar)
    assert _err(kv.Put, rpc_pb2.PutRequest(key=b"app/a", value=b"1")) == Err.USER_EMPTY.value


def test_central_proxy_works_as_today(cluster: Cluster) -> None:
    kv = rpc_pb2_grpc.KVStub(cluster.central)
    kv.Put(rpc_pb2.PutRequest(key=b"central", value=b"v"), metadata=cluster.root_md, timeout=10)
    got = kv.Range(rpc_pb2.RangeRequest(key=b"central"), metadata=cluster.root_md, timeout=10)
    assert got.kvs[0].value == b"v"
    users = rpc_pb2_grpc.AuthStub(cluster.central).UserList(rpc_pb2.AuthUserListRequest(), metadata=cluster.root_md,
                                                             timeout=10)
    assert "root" in users.users


def test_identity_mode_in_a_sidecar_logs_in_through_the_store(cluster: Cluster) -> None:
    _permissions_are_those_of_app(cluster.identity, ())


def test_watch_through_the_sidecar_is_judged_by_the_store(cluster: Cluster) -> None:
    auth = rpc_pb2_grpc.AuthStub(cluster.sidecar)
    md = (("token", auth.Authenticate(rpc_pb2.AuthenticateRequest(name="app", password="apppw"), timeout=10).token),)
    watch = rpc_pb2_grpc.WatchStub(cluster.sidecar)
    creates = [rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"other")),
               rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"app/w"))]
    stream = watch.Watch(iter(creates), metadata=md, timeout=20)
    denied = next(stream)
    assert denied.created and denied.canceled
    assert denied.cancel_reason == f"rpc error: code = PermissionDenied desc = {Err.PERMISSION_DENIED.message}"
    created = next(stream)
    assert created.created and not created.canceled
    rpc_pb2_grpc.KVStub(cluster.central).Put(rpc_pb2.PutRequest(key=b"app/w", value=b"seen"),
                                             metadata=cluster.root_md, timeout=10)
    event = next(stream)
    assert event.events[0].kv.value == b"seen"
    stream.cancel()


def test_sidecar_logins_count_toward_the_replicated_lockout(cluster: Cluster) -> None:
    """Failures through a sidecar are the store's ``auth_failures`` entries, as the central proxy's:
    the 5th (the store's default policy) locks the name everywhere; then the right password gets
    the wrong-password answer through both; unknown names are answered the same way."""
    central_auth = rpc_pb2_grpc.AuthStub(cluster.central)
    central_auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="locky", password="lockypw"), metadata=cluster.root_md,
                         timeout=10)
    auth = rpc_pb2_grpc.AuthStub(cluster.sidecar)
    for _ in range(5):
        assert _err(auth.Authenticate, rpc_pb2.AuthenticateRequest(name="locky", password="x")) == Err.AUTH_FAILED.value
    right = rpc_pb2.AuthenticateRequest(name="locky", password="lockypw")
    assert _err(auth.Authenticate, right) == Err.AUTH_FAILED.value
    assert _err(central_auth.Authenticate, right) == Err.AUTH_FAILED.value
    unknown = rpc_pb2.AuthenticateRequest(name="nobody", password="x")
    for _ in range(6):
        assert _err(auth.Authenticate, unknown) == Err.AUTH_FAILED.value
    # root's `user passwd` lifts the lock, seen through the sidecar too
    central_auth.UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(name="locky", password="lockypw"),
                                    metadata=cluster.root_md, timeout=10)
    assert auth.Authenticate(right, timeout=10).token


def _workload_token(sub: str, aud: str = AUDIENCE) -> str:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": [aud], "sub": sub, "iat": now, "nbf": now, "exp": now + 600}
    return pyjwt.encode(claims, rsa_key(0), algorithm="RS256", headers={"kid": "k1"})


def test_workload_token_through_the_sidecar_is_verified_by_the_store(cluster: Cluster) -> None:
    """The sidecar cannot verify a pod's ServiceAccount token (no Credentials, no user list): the
    store does, with the issuer's keys, and maps it to an existing user whose roles decide."""
    _permissions_are_those_of_app(cluster.sidecar, (("token", _workload_token("system:serviceaccount:shop:app")),))
    kv = rpc_pb2_grpc.KVStub(cluster.sidecar)
    put = rpc_pb2.PutRequest(key=b"app/wl", value=b"1")
    for token in (_workload_token("system:serviceaccount:ghost:x"),  # mapped to a user that does not exist
                  _workload_token("system:serviceaccount:other:x"),  # no rule
                  _workload_token("system:serviceaccount:shop:app", aud="elsewhere")):
        assert _err(kv.Put, put, metadata=(("token", token),)) == Err.INVALID_AUTH_TOKEN.value


def test_sidecar_may_follow_the_leader_and_members(cluster: Cluster) -> None:
    """Kept on purpose: a sidecar's store client finds the leader and follows membership changes
    with ``Leader`` (its --store-endpoints are only seeds). The answer holds member IDs and the
    internal URLs the sidecar connects to anyway - no secret, nothing it could not reach."""
    with grpc.insecure_channel(cluster.store) as ch:
        call = proving_channel(ch, SIDECAR_SECRET).unary_unary(
            STORE + "Leader", request_serializer=spb.LeaderRequest.SerializeToString,
            response_deserializer=spb.LeaderResponse.FromString)
        answer = call(spb.LeaderRequest(), timeout=10)
    assert answer.leader_id == answer.member_id
    assert [list(m.internal_urls) for m in answer.members] == [[f"http://{cluster.store}"]]


def test_sidecar_audit_records_name_the_user_the_store_verified(cluster: Cluster) -> None:
    """The sidecar never learns who a token belongs to; the store's answer carries the name it
    verified (granted or refused), so the sidecar's audit log names the user as a central one does."""
    md = (("token", _workload_token("system:serviceaccount:shop:app")),)
    kv = rpc_pb2_grpc.KVStub(cluster.sidecar)
    kv.Put(rpc_pb2.PutRequest(key=b"app/audited", value=b"1"), metadata=md, timeout=10)
    assert _err(kv.Put, rpc_pb2.PutRequest(key=b"audited", value=b"1"), metadata=md) == Err.PERMISSION_DENIED.value
    keys = {base64.b64encode(k).decode(): k for k in (b"app/audited", b"audited")}

    def records() -> dict[bytes, dict[str, object]]:
        found = {}
        lines = cluster.audit.read_text().split("\n")[:-1] if cluster.audit.exists() else []  # complete lines
        for line in lines:
            record = json.loads(line)
            if record.get("method") == "/etcdserverpb.KV/Put" and record.get("key") in keys:
                found[keys[str(record["key"])]] = record
        return found

    wait_for(lambda: len(records()) == 2, timeout=10, what="both audit records")
    got = records()
    assert got[b"app/audited"]["user"] == "app" and got[b"app/audited"]["result"] == "ok"
    assert got[b"audited"]["user"] == "app"
    assert got[b"audited"]["result"] == Err.PERMISSION_DENIED.message
