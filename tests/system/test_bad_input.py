"""Bad input over raw gRPC: each gets etcd's exact error, and the server keeps serving afterwards.

Runs against real etcd 3.5.1 and raftgate; `V35` records where 3.5.1 differs from the 3.7.1 target.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2
from tests.support.processes import BACKENDS, EtcdServer, RaftgateLocal, new_server, skip_unless_available
from tests.support.rawgrpc import Stubs, outcome

Server = EtcdServer | RaftgateLocal
MiB = 1024 * 1024

TOO_LARGE = ("INVALID_ARGUMENT", "etcdserver: request is too large")
NO_KEY = ("INVALID_ARGUMENT", "etcdserver: key is not provided")
BAD_TOKEN = ("UNAUTHENTICATED", "etcdserver: invalid auth token")
INVALID_MGMT = ("INVALID_ARGUMENT", "etcdserver: invalid auth management")
AUTH_FAILED = ("INVALID_ARGUMENT", "etcdserver: authentication failed, invalid user ID or password")


@pytest.fixture(scope="module", params=BACKENDS)
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Stubs, Server]]:
    skip_unless_available(request.param)
    server = new_server(request.param, tmp_path_factory.mktemp(f"badinput-{request.param}"))
    server.start()
    admin = Stubs(server.target)
    admin.auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
    admin.auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
    admin.auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="bad-r"), timeout=10)
    admin.auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=10)
    admin.login("root", "rootpw")
    yield request.param, admin, server
    admin.close()
    server.stop()


def _still_serving(admin: Stubs) -> None:
    put = admin.kv.Put(rpc_pb2.PutRequest(key=b"alive", value=b"yes"), metadata=admin.md, timeout=10)
    got = admin.kv.Range(rpc_pb2.RangeRequest(key=b"alive"), metadata=admin.md, timeout=10)
    assert [kv.value for kv in got.kvs] == [b"yes"] and got.header.revision == put.header.revision


def _kv_cases() -> dict[str, tuple[Callable[[Stubs], Any], tuple[str, str], tuple[str, str] | None]]:
    """name -> (call, 3.7.1 answer, 3.5.1 answer if different)."""
    big = b"x" * (MiB + MiB // 2 + 64 * 1024)  # over etcd's 1.5 MiB request limit, under gRPC's 2 MiB
    r = rpc_pb2
    return {
        "put_empty_key": (
            lambda a: a.kv.Put(r.PutRequest(key=b"", value=b"v"), metadata=a.md, timeout=10),
            NO_KEY,
            None,
        ),
        "range_empty_key": (lambda a: a.kv.Range(r.RangeRequest(key=b""), metadata=a.md, timeout=10), NO_KEY, None),
        "delete_empty_key": (
            lambda a: a.kv.DeleteRange(r.DeleteRangeRequest(key=b""), metadata=a.md, timeout=10),
            NO_KEY,
            None,
        ),
        "put_oversize_value": (
            lambda a: a.kv.Put(r.PutRequest(key=b"big", value=big), metadata=a.md, timeout=30),
            TOO_LARGE,
            None,
        ),
        "put_oversize_key": (
            lambda a: a.kv.Put(r.PutRequest(key=big, value=b"v"), metadata=a.md, timeout=30),
            TOO_LARGE,
            None,
        ),
        "txn_oversize": (
            lambda a: a.kv.Txn(
                r.TxnRequest(success=[r.RequestOp(request_put=r.PutRequest(key=b"t", value=big))]),
                metadata=a.md,
                timeout=30,
            ),
            TOO_LARGE,
            None,
        ),
        "put_beyond_grpc_limit": (
            lambda a: a.kv.Put(r.PutRequest(key=b"huge", value=b"x" * (2 * MiB + 1)), metadata=a.md, timeout=30),
            ("RESOURCE_EXHAUSTED", "grpc: received message larger than max"),
            None,
        ),
        "txn_too_many_ops": (
            lambda a: a.kv.Txn(
                r.TxnRequest(
                    success=[
                        r.RequestOp(request_put=r.PutRequest(key=f"op{i}".encode(), value=b"v")) for i in range(129)
                    ]
                ),
                metadata=a.md,
                timeout=10,
            ),
            ("INVALID_ARGUMENT", "etcdserver: too many operations in txn request"),
            None,
        ),
        "txn_duplicate_key": (
            lambda a: a.kv.Txn(
                r.TxnRequest(
                    success=[
                        r.RequestOp(request_put=r.PutRequest(key=b"dup", value=b"1")),
                        r.RequestOp(request_put=r.PutRequest(key=b"dup", value=b"2")),
                    ]
                ),
                metadata=a.md,
                timeout=10,
            ),
            ("INVALID_ARGUMENT", "etcdserver: duplicate key given in txn request"),
            None,
        ),
        "range_future_revision": (
            lambda a: a.kv.Range(r.RangeRequest(key=b"k", revision=10**9), metadata=a.md, timeout=10),
            ("OUT_OF_RANGE", "etcdserver: mvcc: required revision is a future revision"),
            None,
        ),
        "grant_empty_key": (
            lambda a: a.auth.RoleGrantPermission(
                r.AuthRoleGrantPermissionRequest(
                    name="bad-r", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=b"", range_end=b"z")
                ),
                metadata=a.md,
                timeout=10,
            ),
            INVALID_MGMT,
            ("OK", ""),
        ),
        "grant_reversed_range": (
            lambda a: a.auth.RoleGrantPermission(
                r.AuthRoleGrantPermissionRequest(
                    name="bad-r", perm=auth_pb2.Permission(permType=auth_pb2.Permission.READ, key=b"b", range_end=b"a")
                ),
                metadata=a.md,
                timeout=10,
            ),
            INVALID_MGMT,
            ("OK", ""),
        ),
        "grant_no_perm": (
            lambda a: a.auth.RoleGrantPermission(
                r.AuthRoleGrantPermissionRequest(name="bad-r"), metadata=a.md, timeout=10
            ),
            ("INVALID_ARGUMENT", "etcdserver: permission not given"),
            None,
        ),
        "user_add_empty_name": (
            lambda a: a.auth.UserAdd(r.AuthUserAddRequest(name="", password="x"), metadata=a.md, timeout=10),
            ("INVALID_ARGUMENT", "etcdserver: user name is empty"),
            None,
        ),
        "role_add_empty_name": (
            lambda a: a.auth.RoleAdd(r.AuthRoleAddRequest(name=""), metadata=a.md, timeout=10),
            ("INVALID_ARGUMENT", "etcdserver: role name is empty"),
            None,
        ),
        "authenticate_unknown_user": (
            lambda a: a.auth.Authenticate(r.AuthenticateRequest(name="ghost", password="x"), timeout=10),
            AUTH_FAILED,
            None,
        ),
        "authenticate_empty_name": (
            lambda a: a.auth.Authenticate(r.AuthenticateRequest(name="", password=""), timeout=10),
            AUTH_FAILED,
            None,
        ),
        "user_get_unknown": (
            lambda a: a.auth.UserGet(r.AuthUserGetRequest(name="ghost"), metadata=a.md, timeout=10),
            ("FAILED_PRECONDITION", "etcdserver: user name not found"),
            None,
        ),
        "grant_role_unknown_user": (
            lambda a: a.auth.UserGrantRole(
                r.AuthUserGrantRoleRequest(user="ghost", role="bad-r"), metadata=a.md, timeout=10
            ),
            ("FAILED_PRECONDITION", "etcdserver: user name not found"),
            None,
        ),
    }


@pytest.mark.parametrize("case", sorted(_kv_cases()))
def test_bad_request(srv: tuple[str, Stubs, Server], case: str) -> None:
    backend, admin, _ = srv
    call, want, want35 = _kv_cases()[case]
    if backend == "etcd" and want35 is not None:
        want = want35
    code, detail = outcome(lambda: call(admin))
    if want[0] == "OK":
        assert code == "OK", (code, detail)
    elif want[0] == "RESOURCE_EXHAUSTED":  # gRPC's own limit; the detail carries the sizes
        # etcd (grpc-go): "grpc: received message larger than max (N vs. M)"; raftgate words it alike.
        assert code == want[0] and detail.startswith(want[1] + " ("), (code, detail)
    else:
        assert (code, detail) == want
    _still_serving(admin)


def test_reversed_range_read_is_empty_not_an_error(srv: tuple[str, Stubs, Server]) -> None:
    _, admin, _ = srv
    resp = admin.kv.Range(rpc_pb2.RangeRequest(key=b"b", range_end=b"a"), metadata=admin.md, timeout=10)
    assert list(resp.kvs) == [] and resp.count == 0


def test_max_size_value_just_below_limit_is_accepted(srv: tuple[str, Stubs, Server]) -> None:
    _, admin, _ = srv
    admin.kv.Put(rpc_pb2.PutRequest(key=b"almost-big", value=b"y" * (MiB + MiB // 4)), metadata=admin.md, timeout=30)
    got = admin.kv.Range(rpc_pb2.RangeRequest(key=b"almost-big", count_only=True), metadata=admin.md, timeout=10)
    assert got.count == 1


@pytest.mark.parametrize(
    "token",
    ["garbage", "abc.def", "x" * 8192, "Bearer garbage", "a.b.c", "eyJhbGciOiJub25lIn0.e30."],
)
def test_malformed_tokens(srv: tuple[str, Stubs, Server], token: str) -> None:
    _, admin, server = srv
    s = Stubs(server.target, token=token)
    try:
        assert outcome(lambda: s.kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=s.md, timeout=10)) == BAD_TOKEN
        assert (
            outcome(lambda: s.kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), metadata=s.md, timeout=10)) == BAD_TOKEN
        )
        assert outcome(lambda: s.auth.UserList(rpc_pb2.AuthUserListRequest(), metadata=s.md, timeout=10)) == BAD_TOKEN
    finally:
        s.close()
    _still_serving(admin)


def test_empty_token_metadata(srv: tuple[str, Stubs, Server]) -> None:
    _, admin, server = srv
    s = Stubs(server.target)
    try:
        got = outcome(lambda: s.kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=(("token", ""),), timeout=10))
        assert got == BAD_TOKEN
    finally:
        s.close()
    _still_serving(admin)


def test_simple_token_with_future_index(srv: tuple[str, Stubs, Server]) -> None:
    """A well-formed simple token naming a raft index never reached.

    etcd (3.5.1 and 3.7.1) waits until that index is applied, i.e. until the client's deadline
    (DEADLINE_EXCEEDED, or `invalid auth token` as the server's wait ends); raftgate resolves simple
    tokens in its store and answers `invalid auth token`.
    """
    backend, admin, server = srv
    s = Stubs(server.target, token="abcdefghijklmnop.99999999")
    try:
        got = outcome(lambda: s.kv.Range(rpc_pb2.RangeRequest(key=b"k"), metadata=s.md, timeout=2))
    finally:
        s.close()
    if backend == "etcd":  # it waits out the request's deadline, then refuses (whichever the client sees first)
        assert got == BAD_TOKEN or got[0] == "DEADLINE_EXCEEDED", got
    else:
        assert got == BAD_TOKEN
    _still_serving(admin)


UNMARSHAL = "grpc: error unmarshalling request: "


@pytest.mark.parametrize(
    "case",
    ["range_empty_key", "put_empty_key", "delete_empty_key", "txn_duplicate_key", "txn_too_many_ops"],
)
def test_request_shape_is_checked_before_the_token(srv: tuple[str, Stubs, Server], case: str) -> None:
    """etcd validates a request before it resolves the token: a bogus token with an empty key gets
    `key is not provided`, not `invalid auth token` (raftgate: the store validates, then refuses
    the token the proxy marked as unresolved)."""
    _, admin, server = srv
    call, want, _ = _kv_cases()[case]
    for token in ("bogus", "abcdefghijklmnop.99999999"):
        s = Stubs(server.target, token=token)
        try:
            assert outcome(lambda: call(s)) == want, token  # noqa: B023 - called at once
        finally:
            s.close()
    _still_serving(admin)


def test_valid_request_with_bogus_token_is_refused(srv: tuple[str, Stubs, Server]) -> None:
    _, admin, server = srv
    s = Stubs(server.target, token="bogus")
    try:
        assert outcome(lambda: s.auth.AuthStatus(rpc_pb2.AuthStatusRequest(), metadata=s.md, timeout=10)) == BAD_TOKEN
        compact = rpc_pb2.CompactionRequest(revision=1)
        assert outcome(lambda: s.kv.Compact(compact, metadata=s.md, timeout=10)) == BAD_TOKEN
        got = outcome(lambda: s.kv.Txn(rpc_pb2.TxnRequest(), metadata=s.md, timeout=10))
        assert got == BAD_TOKEN
    finally:
        s.close()
    _still_serving(admin)


@pytest.mark.parametrize(
    "method",
    [
        "/etcdserverpb.Auth/Authenticate",
        "/etcdserverpb.Auth/UserAdd",
        "/etcdserverpb.Auth/UserChangePassword",
        "/etcdserverpb.Auth/UserGet",
        "/etcdserverpb.KV/Range",
        "/etcdserverpb.KV/Put",
    ],
)
@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\x0f"], ids=["truncated", "bad_wire_type"])
def test_malformed_request_gets_grpc_go_wording(srv: tuple[str, Stubs, Server], method: str, data: bytes) -> None:
    """grpc-go: Internal "grpc: error unmarshalling request: <reason>"; the reason is the decoder's
    own text (Go's and Python's protobuf word it differently), so only the prefix is compared."""
    _, admin, _ = srv
    code, detail = outcome(lambda: admin.channel.unary_unary(method)(data, metadata=admin.md, timeout=10))
    assert code == "INTERNAL" and detail.startswith(UNMARSHAL) and len(detail) > len(UNMARSHAL), detail
    _still_serving(admin)


def test_invalid_utf8_string_field(srv: tuple[str, Stubs, Server]) -> None:
    """A string field holding invalid UTF-8 (UserGet.name). etcd 3.5.1's gogoproto code does not
    check UTF-8 and looks the name up; raftgate's store decodes with protobuf, which refuses it,
    and answers as grpc-go does for any request that does not unmarshal."""
    backend, admin, _ = srv
    bad = b"\x0a\x02\xff\xfe"
    user_get = admin.channel.unary_unary("/etcdserverpb.Auth/UserGet")
    code, detail = outcome(lambda: user_get(bad, metadata=admin.md, timeout=10))
    if backend == "etcd":
        assert (code, detail) == ("FAILED_PRECONDITION", "etcdserver: user name not found")
    else:
        assert code == "INTERNAL" and detail.startswith(UNMARSHAL) and "UTF-8" in detail, detail
        assert "etcdserverpb.AuthUserGetRequest" in detail
    _still_serving(admin)


def test_password_admin_without_usable_identity(srv: tuple[str, Stubs, Server]) -> None:
    """UserAdd / UserChangePassword from an anonymous caller or with a bogus token (raftgate
    refuses these before bcrypt; the answers are etcd's)."""
    _, admin, server = srv
    add = rpc_pb2.AuthUserAddRequest(name="nobody-adds", password="pw")
    change = rpc_pb2.AuthUserChangePasswordRequest(name="root", password="pw")
    for token, want in ((None, ("INVALID_ARGUMENT", "etcdserver: user name is empty")), ("bogus", BAD_TOKEN)):
        s = Stubs(server.target, token=token)
        try:
            assert outcome(lambda: s.auth.UserAdd(add, metadata=s.md, timeout=10)) == want  # noqa: B023
            assert outcome(lambda: s.auth.UserChangePassword(change, metadata=s.md, timeout=10)) == want  # noqa: B023
        finally:
            s.close()
    _still_serving(admin)
