"""The auth store's rules, ported from etcd's server/auth/store_test.go (reference §1.1, §2, §5.3, §5.4, §10.6)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import lmdb
import pytest

from authstore.state.auth.store import AuthStore, RevisionMoved, is_valid_permission_range, token_digest
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

READ, WRITE, READWRITE = auth_pb2.Permission.READ, auth_pb2.Permission.WRITE, auth_pb2.Permission.READWRITE

_HASHES: dict[str, str] = {}


def hashed(password: str) -> str:
    """What the proxy puts into hashedPassword: base64 of a bcrypt hash (cost 4 to keep tests fast)."""
    if password not in _HASHES:
        _HASHES[password] = base64.b64encode(bcrypt.hashpw(password.encode(), bcrypt.gensalt(4))).decode()
    return _HASHES[password]


class Harness:
    """Runs each call in its own committed write txn, as one applied entry."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = lmdb.open(str(path), max_dbs=32, map_size=1 << 30)
        self.store = AuthStore(self.env)

    def __call__(self, method: str, req: Any, *args: Any) -> Any:
        with self.env.begin(write=True) as txn:
            return getattr(self.store, method)(txn, req, *args)

    def read(self, fn: Callable[[AuthStore, lmdb.Transaction], Any]) -> Any:
        with self.env.begin() as txn:
            return fn(self.store, txn)

    @property
    def rev(self) -> int:
        return self.read(lambda s, t: s.revision(t))

    @property
    def enabled(self) -> bool:
        return self.read(lambda s, t: s.is_enabled(t))

    def user(self, name: str) -> auth_pb2.User | None:
        return self.read(lambda s, t: s.get_user(t, name))

    # shorthands
    def add_user(self, name: str, password: str = "pw", *, no_password: bool = False) -> None:
        req = pb.AuthUserAddRequest(name=name, options=auth_pb2.UserAddOptions(no_password=no_password))
        if not no_password:
            req.hashedPassword = hashed(password)
        self("user_add", req)

    def add_role(self, name: str) -> None:
        self("role_add", pb.AuthRoleAddRequest(name=name))

    def grant_role(self, user: str, role: str) -> None:
        self("user_grant_role", pb.AuthUserGrantRoleRequest(user=user, role=role))

    def grant(self, role: str, perm_type: int, key: bytes, end: bytes = b"") -> None:
        perm = auth_pb2.Permission(permType=perm_type, key=key, range_end=end)  # type: ignore[arg-type]
        self("role_grant_permission", pb.AuthRoleGrantPermissionRequest(name=role, perm=perm))

    def perms(self, role: str) -> list[tuple[int, bytes, bytes]]:
        resp = self("role_get", pb.AuthRoleGetRequest(role=role))
        return [(p.permType, p.key, p.range_end) for p in resp.perm]

    def enable_with_root(self) -> None:
        self.add_user("root", "rootpw")
        self.grant_role("root", "root")
        self("enable", pb.AuthEnableRequest())

    def authenticate(self, name: str, prefix: str = "abcdefghijklmnop", index: int = 7, **kw: Any) -> str:
        req = ipb.InternalAuthenticateRequest(
            name=name, simple_token=prefix, checked_revision=kw.pop("checked", self.rev), **kw
        )
        return self("authenticate", req, index)

    def token(self, token: str) -> tuple[str, int, int] | None:
        return self.read(lambda s, t: s.lookup_token(t, token))


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.env.close()


def raises(err: Err, fn: Callable[..., Any], *args: Any) -> None:
    with pytest.raises(EtcdError) as info:
        fn(*args)
    assert info.value.err is err, info.value.err


# ---- revision (§1.1) ----


def test_fresh_store_is_revision_1_disabled_and_revision_survives_reopen(h: Harness) -> None:
    assert (h.rev, h.enabled) == (1, False)
    h.add_user("a")
    h.add_role("r")
    assert h.rev == 3
    h.env.close()
    again = Harness(h.path)
    assert again.rev == 3 and again.user("a") is not None
    again.env.close()
    h.env = lmdb.open(str(h.path), max_dbs=32, map_size=1 << 30)  # for the fixture's close


def test_status_reports_enabled_and_revision(h: Harness) -> None:
    assert h("status", pb.AuthStatusRequest()) == pb.AuthStatusResponse(enabled=False, authRevision=1)
    h.enable_with_root()
    assert h("status", pb.AuthStatusRequest()) == pb.AuthStatusResponse(enabled=True, authRevision=3)


def test_successful_mutations_bump_by_one_and_reads_do_not(h: Harness) -> None:
    steps: list[tuple[str, Any]] = [
        ("user_add", pb.AuthUserAddRequest(name="u", hashedPassword=hashed("pw"))),
        ("role_add", pb.AuthRoleAddRequest(name="r")),
        ("user_grant_role", pb.AuthUserGrantRoleRequest(user="u", role="r")),
        ("role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="r", perm=auth_pb2.Permission(key=b"k"))),
        ("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"k")),
        ("user_change_password", pb.AuthUserChangePasswordRequest(name="u", hashedPassword=hashed("pw2"))),
        ("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="u", role="r")),
        ("role_delete", pb.AuthRoleDeleteRequest(role="r")),
        ("user_delete", pb.AuthUserDeleteRequest(name="u")),
    ]
    for method, req in steps:
        before = h.rev
        h(method, req)
        assert h.rev == before + 1, method
    before = h.rev
    h("user_list", pb.AuthUserListRequest())
    h("role_list", pb.AuthRoleListRequest())
    h("status", pb.AuthStatusRequest())
    assert h.rev == before


def test_enable_does_not_bump_disable_does_once(h: Harness) -> None:
    h.add_user("root")
    h.grant_role("root", "root")
    rev = h.rev
    h("enable", pb.AuthEnableRequest())
    h("enable", pb.AuthEnableRequest())
    assert h.enabled and h.rev == rev
    h("disable", pb.AuthDisableRequest())
    assert not h.enabled and h.rev == rev + 1
    h("disable", pb.AuthDisableRequest())
    assert h.rev == rev + 1


FAILURES: list[tuple[str, Any, Err]] = [
    ("user_add", pb.AuthUserAddRequest(name=""), Err.USER_EMPTY),
    ("user_add", pb.AuthUserAddRequest(name="u"), Err.USER_ALREADY_EXIST),
    ("user_add", pb.AuthUserAddRequest(name="v", hashedPassword="not base64!"), Err.NO_PASSWORD_USER),
    ("user_delete", pb.AuthUserDeleteRequest(name="nobody"), Err.USER_NOT_FOUND),
    ("user_get", pb.AuthUserGetRequest(name="nobody"), Err.USER_NOT_FOUND),
    ("user_change_password", pb.AuthUserChangePasswordRequest(name="nobody"), Err.USER_NOT_FOUND),
    ("user_change_password", pb.AuthUserChangePasswordRequest(name="u", hashedPassword="%%"), Err.NO_PASSWORD_USER),
    ("user_grant_role", pb.AuthUserGrantRoleRequest(user="nobody", role="r"), Err.USER_NOT_FOUND),
    ("user_grant_role", pb.AuthUserGrantRoleRequest(user="u", role="nope"), Err.ROLE_NOT_FOUND),
    ("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="nobody", role="r"), Err.USER_NOT_FOUND),
    ("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="u", role="nope"), Err.ROLE_NOT_GRANTED),
    ("role_add", pb.AuthRoleAddRequest(name=""), Err.ROLE_EMPTY),
    ("role_add", pb.AuthRoleAddRequest(name="r"), Err.ROLE_ALREADY_EXIST),
    ("role_delete", pb.AuthRoleDeleteRequest(role="nope"), Err.ROLE_NOT_FOUND),
    ("role_get", pb.AuthRoleGetRequest(role="nope"), Err.ROLE_NOT_FOUND),
    ("role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="r"), Err.PERMISSION_NOT_GIVEN),
    (
        "role_grant_permission",
        pb.AuthRoleGrantPermissionRequest(name="nope", perm=auth_pb2.Permission(key=b"k")),
        Err.ROLE_NOT_FOUND,
    ),
    ("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="nope", key=b"k"), Err.ROLE_NOT_FOUND),
    ("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"x"), Err.PERMISSION_NOT_GRANTED),
    ("enable", pb.AuthEnableRequest(), Err.ROOT_USER_NOT_EXIST),
]


@pytest.mark.parametrize(("method", "req", "err"), FAILURES, ids=[f"{m}-{e.name}" for m, _, e in FAILURES])
def test_failures_raise_etcd_error_and_never_bump(h: Harness, method: str, req: Any, err: Err) -> None:
    h.add_user("u")
    h.add_role("r")
    h.grant("r", READ, b"k")
    rev = h.rev
    raises(err, h, method, req)
    assert h.rev == rev


# ---- users ----


def test_user_add_stores_decoded_hash_and_never_the_plaintext(h: Harness) -> None:
    req = pb.AuthUserAddRequest(name="alice", password="plaintext-secret", hashedPassword=hashed("pw"))
    h("user_add", req)
    user = h.user("alice")
    assert user is not None
    assert bcrypt.checkpw(b"pw", user.password)
    assert user.HasField("options") and not user.options.no_password
    with h.env.begin() as txn:
        for _, raw in txn.cursor(db=h.store._users):
            assert b"plaintext-secret" not in raw


def test_no_password_user_keeps_no_hash_even_after_change_password(h: Harness) -> None:
    h("user_add", pb.AuthUserAddRequest(name="cn", hashedPassword=hashed("x"), options={"no_password": True}))
    user = h.user("cn")
    assert user is not None and user.password == b"" and user.options.no_password
    h("user_change_password", pb.AuthUserChangePasswordRequest(name="cn", hashedPassword=hashed("new")))
    user = h.user("cn")
    assert user is not None and user.password == b"" and user.options.no_password


def test_change_password_replaces_the_hash_and_keeps_roles(h: Harness) -> None:
    h.add_user("u", "old")
    h.add_role("r")
    h.grant_role("u", "r")
    h("user_change_password", pb.AuthUserChangePasswordRequest(name="u", hashedPassword=hashed("new")))
    user = h.user("u")
    assert user is not None and bcrypt.checkpw(b"new", user.password) and list(user.roles) == ["r"]


def test_change_password_with_empty_hash_stores_empty_hash(h: Harness) -> None:
    """etcd quirk: an empty password is not hashed, so the user can no longer authenticate."""
    h.add_user("u")
    h("user_change_password", pb.AuthUserChangePasswordRequest(name="u"))
    user = h.user("u")
    assert user is not None and user.password == b""


def test_user_delete_root_is_invalid_only_while_enabled_and_checked_before_existence(h: Harness) -> None:
    h.add_user("x")
    raises(Err.USER_NOT_FOUND, h, "user_delete", pb.AuthUserDeleteRequest(name="root"))
    h.enable_with_root()
    raises(Err.INVALID_AUTH_MGMT, h, "user_delete", pb.AuthUserDeleteRequest(name="root"))
    h("disable", pb.AuthDisableRequest())
    h("user_delete", pb.AuthUserDeleteRequest(name="root"))
    assert h.user("root") is None


def test_grant_role_sorted_duplicate_is_noop_and_root_role_need_not_exist(h: Harness) -> None:
    h.add_user("u")
    for r in ("zeta", "alpha", "mid"):
        h.add_role(r)
        h.grant_role("u", r)
    rev = h.rev
    h.grant_role("u", "mid")
    assert h.rev == rev
    h.grant_role("u", "root")  # no role object "root" exists
    assert h.rev == rev + 1
    assert list(h("user_get", pb.AuthUserGetRequest(name="u")).roles) == ["alpha", "mid", "root", "zeta"]
    assert "root" not in h("role_list", pb.AuthRoleListRequest()).roles
    raises(Err.ROLE_NOT_FOUND, h, "role_get", pb.AuthRoleGetRequest(role="root"))


def test_revoke_root_role_from_root_is_invalid_while_enabled(h: Harness) -> None:
    h.enable_with_root()
    raises(Err.INVALID_AUTH_MGMT, h, "user_revoke_role", pb.AuthUserRevokeRoleRequest(name="root", role="root"))
    raises(Err.USER_NOT_FOUND, h, "user_revoke_role", pb.AuthUserRevokeRoleRequest(name="nobody", role="root"))
    h("disable", pb.AuthDisableRequest())
    h("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="root", role="root"))
    assert list(h.user("root").roles) == []  # type: ignore[union-attr]


def test_revoke_role_does_not_check_role_existence(h: Harness) -> None:
    h.add_user("u")
    h.grant_role("u", "root")
    h("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="u", role="root"))
    assert list(h.user("u").roles) == []  # type: ignore[union-attr]


def test_listings_are_byte_sorted(h: Harness) -> None:
    for name in ("b", "a", "B", "ab", "é"):
        h.add_user(name)
        h.add_role(name)
    expected = sorted(["b", "a", "B", "ab", "é"], key=str.encode)
    assert list(h("user_list", pb.AuthUserListRequest()).users) == expected
    assert list(h("role_list", pb.AuthRoleListRequest()).roles) == expected


def test_very_long_names_work(h: Harness) -> None:
    long_a, long_b = "x" * 600 + "a", "x" * 600 + "b"
    h.add_user(long_a)
    h.add_user(long_b)
    h.add_role(long_b)
    h.grant_role(long_a, long_b)
    assert list(h("user_get", pb.AuthUserGetRequest(name=long_a)).roles) == [long_b]
    assert list(h("user_list", pb.AuthUserListRequest()).users) == [long_a, long_b]
    h("user_delete", pb.AuthUserDeleteRequest(name=long_b))
    assert list(h("user_list", pb.AuthUserListRequest()).users) == [long_a]


# ---- roles ----


def test_role_root_can_be_created_and_reports_the_synthetic_root_permission(h: Harness) -> None:
    h.add_role("root")
    assert h.perms("root") == [(READWRITE, b"", b"\x00")]
    h.grant("root", READ, b"foo")  # succeeds, but has no visible effect (TestRootRoleGrantPermission)
    assert h.perms("root") == [(READWRITE, b"", b"\x00")]


def test_role_delete_root_is_invalid_only_while_enabled(h: Harness) -> None:
    h.add_role("root")
    h.enable_with_root()
    raises(Err.INVALID_AUTH_MGMT, h, "role_delete", pb.AuthRoleDeleteRequest(role="root"))
    h("disable", pb.AuthDisableRequest())
    h("role_delete", pb.AuthRoleDeleteRequest(role="root"))


def test_role_delete_cascades_to_users_in_one_bump(h: Harness) -> None:
    h.add_role("r")
    h.add_role("s")
    for u in ("u1", "u2", "u3"):
        h.add_user(u)
    h.grant_role("u1", "r")
    h.grant_role("u2", "r")
    h.grant_role("u2", "s")
    rev = h.rev
    h("role_delete", pb.AuthRoleDeleteRequest(role="r"))
    assert h.rev == rev + 1
    assert [list(h.user(u).roles) for u in ("u1", "u2", "u3")] == [[], ["s"], []]  # type: ignore[union-attr]


def test_grant_permission_overwrites_type_on_exact_match_and_sorts_by_key(h: Harness) -> None:
    h.add_role("r")
    h.grant("r", READ, b"m", b"")
    h.grant("r", READ, b"a", b"c")
    h.grant("r", WRITE, b"z", b"\x00")
    h.grant("r", WRITE, b"a", b"c")  # exact (key, range_end): type replaced, not OR-ed
    assert h.perms("r") == [(WRITE, b"a", b"c"), (READ, b"m", b""), (WRITE, b"z", b"\x00")]
    h.grant("r", READWRITE, b"a", b"b")  # same key, other range_end: a new entry after the old one
    assert h.perms("r")[:2] == [(WRITE, b"a", b"c"), (READWRITE, b"a", b"b")]


def test_grant_permission_binary_search_quirk_appends_a_duplicate(h: Harness) -> None:
    """etcd compares only the first entry with the key, so re-granting a later one duplicates it."""
    h.add_role("r")
    h.grant("r", READ, b"a", b"c")
    h.grant("r", READ, b"a", b"b")
    h.grant("r", WRITE, b"a", b"b")
    assert h.perms("r") == [(READ, b"a", b"c"), (READ, b"a", b"b"), (WRITE, b"a", b"b")]
    rev = h.rev
    h("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"a", range_end=b"b"))
    assert h.perms("r") == [(READ, b"a", b"c")]
    assert h.rev == rev + 1


def test_revoke_permission_needs_exact_match(h: Harness) -> None:
    h.add_role("r")
    h.grant("r", READ, b"a", b"c")
    for key, end in [(b"a", b""), (b"a", b"b"), (b"b", b"c"), (b"a", b"\x00")]:
        raises(
            Err.PERMISSION_NOT_GRANTED,
            h,
            "role_revoke_permission",
            pb.AuthRoleRevokePermissionRequest(role="r", key=key, range_end=end),
        )
    h("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"a", range_end=b"c"))
    assert h.perms("r") == []


VALIDITY = [
    (b"", b"", False),
    (b"", b"\x00", False),
    (b"", b"a", False),
    (b"a", b"a", False),
    (b"b", b"a", False),
    (b"\x01", b"\x01", False),
    (b"\x00", b"", True),
    (b"a", b"", True),
    (b"a", b"b", True),
    (b"a", b"\x00", True),
    (b"\x00", b"\x00", True),
]


@pytest.mark.parametrize(("key", "end", "valid"), VALIDITY)
def test_permission_validity_table_checked_before_role_existence(
    h: Harness, key: bytes, end: bytes, valid: bool
) -> None:
    assert is_valid_permission_range(key, end) is valid
    req = pb.AuthRoleGrantPermissionRequest(name="missing", perm=auth_pb2.Permission(key=key, range_end=end))
    raises(Err.ROLE_NOT_FOUND if valid else Err.INVALID_AUTH_MGMT, h, "role_grant_permission", req)


def test_permission_not_given_comes_first(h: Harness) -> None:
    raises(Err.PERMISSION_NOT_GIVEN, h, "role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="missing"))


# ---- enable ----


def test_enable_needs_root_user_with_root_role(h: Harness) -> None:
    raises(Err.ROOT_USER_NOT_EXIST, h, "enable", pb.AuthEnableRequest())
    h.add_user("root")
    raises(Err.ROOT_ROLE_NOT_EXIST, h, "enable", pb.AuthEnableRequest())
    assert not h.enabled
    h.grant_role("root", "root")
    h("enable", pb.AuthEnableRequest())
    assert h.enabled


# ---- permissions cache ----


def test_user_permissions_follow_changes(h: Harness) -> None:
    h.add_user("u")
    h.add_role("r")
    h.grant_role("u", "r")

    def can_read(key: bytes) -> bool:
        p = h.read(lambda s, t: s.user_permissions(t, "u"))
        return p is not None and p.covers(key, b"", write=False)

    assert not can_read(b"k")
    h.grant("r", READ, b"k")
    assert can_read(b"k")
    h("role_revoke_permission", pb.AuthRoleRevokePermissionRequest(role="r", key=b"k"))
    assert not can_read(b"k")
    h.grant("r", READ, b"k")
    h("user_revoke_role", pb.AuthUserRevokeRoleRequest(name="u", role="r"))
    assert not can_read(b"k")
    assert h.read(lambda s, t: s.user_permissions(t, "nobody")) is None


def test_user_permissions_never_stale_after_aborted_txn(h: Harness) -> None:
    """A grant seen inside an aborted txn must not survive it, even when the revision is reused."""
    h.add_user("u")
    h.add_role("r")
    h.grant_role("u", "r")
    store = h.store
    with h.env.begin(write=True) as parent:
        child = h.env.begin(write=True, parent=parent)
        perm = auth_pb2.Permission(permType=READ, key=b"secret")
        store.role_grant_permission(child, pb.AuthRoleGrantPermissionRequest(name="r", perm=perm))
        assert store.user_permissions(child, "u").covers(b"secret", b"", write=False)  # type: ignore[union-attr]
        child.abort()
        perm = auth_pb2.Permission(permType=READ, key=b"public")
        store.role_grant_permission(parent, pb.AuthRoleGrantPermissionRequest(name="r", perm=perm))
        p = store.user_permissions(parent, "u")
        assert p is not None and p.covers(b"public", b"", write=False) and not p.covers(b"secret", b"", write=False)


# ---- authenticate and simple tokens ----


def test_authenticate_needs_auth_enabled(h: Harness) -> None:
    h.add_user("u")
    raises(Err.AUTH_NOT_ENABLED, h.authenticate, "u")


def test_authenticate_registers_simple_token(h: Harness) -> None:
    h.enable_with_root()
    h.add_user("u")
    rev = h.rev
    token = h.authenticate("u", "PrefixPrefixPref", 42, issued_at_unix_ms=1234, ttl_seconds=300)
    assert token == "PrefixPrefixPref.42"
    assert h.token(token) == ("u", 1234, 300)
    assert h.token("PrefixPrefixPref.43") is None and h.token("") is None
    assert h.rev == rev  # Authenticate never bumps


def test_authenticate_jwt_mode_registers_nothing(h: Harness) -> None:
    h.enable_with_root()
    assert h.authenticate("root", prefix="") == ""
    assert h.read(lambda s, t: s.list_tokens(t)) == []


def test_authenticate_rechecks_user_and_revision(h: Harness) -> None:
    h.enable_with_root()
    h("user_add", pb.AuthUserAddRequest(name="cn", options={"no_password": True}))
    raises(Err.AUTH_FAILED, h.authenticate, "ghost")
    raises(Err.NO_PASSWORD_USER, h.authenticate, "cn")
    with pytest.raises(RevisionMoved) as info:
        h.authenticate("root", checked=h.rev - 1)
    assert (info.value.checked, info.value.current) == (h.rev - 1, h.rev)
    assert h.read(lambda s, t: s.list_tokens(t)) == []


def test_delete_and_change_password_drop_only_that_users_tokens(h: Harness) -> None:
    h.enable_with_root()
    h.add_user("a")
    h.add_user("b")
    ta1, ta2 = h.authenticate("a", index=10), h.authenticate("a", index=11)
    tb = h.authenticate("b", index=12)
    h("user_change_password", pb.AuthUserChangePasswordRequest(name="a", hashedPassword=hashed("n")))
    assert h.token(ta1) is None and h.token(ta2) is None and h.token(tb) is not None
    ta3 = h.authenticate("a", index=13)
    h("user_delete", pb.AuthUserDeleteRequest(name="b"))
    assert h.token(tb) is None and h.token(ta3) is not None


def test_disable_drops_all_tokens(h: Harness) -> None:
    h.enable_with_root()
    tokens = [h.authenticate("root", index=i) for i in range(5)]
    h("disable", pb.AuthDisableRequest())
    assert all(h.token(t) is None for t in tokens)
    h("enable", pb.AuthEnableRequest())
    assert h.read(lambda s, t: s.list_tokens(t)) == []


def test_expire_tokens_drops_given_tokens_and_ignores_unknown(h: Harness) -> None:
    h.enable_with_root()
    t1, t2 = h.authenticate("root", index=1), h.authenticate("root", index=2)
    with h.env.begin(write=True) as txn:
        h.store.expire_tokens(txn, [token_digest(t1), token_digest("unknown.9"), b""])
    assert h.token(t1) is None and h.token(t2) is not None
    h("user_change_password", pb.AuthUserChangePasswordRequest(name="root", hashedPassword=hashed("x")))
    assert h.token(t2) is None


def test_only_digests_of_tokens_are_stored(h: Harness) -> None:
    h.enable_with_root()
    token = h.authenticate("root", index=7)
    with h.env.begin() as txn:
        stored = [bytes(k) for k, _ in txn.cursor(db=h.env.open_db(b"auth_tokens", txn=txn))]
    assert stored == [token_digest(token)]
    assert token.encode() not in b"".join(stored)


def test_reapplying_an_authenticate_entry_is_idempotent(h: Harness) -> None:
    h.enable_with_root()
    assert h.authenticate("root", index=5) == h.authenticate("root", index=5)
    assert len(h.read(lambda s, t: s.list_tokens(t))) == 1


def test_credentials_revision_and_token_lookups_for_watches(h: Harness) -> None:
    """What a watch re-check asks: is a JWT's revision older than the user's last password set or
    the last enable (then it is dead), and whose live simple token has this digest."""
    h.enable_with_root()
    h.add_user("alice")
    added = h.rev
    cred = lambda: h.read(lambda s, t: s.credentials_revision(t, "alice"))  # noqa: E731
    assert cred() == added
    h("user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="root"))
    assert cred() == added  # a grant changes rights, not credentials
    token = h.authenticate("root", index=3)
    assert h.read(lambda s, t: (s.token_user(t, token_digest(token)), s.token_count(t))) == ("root", 1)
    h("user_change_password", pb.AuthUserChangePasswordRequest(name="alice", hashedPassword=hashed("x")))
    changed = h.rev
    assert cred() == changed > added
    h("disable", pb.AuthDisableRequest())
    h("enable", pb.AuthEnableRequest())
    enabled_at = h.rev
    assert cred() == enabled_at > changed
    assert h.read(lambda s, t: (s.token_user(t, token_digest(token)), s.token_count(t))) == (None, 0)
    h("user_delete", pb.AuthUserDeleteRequest(name="alice"))
    assert cred() == enabled_at < h.rev  # its own record is gone; a re-add sets a newer one
    h.add_user("alice")
    assert cred() == h.rev
