"""The store's internal port, cell by cell: who may call what, carrying which request (issue 21).

One store node, called straight at its internal port with each class of credential and with none:
in development-secret mode (``--internal-secret-file``: central, ``--sidecar-secret-file``:
sidecar) and with mTLS (a ``--trusted-ca-file`` certificate: central, a
``--sidecar-trusted-ca-file`` one: sidecar). A sidecar's credential is not root: whatever request
kind it puts into a call, it acts only as the user whose token it forwards. Every cell of the
table (raftgate/internal_access.py) is called and must answer as declared.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from protos import wire
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.internal import INTERNAL_TOKEN_METADATA
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err
from raftgate.internal_access import (
    CALL_DO,
    CHALLENGE,
    CREDENTIALS,
    DO,
    DO_STREAM,
    LEADER,
    RESOLVE_TOKEN,
    SNAPSHOT,
    UNAUTHENTICATED,
    WATCH_BATCHES,
    WATCH_SHARED,
    Caller,
    decide,
    rpc,
    stream_call,
)
from raftgate.methods import REQUESTS, Perm
from raftgate.secret_proof import proving_channel
from tests.support.processes import SECRET, Program, free_port, secret_file, store_program, wait_for, write_test_pki

SIDECAR_SECRET = "sidecar-secret-for-access-tests-0123456789"
NONE_SECRET = "wrong-secret-for-access-tests-0123456789"
#: tokens no verifier accepts: no known shape, and a simple token's shape that was never issued
GARBAGE_TOKENS = ("garbage.1", "AbCdEfGhIjKlMnOp.1")
STORE = "/raftgate.storepb.Store/"
FIELDS = {f.name: f.number for f in ipb.InternalRaftRequest.DESCRIPTOR.fields}
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class As:
    """One way to call: a caller class, the secret it presents, the client token it forwards."""

    caller: Caller
    secret: str | None = None
    token: str | None = None

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        md: list[tuple[str, str]] = []  # the secret is proven by the channel (Store.channel), never sent
        if self.token is not None:
            md.append((INTERNAL_TOKEN_METADATA, self.token))
        return tuple(md)

    def with_token(self, token: str | None) -> As:
        return As(self.caller, self.secret, token)


@dataclass
class Store:
    mode: str
    #: a channel per class (mTLS: each with its certificate; none: no certificate gets through)
    channels: dict[Caller, grpc.Channel]
    central: As
    sidecar: As
    #: tokens the store issued through the sidecar Authenticate: root's and a non-root user's
    root_token: str = ""
    app_token: str = ""
    nobody: list[As] = field(default_factory=list)
    program: Program | None = None
    #: a channel proving each secret (raftgate/secret_proof.py), made when first used
    proving: dict[str, grpc.Channel] = field(default_factory=dict)

    def channel(self, way: As) -> grpc.Channel:
        base = self.channels[way.caller]
        if way.secret is None:
            return base
        if way.secret not in self.proving:
            self.proving[way.secret] = proving_channel(base, way.secret)
        return self.proving[way.secret]


def _hashed(password: str) -> str:
    return base64.b64encode(bcrypt.hashpw(password.encode(), bcrypt.gensalt(4, prefix=b"2a"))).decode()


def _request(kind: str, body: bytes = b"", header: bytes | None = None) -> bytes:
    return wire.build_internal_request(header, FIELDS[kind], body)


def _do(store: Store, data: bytes) -> bytes:
    call = store.channel(store.central).unary_unary(STORE + "Do", request_serializer=None, response_deserializer=None)
    return call(data, metadata=store.central.metadata, timeout=10)


def _stream(store: Store, calls: list[spb.DoCall], way: As) -> dict[int, spb.DoResult]:
    """The first result of each call, sent in one DoBatch on one DoStream."""
    stream = store.channel(way).stream_stream(STORE + "DoStream", request_serializer=None, response_deserializer=None)
    answers = stream(iter([spb.DoBatch(calls=calls).SerializeToString()]), metadata=way.metadata, timeout=30)
    got: dict[int, spb.DoResult] = {}
    for raw in answers:
        for result in spb.DoResultBatch.FromString(raw).results:
            if not result.rest:
                got[result.id] = result
        if len(got) == len(calls):
            answers.cancel()
            break
    return got


def _login(store: Store, name: str, password: str) -> str:
    body = rpc_pb2.AuthenticateRequest(name=name, password=password).SerializeToString()
    result = _stream(store, [spb.DoCall(id=1, method=spb.DoCall.AUTHENTICATE, request=body)], store.sidecar)[1]
    assert result.code == 0, result.message
    return rpc_pb2.AuthenticateResponse.FromString(result.response).token


def _secret_store(work: Path) -> tuple[Program, Store]:
    (work / "sidecar-secret").write_text(SIDECAR_SECRET)
    program, address = store_program(work, "--sidecar-secret-file", str(work / "sidecar-secret"),
                                     "--bcrypt-cost", "4")
    channel = grpc.insecure_channel(address)
    return program, Store("secret", {c: channel for c in Caller}, As(Caller.CENTRAL, SECRET),
                          As(Caller.SIDECAR, SIDECAR_SECRET),
                          nobody=[As(Caller.NONE), As(Caller.NONE, NONE_SECRET, GARBAGE_TOKENS[0])])


def _mtls_store(work: Path) -> tuple[Program, Store]:
    central = write_test_pki(work / "central-pki", ["proxy"])
    sidecar = write_test_pki(work / "sidecar-pki", ["sidecar"], ca_name="raftgate-test-sidecar-ca")
    port, peer = free_port(), f"http://127.0.0.1:{free_port()}"
    program = Program(work / "store", [
        "store", "--name", "s1", "--data-dir", str(work / "store-data"),
        "--listen-internal-urls", f"https://127.0.0.1:{port}", "--cert-file", str(central["server.crt"]),
        "--key-file", str(central["server.key"]), "--trusted-ca-file", str(central["ca"]),
        "--sidecar-trusted-ca-file", str(sidecar["ca"]), "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer, "--peer-secret-file", str(secret_file(work)), "--bcrypt-cost", "4"],
        "raftgate store:")

    def channel(pki: dict[str, Path], who: str) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(root_certificates=central["ca"].read_bytes(),
                                             private_key=pki[f"{who}.key"].read_bytes(),
                                             certificate_chain=pki[f"{who}.crt"].read_bytes())
        return grpc.secure_channel(f"127.0.0.1:{port}", creds)

    channels = {Caller.CENTRAL: channel(central, "proxy"), Caller.SIDECAR: channel(sidecar, "sidecar")}
    return program, Store("mtls", channels, As(Caller.CENTRAL), As(Caller.SIDECAR))


@pytest.fixture(scope="module", params=["secret", "mtls"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    work: Path = tmp_path_factory.mktemp(f"internal-access-{request.param}")
    program, built = (_secret_store if request.param == "secret" else _mtls_store)(work)
    built.program = program
    try:
        program.start()

        def leads() -> bool:
            call = built.channel(built.central).unary_unary(
                STORE + "Leader", request_serializer=spb.LeaderRequest.SerializeToString,
                response_deserializer=spb.LeaderResponse.FromString)
            answer = call(spb.LeaderRequest(), metadata=built.central.metadata, timeout=5)
            return answer.leader_id == answer.member_id

        wait_for(leads, timeout=60, what="the store to lead")
        # users, roles and auth on, through the central credential (auth is off until the last step)
        perm = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"app/", range_end=b"app0")
        for kind, msg in (
            ("auth_user_add", rpc_pb2.AuthUserAddRequest(name="root", hashedPassword=_hashed("rootpw"))),
            ("auth_user_grant_role", rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root")),
            ("auth_user_add", rpc_pb2.AuthUserAddRequest(name="app", hashedPassword=_hashed("apppw"))),
            ("auth_role_add", rpc_pb2.AuthRoleAddRequest(name="app")),
            ("auth_role_grant_permission", rpc_pb2.AuthRoleGrantPermissionRequest(name="app", perm=perm)),
            ("auth_user_grant_role", rpc_pb2.AuthUserGrantRoleRequest(user="app", role="app")),
            ("put", rpc_pb2.PutRequest(key=b"secret-key", value=b"secret-value")),
            ("auth_enable", rpc_pb2.AuthEnableRequest()),
        ):
            _do(built, _request(kind, msg.SerializeToString()))
        built.root_token, built.app_token = _login(built, "root", "rootpw"), _login(built, "app", "apppw")
        yield built
    finally:
        for channel in set(built.channels.values()):
            channel.close()
        program.stop()


def _snapshot(store: Store, data: bytes, way: As) -> tuple[grpc.StatusCode, str, int]:
    """Store/Snapshot: (code, message, bytes of snapshot received)."""
    call = store.channel(way).unary_stream(STORE + "Snapshot", request_serializer=None, response_deserializer=None)
    received = 0
    try:
        for raw in call(data, metadata=way.metadata, timeout=30):
            received += len(rpc_pb2.SnapshotResponse.FromString(raw).blob)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or "", received
    return grpc.StatusCode.OK, "", received


def test_a_sidecar_credential_cannot_download_the_store(store: Store) -> None:
    """Issue 21 item 1: Snapshot authorized the kind the caller put in, not the snapshot kind, so a
    sidecar's `auth_status` (open to all) or store-only entry (never checked) got the LMDB file."""
    for data, token in ((_request("auth_status"), None),
                        (_request("auth_status"), "garbage"),
                        (_request("expire_tokens"), "garbage"),
                        (_request("lease_checkpoint"), None),
                        (_request("range", rpc_pb2.RangeRequest(key=b"app/x").SerializeToString()), store.app_token)):
        code, _, received = _snapshot(store, data, store.sidecar.with_token(token))
        assert received == 0
        assert code == grpc.StatusCode.PERMISSION_DENIED
    # the snapshot kind itself: root's check, applied to the identity the store finds in the token
    snap = _request("snapshot")
    assert _snapshot(store, snap, store.sidecar)[:2] == Err.USER_EMPTY.value
    assert _snapshot(store, snap, store.sidecar.with_token("garbage"))[:2] == Err.INVALID_AUTH_TOKEN.value
    assert _snapshot(store, snap, store.sidecar.with_token(store.app_token))[:2] == Err.PERMISSION_DENIED.value
    code, _, received = _snapshot(store, snap, store.sidecar.with_token(store.root_token))
    assert code == grpc.StatusCode.OK and received > 0


# ---- every cell: method x caller class x request kind, with and without a token ----

HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
REFLECTION = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
STORE_SERVICE = spb.DESCRIPTOR.services_by_name["Store"]
#: every request kind, from the descriptor (not from a list of ours)
KINDS = [f.name for f in ipb.InternalRaftRequest.DESCRIPTOR.fields if f.message_type is not None and f.name != "header"]
#: every method the internal port serves, from the descriptors: each gRPC method, each DoCall method
SERVED = [rpc(s.full_name, m.name) for s in (STORE_SERVICE, HEALTH, REFLECTION) for m in s.methods] + [
    stream_call(v.name) for v in spb.DoCall.Method.DESCRIPTOR.values]
CODES = {c.value[0]: c for c in grpc.StatusCode}
Answer = tuple[grpc.StatusCode, str]


def _ways(store: Store) -> list[As]:
    """Central (its header stamps no one here), sidecar without a token, with a garbage one and
    with a valid non-root user's, and no valid credential (secret mode: none, a wrong secret;
    with mTLS no certificate gets past the handshake, so there is no such caller to try)."""
    return [store.central, store.sidecar, *(store.sidecar.with_token(t) for t in GARBAGE_TOKENS),
            store.sidecar.with_token(store.app_token), *store.nobody]


def _unary(store: Store, method: str, body: bytes, way: As) -> Answer:
    call = store.channel(way).unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        call(body, metadata=way.metadata, timeout=20)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _first_of_stream(store: Store, method: str, body: bytes, way: As, *, client_streaming: bool) -> Answer:
    """The call's first message (OK) or how it ended before one; a client stream stays open
    until then (the store must not see it end first)."""
    done = threading.Event()

    def requests() -> Iterator[bytes]:
        yield body
        done.wait(30)

    if client_streaming:
        answers = store.channel(way).stream_stream(method, request_serializer=None, response_deserializer=None)(
            requests(), metadata=way.metadata, timeout=20)
    else:
        answers = store.channel(way).unary_stream(method, request_serializer=None, response_deserializer=None)(
            body, metadata=way.metadata, timeout=20)
    try:
        next(answers)
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    except StopIteration:
        return grpc.StatusCode.OK, "(no message)"
    finally:
        done.set()
        answers.cancel()


def _do_calls(store: Store, way: As) -> dict[str, Answer]:
    """Every DoCall method, and DO with every kind, on one DoStream: cell -> answer (the stream's
    refusal for each, when the stream itself is refused)."""
    calls = [spb.DoCall(id=i, method=spb.DoCall.DO, request=_request(kind)) for i, kind in enumerate(KINDS)]
    cells = [(CALL_DO, kind) for kind in KINDS]
    others = {"CREDENTIALS": spb.CredentialsRequest(name="root"), "RESOLVE_TOKEN": spb.ResolveTokenRequest(
        token=store.app_token), "AUTHENTICATE": rpc_pb2.AuthenticateRequest(name="app", password="apppw")}
    for value in spb.DoCall.Method.DESCRIPTOR.values:
        if value.name != "DO":
            calls.append(spb.DoCall(id=len(calls), method=value.number, request=others[value.name].SerializeToString()))
            cells.append((stream_call(value.name), ""))
    if way.token is not None:
        for call in calls:
            call.token = way.token
    try:
        got = _stream(store, calls, As(way.caller, way.secret))
    except grpc.RpcError as exc:
        return {f"{method} {kind}": (exc.code(), exc.details() or "") for method, kind in cells}
    return {f"{method} {kind}": (CODES[got[i].code], got[i].message) for i, (method, kind) in enumerate(cells)}


def _is_table_refusal(answer: Answer) -> bool:
    code, message = answer
    return answer == UNAUTHENTICATED or (code is grpc.StatusCode.PERMISSION_DENIED and message.startswith("raftgate: "))


def _judge(cell: str, way: As, method: str, kind: str | None, answer: Answer, wrong: list[str]) -> None:
    """The declared answer: the table's refusal exactly, or else served - and then judged as the
    identity the credential carries (a sidecar's token, verified by the store; no stamped user)."""
    declared = decide(method, way.caller, kind)
    if declared is not None:
        if answer != declared:
            wrong.append(f"{cell} as {way.caller.value} token={way.token is not None}: {answer}, declared {declared}")
        return
    if _is_table_refusal(answer):
        wrong.append(f"{cell} as {way.caller.value}: refused {answer}, declared allowed")
        return
    # No user behind the call (no token, a garbage one, a central header naming no one): only what
    # etcd answers to anyone (AuthStatus; an empty Txn, which touches no key), and the entries a
    # central proxy records, may succeed; with a garbage token nothing at all (auth is on:
    # `invalid auth token`, AuthStatus included).
    names_a_user = way.token is not None and way.token not in GARBAGE_TOKENS
    anyones = way.token is None and kind is not None and (
        REQUESTS[kind].perm in (Perm.OPEN, Perm.INTERNAL) or kind == "txn")
    if kind and answer[0] is grpc.StatusCode.OK and not names_a_user and not anyones:
        wrong.append(f"{cell} as {way.caller.value} token={way.token}: answered OK without a user")


def test_every_cell_answers_as_declared(store: Store) -> None:
    wrong: list[str] = []
    callable_methods: set[str] = set()
    kinds_of = {DO: KINDS, SNAPSHOT: KINDS}
    for way in _ways(store):
        # Do and Snapshot with every request kind
        for method, kinds in kinds_of.items():
            callable_methods.add(method)
            for kind in kinds:
                if method == SNAPSHOT:
                    answer = _first_of_stream(store, method, _request(kind), way, client_streaming=False)
                else:
                    answer = _unary(store, method, _request(kind), way)
                _judge(f"{method} {kind}", way, method, kind, answer, wrong)
        # DoStream: the stream, then each call in it
        stream_answers = _do_calls(store, way)
        callable_methods.add(DO_STREAM)
        for cell, answer in stream_answers.items():
            method, kind = cell.split(" ")
            callable_methods.add(method)
            if decide(DO_STREAM, way.caller) is not None:  # the stream is refused: every call with it
                _judge(cell, way, DO_STREAM, None, answer, wrong)
            else:
                _judge(cell, way, method, kind or None, answer, wrong)
        # the methods that carry no request kind
        for method, body in ((CREDENTIALS, spb.CredentialsRequest(name="root")),
                             (RESOLVE_TOKEN, spb.ResolveTokenRequest(token=store.app_token)),
                             (LEADER, spb.LeaderRequest()),
                             # secret mode: a nonce for anyone; mTLS: nothing to prove (UNIMPLEMENTED)
                             (CHALLENGE, spb.ChallengeRequest()),
                             (rpc(HEALTH.full_name, "Check"), health_pb2.HealthCheckRequest()),
                             (rpc(HEALTH.full_name, "List"), health_pb2.HealthListRequest())):
            callable_methods.add(method)
            _judge(method, way, method, None, _unary(store, method, body.SerializeToString(), way), wrong)
        watch = spb.WatchStreamRequest(request=rpc_pb2.WatchRequest(
            create_request=rpc_pb2.WatchCreateRequest(key=b"app/w")))
        if way.token is not None:
            watch.token = way.token
        shared = spb.WatchSharedRequest(sub=1, request=watch.SerializeToString())
        for method, body, streaming in (
                (WATCH_BATCHES, watch, True),
                (WATCH_SHARED, shared, True),
                (rpc(HEALTH.full_name, "Watch"), health_pb2.HealthCheckRequest(), False),
                (rpc(REFLECTION.full_name, "ServerReflectionInfo"),
                 reflection_pb2.ServerReflectionRequest(list_services=""), True)):
            callable_methods.add(method)
            answer = _first_of_stream(store, method, body.SerializeToString(), way, client_streaming=streaming)
            _judge(method, way, method, None, answer, wrong)
    assert callable_methods == set(SERVED), f"no call in this test for {set(SERVED) - callable_methods}"
    assert not wrong, "\n".join(wrong)
    # no cell is a way to fill the store's log with errors (health's List raised, for anyone)
    assert store.program is not None
    assert "Traceback" not in store.program.output()


def test_a_method_nobody_declared_is_not_served(store: Store) -> None:
    """Deny by default: a path without a row never reaches a handler (here none exists either)."""
    body = b""
    for way in _ways(store):
        answer = _unary(store, rpc(STORE_SERVICE.full_name, "NoSuchMethod"), body, way)
        assert answer[0] in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED), answer
        if way.caller is Caller.NONE:
            assert answer == UNAUTHENTICATED


def test_reflection_lists_only_the_declared_services(store: Store) -> None:
    call = store.channel(store.central).stream_stream(rpc(REFLECTION.full_name, "ServerReflectionInfo"),
                                       request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
                                       response_deserializer=reflection_pb2.ServerReflectionResponse.FromString)
    answers = call(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                   metadata=store.central.metadata, timeout=20)
    listed = {s.name for s in next(answers).list_services_response.service}
    answers.cancel()
    assert listed == {STORE_SERVICE.full_name, HEALTH.full_name, REFLECTION.full_name}


def test_a_snapshot_request_cannot_smuggle_another_kind_or_a_stamped_root(store: Store) -> None:
    """The ways around `snapshot only, then root's check` a sidecar could try: a second kind in
    the same message, no kind at all, bytes that do not decode, root's name stamped in the header
    (the store replaces it with the token's identity), a stale central-looking revision."""
    root_header = wire.encode_header("root", 1 << 40)
    two_kinds = _request("snapshot") + _request("auth_status")
    for data, way in ((two_kinds, store.sidecar), (two_kinds, store.sidecar.with_token(store.root_token)),
                      (b"", store.sidecar), (b"\xff\xff\xff", store.sidecar)):
        code, _, received = _snapshot(store, data, way)
        assert received == 0 and code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL), code
    stamped = _request("snapshot", header=root_header)
    assert _snapshot(store, stamped, store.sidecar)[:2] == Err.USER_EMPTY.value
    assert _snapshot(store, stamped, store.sidecar.with_token(store.app_token))[:2] == Err.PERMISSION_DENIED.value
    # a central proxy's stamp is believed (it is root-equivalent by design); its other kinds are not a snapshot
    code, _, received = _snapshot(store, _request("snapshot", header=wire.encode_header("root", 0)), store.central)
    assert code == grpc.StatusCode.OK and received > 0
    code, _, received = _snapshot(store, _request("auth_status", header=root_header), store.central)
    assert (code, received) == (grpc.StatusCode.PERMISSION_DENIED, 0)
