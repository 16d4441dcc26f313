"""The one authorization function (authstore/state/auth/authorize.py): etcd 3.7.1's matrix and order of checks.

Ported in spirit from etcd's server/etcdserver/apply/auth_test.go (AdminPermission, Put, LeasePut,
Range, DeleteRange, Txn, LeaseRevoke, UserGet, RoleGet, CheckTxnAuth) and the API-layer checks of
v3_server.go / v3rpc maintenance.go (reference §3).
"""

from __future__ import annotations

import pytest
from google.protobuf.message import Message

from authstore.state.auth.authorize import authorize
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from tests.support.authorize_world import World, lease_keys, put, w  # noqa: F401 - w is the fixture


def rng(key: bytes, end: bytes = b"") -> pb.RangeRequest:
    return pb.RangeRequest(key=key, range_end=end)


def op(msg: Message) -> pb.RequestOp:
    field = {
        pb.RangeRequest: "request_range",
        pb.PutRequest: "request_put",
        pb.DeleteRangeRequest: "request_delete_range",
        pb.TxnRequest: "request_txn",
    }[type(msg)]
    return pb.RequestOp(**{field: msg})


# ---- disabled / open ----


def test_everything_is_allowed_while_auth_is_disabled(w: World) -> None:  # noqa: F811
    w.mutate("disable", pb.AuthDisableRequest())
    assert w.check("put", put(b"zz"), "") is None
    assert w.check("auth_user_add", pb.AuthUserAddRequest(name="x"), "") is None
    assert w.check("compaction", pb.CompactionRequest(), "nobody") is None
    assert w.check("lease_leases", pb.LeaseLeasesRequest(), "", all_leases=None) is None


@pytest.mark.parametrize("user", ["", "nobody", "alice"])
def test_authenticate_and_auth_status_are_open(w: World, user: str) -> None:  # noqa: F811
    assert w.check("authenticate", ipb.InternalAuthenticateRequest(name="x"), user) is None
    assert w.check("auth_status", pb.AuthStatusRequest(), user) is None


@pytest.mark.parametrize("user", ["", "nobody", "alice"])
def test_store_internal_entries_carry_no_identity_and_are_not_checked(w: World, user: str) -> None:  # noqa: F811
    assert w.check("expire_tokens", ipb.ExpireTokensRequest(token_digests=[b"x" * 32]), user) is None
    assert w.check("lease_checkpoint", pb.LeaseCheckpointRequest(), user) is None


def test_malformed_request_is_not_capable(w: World) -> None:  # noqa: F811
    req = ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root", auth_revision=w.rev))
    with w.env.begin() as txn, pytest.raises(EtcdError) as info:
        authorize(w.auth, txn, req.header, req, lease_keys, read=False)
    assert info.value.err is Err.NOT_CAPABLE


# ---- key checks: etcd's isOpPermitted order ----


def test_key_check_order(w: World) -> None:  # noqa: F811
    assert w.check("range", rng(b"a"), "") is Err.USER_EMPTY
    assert w.check("range", rng(b"a"), "alice", rev=0) is Err.USER_EMPTY
    assert w.check("range", rng(b"zz"), "nobody", rev=w.rev - 1) is Err.AUTH_OLD_REVISION
    assert w.check("range", rng(b"a"), "root", rev=w.rev - 1) is Err.AUTH_OLD_REVISION
    assert w.check("range", rng(b"a"), "nobody") is Err.PERMISSION_DENIED
    assert w.check("range", rng(b"zz"), "root") is None
    assert w.check("range", rng(b"zz"), "alice") is Err.PERMISSION_DENIED
    assert w.check("range", rng(b"a"), "alice") is None


def test_range_needs_read_over_the_whole_interval(w: World) -> None:  # noqa: F811
    assert w.check("range", rng(b"a", b"c")) is None
    assert w.check("range", rng(b"b", b"bzz")) is None
    assert w.check("range", rng(b"a", b"d")) is Err.PERMISSION_DENIED
    assert w.check("range", rng(b"a", b"\x00")) is Err.PERMISSION_DENIED
    assert w.check("range", rng(b"k")) is Err.PERMISSION_DENIED  # k is write-only
    assert w.check("range", rng(b"w", b"x")) is None
    assert w.check("range", rng(b"\x00", b"\x00"), "root") is None


def test_read_path_refuses_any_other_revision_after_the_key_check(w: World) -> None:  # noqa: F811
    ahead = w.rev + 1
    assert w.check("range", rng(b"a"), rev=ahead, read=False) is None  # apply: only "older" is old
    assert w.check("range", rng(b"a"), rev=ahead, read=True) is Err.AUTH_OLD_REVISION
    assert w.check("range", rng(b"zz"), rev=ahead, read=True) is Err.PERMISSION_DENIED  # denial comes first
    assert w.check("range", rng(b"a"), "root", rev=ahead, read=True) is Err.AUTH_OLD_REVISION
    assert w.check("range", rng(b"a"), rev=w.rev - 1, read=True) is Err.AUTH_OLD_REVISION
    txn = pb.TxnRequest(success=[op(rng(b"a"))])
    assert w.check("txn", txn, rev=ahead, read=True) is Err.AUTH_OLD_REVISION
    assert w.check("range", rng(b"a"), read=True) is None


def test_revocation_is_effective_immediately_for_the_next_request(w: World) -> None:  # noqa: F811
    assert w.check("range", rng(b"a")) is None
    w.mutate("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"a", range_end=b"c"))
    assert w.check("range", rng(b"a")) is Err.PERMISSION_DENIED
    w.mutate("user_delete", pb.AuthUserDeleteRequest(name="alice"))
    assert w.check("put", put(b"w1")) is Err.PERMISSION_DENIED


# ---- put / delete ----


def test_put_needs_write_and_read_for_prev_kv(w: World) -> None:  # noqa: F811
    assert w.check("put", put(b"k")) is None
    assert w.check("put", put(b"a")) is Err.PERMISSION_DENIED
    assert w.check("put", put(b"k", prev_kv=True)) is Err.PERMISSION_DENIED
    assert w.check("put", put(b"w1", prev_kv=True)) is None
    assert w.check("put", put(b"zz", prev_kv=True), "root") is None


def test_put_with_lease_needs_write_on_keys_already_attached(w: World) -> None:  # noqa: F811
    assert w.check("put", put(b"w3", lease=1)) is None
    assert w.check("put", put(b"w3", lease=2)) is Err.PERMISSION_DENIED
    assert w.check("put", put(b"w3", lease=3)) is None
    assert w.check("put", put(b"w3", lease=99)) is None  # unknown lease: the lessor reports it
    assert w.check("put", put(b"w3", lease=2), "root") is None


def test_lease_lookup_errors_other_than_not_found_propagate(w: World) -> None:  # noqa: F811
    def broken(_lease: int) -> list[bytes]:
        raise EtcdError(Err.CORRUPT)

    req = ipb.InternalRaftRequest(
        put=put(b"w1", lease=5), header=ipb.RequestHeader(username="alice", auth_revision=w.rev)
    )
    with w.env.begin() as txn, pytest.raises(EtcdError) as info:
        authorize(w.auth, txn, req.header, req, broken, read=False)
    assert info.value.err is Err.CORRUPT


def test_delete_range_needs_write_and_read_for_prev_kv(w: World) -> None:  # noqa: F811
    assert w.check("delete_range", pb.DeleteRangeRequest(key=b"w", range_end=b"x")) is None
    assert w.check("delete_range", pb.DeleteRangeRequest(key=b"w", range_end=b"\x00")) is Err.PERMISSION_DENIED
    assert w.check("delete_range", pb.DeleteRangeRequest(key=b"k")) is None
    assert w.check("delete_range", pb.DeleteRangeRequest(key=b"k", prev_kv=True)) is Err.PERMISSION_DENIED
    assert w.check("delete_range", pb.DeleteRangeRequest(key=b"a")) is Err.PERMISSION_DENIED
    assert w.check("delete_range", pb.DeleteRangeRequest(key=b"", range_end=b"\x00"), "") is Err.USER_EMPTY


# ---- txn: every compare, both branches, nested ----

TXN_CASES: list[tuple[str, pb.TxnRequest, Err | None]] = [
    ("reads", pb.TxnRequest(compare=[pb.Compare(key=b"a")], success=[op(rng(b"b"))], failure=[op(rng(b"a1"))]), None),
    ("compare denied", pb.TxnRequest(compare=[pb.Compare(key=b"zz")], success=[op(rng(b"a"))]), Err.PERMISSION_DENIED),
    ("compare range", pb.TxnRequest(compare=[pb.Compare(key=b"a", range_end=b"d")]), Err.PERMISSION_DENIED),
    ("compare range ok", pb.TxnRequest(compare=[pb.Compare(key=b"a", range_end=b"c")]), None),
    ("failure branch", pb.TxnRequest(success=[op(put(b"k"))], failure=[op(put(b"zz"))]), Err.PERMISSION_DENIED),
    ("success branch", pb.TxnRequest(success=[op(rng(b"zz"))], failure=[op(put(b"k"))]), Err.PERMISSION_DENIED),
    ("put prev_kv", pb.TxnRequest(success=[op(put(b"k", prev_kv=True))]), Err.PERMISSION_DENIED),
    ("put lease", pb.TxnRequest(failure=[op(put(b"w3", lease=2))]), Err.PERMISSION_DENIED),
    ("put lease ok", pb.TxnRequest(failure=[op(put(b"w3", lease=1))]), None),
    (
        "delete prev_kv",
        pb.TxnRequest(success=[op(pb.DeleteRangeRequest(key=b"k", prev_kv=True))]),
        Err.PERMISSION_DENIED,
    ),
    ("delete", pb.TxnRequest(success=[op(pb.DeleteRangeRequest(key=b"a"))]), Err.PERMISSION_DENIED),
    ("delete ok", pb.TxnRequest(success=[op(pb.DeleteRangeRequest(key=b"w", range_end=b"x", prev_kv=True))]), None),
    (
        "nested",
        pb.TxnRequest(success=[op(pb.TxnRequest(failure=[op(pb.TxnRequest(success=[op(put(b"zz"))]))]))]),
        Err.PERMISSION_DENIED,
    ),
    (
        "nested compare",
        pb.TxnRequest(failure=[op(pb.TxnRequest(compare=[pb.Compare(key=b"k")]))]),
        Err.PERMISSION_DENIED,
    ),
    ("nested ok", pb.TxnRequest(success=[op(pb.TxnRequest(success=[op(put(b"w9", prev_kv=True))]))]), None),
    ("empty op", pb.TxnRequest(success=[pb.RequestOp()]), None),
]


@pytest.mark.parametrize(("name", "txn", "err"), TXN_CASES, ids=[c[0] for c in TXN_CASES])
def test_txn_checks_every_compare_and_both_branches(w: World, name: str, txn: pb.TxnRequest, err: Err | None) -> None:  # noqa: F811
    assert w.check("txn", txn) is err
    assert w.check("txn", txn, "root") is None
    if name != "empty op":  # an op with no request checks nothing, as in etcd
        assert w.check("txn", txn, "") is Err.USER_EMPTY


def test_empty_txn_needs_no_permission(w: World) -> None:  # noqa: F811
    """etcd: a Txn with no compare and no op triggers no key check, so even anonymous passes."""
    assert w.check("txn", pb.TxnRequest(), "") is None


# ---- admin-only ----

ADMIN: list[tuple[str, Message]] = [
    ("compaction", pb.CompactionRequest(revision=1)),
    ("defragment", pb.DefragmentRequest()),
    ("hash", pb.HashRequest()),
    ("hash_kv", pb.HashKVRequest()),
    ("snapshot", pb.SnapshotRequest()),
    ("move_leader", pb.MoveLeaderRequest(targetID=2)),
    ("downgrade", pb.DowngradeRequest()),
    ("alarm", pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE)),
    ("alarm", pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE)),
    ("member_add", pb.MemberAddRequest()),
    ("member_remove", pb.MemberRemoveRequest()),
    ("member_update", pb.MemberUpdateRequest()),
    ("member_promote", pb.MemberPromoteRequest()),
    ("auth_enable", pb.AuthEnableRequest()),
    ("auth_disable", pb.AuthDisableRequest()),
    ("auth_user_add", pb.AuthUserAddRequest(name="x")),
    ("auth_user_delete", pb.AuthUserDeleteRequest(name="x")),
    ("auth_user_change_password", pb.AuthUserChangePasswordRequest(name="alice")),
    ("auth_user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="root")),
    ("auth_user_revoke_role", pb.AuthUserRevokeRoleRequest(name="alice", role="r")),
    ("auth_user_list", pb.AuthUserListRequest()),
    ("auth_role_add", pb.AuthRoleAddRequest(name="x")),
    ("auth_role_delete", pb.AuthRoleDeleteRequest(role="r")),
    ("auth_role_list", pb.AuthRoleListRequest()),
    ("auth_role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="r")),
    ("auth_role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r")),
    ("auth_user_get", pb.AuthUserGetRequest(name="bob")),
    ("auth_role_get", pb.AuthRoleGetRequest(role="other")),
]


@pytest.mark.parametrize(("kind", "body"), ADMIN, ids=[f"{k}-{i}" for i, (k, _) in enumerate(ADMIN)])
def test_admin_only_requests(w: World, kind: str, body: Message) -> None:  # noqa: F811
    assert w.check(kind, body, "") is Err.USER_EMPTY
    assert w.check(kind, body, "nobody") is Err.USER_NOT_FOUND
    assert w.check(kind, body, "alice") is Err.PERMISSION_DENIED
    assert w.check(kind, body, "root") is None
    assert w.check(kind, body, "root", rev=1) is None  # IsAdminPermitted has no revision check


def test_any_role_root_holder_is_admin(w: World) -> None:  # noqa: F811
    w.mutate("user_grant_role", pb.AuthUserGrantRoleRequest(user="bob", role="root"))
    assert w.check("auth_user_list", pb.AuthUserListRequest(), "bob") is None
    assert w.check("put", put(b"anything", prev_kv=True, lease=2), "bob") is None


# ---- any authenticated user ----

AUTHENTICATED: list[tuple[str, Message]] = [
    ("status", pb.StatusRequest()),
    ("alarm", pb.AlarmRequest(action=pb.AlarmRequest.GET)),
    ("member_list", pb.MemberListRequest()),
    ("lease_grant", pb.LeaseGrantRequest(TTL=10)),
    ("lease_time_to_live", pb.LeaseTimeToLiveRequest(ID=2, keys=False)),
]


@pytest.mark.parametrize(("kind", "body"), AUTHENTICATED, ids=[k for k, _ in AUTHENTICATED])
def test_requests_open_to_any_authenticated_user(w: World, kind: str, body: Message) -> None:  # noqa: F811
    assert w.check(kind, body, "") is Err.USER_EMPTY
    for user in ("nobody", "alice", "root"):
        assert w.check(kind, body, user) is None
    assert w.check(kind, body, "alice", rev=1) is None


# ---- self-service reads ----


def test_user_get_of_self_and_role_get_of_held_role(w: World) -> None:  # noqa: F811
    assert w.check("auth_user_get", pb.AuthUserGetRequest(name="alice"), "alice") is None
    assert w.check("auth_user_get", pb.AuthUserGetRequest(name="bob"), "alice") is Err.PERMISSION_DENIED
    assert w.check("auth_user_get", pb.AuthUserGetRequest(name="bob"), "nobody") is Err.USER_NOT_FOUND
    assert w.check("auth_user_get", pb.AuthUserGetRequest(name="nobody"), "nobody") is None  # store: not found
    assert w.check("auth_role_get", pb.AuthRoleGetRequest(role="r"), "alice") is None
    assert w.check("auth_role_get", pb.AuthRoleGetRequest(role="other"), "alice") is Err.PERMISSION_DENIED
    assert w.check("auth_role_get", pb.AuthRoleGetRequest(role="missing"), "alice") is Err.PERMISSION_DENIED
    assert w.check("auth_role_get", pb.AuthRoleGetRequest(role="missing"), "root") is None  # store: not found
    assert w.check("auth_role_get", pb.AuthRoleGetRequest(role="r"), "") is Err.USER_EMPTY


# ---- leases: authorization follows the attached keys ----


@pytest.mark.parametrize("kind", ["lease_revoke", "lease_keep_alive"])
def test_revoke_and_keep_alive_need_write_on_every_attached_key(w: World, kind: str) -> None:  # noqa: F811
    body = pb.LeaseRevokeRequest if kind == "lease_revoke" else pb.LeaseKeepAliveRequest
    assert w.check(kind, body(ID=1), "") is Err.USER_EMPTY
    assert w.check(kind, body(ID=99), "") is Err.USER_EMPTY
    assert w.check(kind, body(ID=1)) is None
    assert w.check(kind, body(ID=2)) is Err.PERMISSION_DENIED
    assert w.check(kind, body(ID=2), "root") is None
    assert w.check(kind, body(ID=3), "nobody") is None  # a keyless lease: any authenticated user
    assert w.check(kind, body(ID=1), "nobody") is Err.PERMISSION_DENIED
    assert w.check(kind, body(ID=99)) is None  # unknown lease: the lessor reports it
    assert w.check(kind, body(ID=1), rev=w.rev - 1) is Err.AUTH_OLD_REVISION


def test_time_to_live_with_keys_needs_read_on_every_attached_key(w: World) -> None:  # noqa: F811
    ttl = pb.LeaseTimeToLiveRequest
    assert w.check("lease_time_to_live", ttl(ID=4, keys=True), "") is Err.USER_EMPTY
    assert w.check("lease_time_to_live", ttl(ID=4, keys=True)) is Err.PERMISSION_DENIED
    assert w.check("lease_time_to_live", ttl(ID=1, keys=True)) is None
    assert w.check("lease_time_to_live", ttl(ID=4, keys=True), "root") is None
    assert w.check("lease_time_to_live", ttl(ID=99, keys=True)) is None


def test_lease_leases_needs_read_on_every_key_of_every_lease(w: World) -> None:  # noqa: F811
    req = pb.LeaseLeasesRequest()
    assert w.check("lease_leases", req, "") is Err.USER_EMPTY
    assert w.check("lease_leases", req) is Err.PERMISSION_DENIED  # lease 2 holds zz
    assert w.check("lease_leases", req, all_leases=lambda: [1, 3, 99]) is None
    assert w.check("lease_leases", req, all_leases=lambda: []) is None
    assert w.check("lease_leases", req, "root") is None
    assert w.check("lease_leases", req, all_leases=None) is Err.PERMISSION_DENIED
    assert w.check("lease_leases", req, "root", all_leases=None) is None
