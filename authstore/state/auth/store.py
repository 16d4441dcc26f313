"""The auth store: users, roles, permissions, the enabled flag, the auth revision and simple tokens.

Every method takes the LMDB transaction to use, so that the apply stage can run each log entry in
a nested transaction and throw all of it away when the entry is refused. Each method validates
everything before its first write, so a refused request never bumps the revision (reference §1.1).
The rules and their order are etcd 3.7.1's ``server/auth/store.go`` (reference §2, §5.3, §5.4).

Nothing here reads a clock or a random source: token material and times arrive in the entry.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import struct
from collections.abc import Iterable

import lmdb

from authstore.state.auth.lockout import MAX_NAMES_PER_ENTRY, Lockout
from authstore.state.auth.permissions import UserPermissions
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError
from raftgate.simple_token import make_token

ROOT_USER = "root"
ROOT_ROLE = "root"

#: LMDB sub-databases owned by the auth store.
DB_META = b"auth_meta"  # b"enabled" -> b"\x00"/b"\x01"; b"revision", b"enabled_at", b"cred/"+name -> uint64 BE
DB_USERS = b"auth_users"  # name key -> authpb.User
DB_ROLES = b"auth_roles"  # name key -> authpb.Role
# Simple tokens are bearer secrets: only their sha256 is stored, so neither the store's files nor a
# Maintenance.Snapshot taken by root hold a usable token.
DB_TOKENS = b"auth_tokens"  # sha256(token) -> int64 issued_at_unix_ms, int64 ttl_seconds, username
DB_USER_TOKENS = b"auth_user_tokens"  # dupsort: username key -> token key (to drop a user's tokens)

_ENABLED = b"enabled"
_REVISION = b"revision"
#: The auth revisions from which tokens are good: the last AuthEnable (every token dies with
#: AuthDisable), and per user its last password set (add or change). Older JWTs are dead tokens.
_ENABLED_AT = b"enabled_at"
_CREDENTIALS = b"cred/"
_TOKEN_HEAD = struct.Struct(">qq")
#: Users whose parsed record and permissions authorization keeps; past it they are all dropped.
CHECK_CACHE_NAMES = 1024


def _root_perm() -> auth_pb2.Permission:
    """What RoleGet("root") always reports, whatever was granted to the role (etcd's rootPerm)."""
    return auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"", range_end=b"\x00")


def has_root_role(user: auth_pb2.User) -> bool:
    """Roles are kept sorted, so a bisect suffices (as etcd's hasRootRole)."""
    i = bisect.bisect_left(user.roles, ROOT_ROLE)
    return i < len(user.roles) and user.roles[i] == ROOT_ROLE


def is_valid_permission_range(key: bytes, range_end: bytes) -> bool:
    """etcd 3.6+ refuses empty keys and empty/inverted ranges, except the open end "\\x00" (§5.3)."""
    if not key:
        return False
    if not range_end:
        return True
    return key < range_end or range_end == b"\x00"


def bcrypt_cost(hashed: bytes) -> int | None:
    """The cost in a ``$2?$NN$...`` bcrypt hash, or None for anything else."""
    parts = hashed.split(b"$")
    if len(parts) != 4 or parts[0] or parts[1] not in (b"2a", b"2b", b"2y") or not parts[2].isdigit():
        return None
    return int(parts[2])


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class RevisionMoved(Exception):
    """Authenticate refused: the auth revision is not the one the proxy checked the password at.

    Not an etcd error: the proxy reacts by re-reading the credentials, re-checking the password and
    proposing again, so a token is never issued against a password or user that changed meanwhile.
    """

    def __init__(self, checked: int, current: int) -> None:
        super().__init__(f"auth revision moved: checked {checked}, now {current}")
        self.checked = checked
        self.current = current


class AuthStore:
    """etcd's authStore over LMDB; see the module docstring for the transaction contract."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.env = env
        self._max_key = env.max_key_size()
        with env.begin(write=True) as txn:
            self._meta = env.open_db(DB_META, txn=txn)
            self._users = env.open_db(DB_USERS, txn=txn)
            self._roles = env.open_db(DB_ROLES, txn=txn)
            self._tokens = env.open_db(DB_TOKENS, txn=txn)
            self._user_tokens = env.open_db(DB_USER_TOKENS, txn=txn, dupsort=True)
            if self.revision(txn) == 0:
                self._set_revision(txn, 1)  # a fresh store reports auth revision 1, as etcd
        self.lockout = Lockout(env, self._key)
        # name -> (user record, its roles' records, permissions built from them); see user_permissions.
        self._perm_cache: dict[str, tuple[bytes, tuple[bytes | None, ...], UserPermissions]] = {}
        # name -> (user record, the record parsed); see user_record.
        self._user_cache: dict[str, tuple[bytes, auth_pb2.User]] = {}

    # ------------------------------------------------------------------ keys and records

    def _key(self, name: str | bytes) -> bytes:
        """LMDB key for a name; names longer than LMDB's key limit get a collision-proof digest tail."""
        raw = name.encode() if isinstance(name, str) else name
        if len(raw) <= self._max_key:
            return raw
        return raw[: self._max_key - 32] + hashlib.sha256(raw).digest()

    def get_user(self, txn: lmdb.Transaction, name: str) -> auth_pb2.User | None:
        if not name:
            return None  # LMDB has no empty keys, and no user can have an empty name
        raw = txn.get(self._key(name), db=self._users)
        return auth_pb2.User.FromString(raw) if raw is not None else None

    def get_role(self, txn: lmdb.Transaction, name: str) -> auth_pb2.Role | None:
        if not name:
            return None
        raw = txn.get(self._key(name), db=self._roles)
        return auth_pb2.Role.FromString(raw) if raw is not None else None

    def _put_user(self, txn: lmdb.Transaction, user: auth_pb2.User) -> None:
        txn.put(self._key(user.name), user.SerializeToString(), db=self._users)

    def _put_role(self, txn: lmdb.Transaction, role: auth_pb2.Role) -> None:
        txn.put(self._key(role.name), role.SerializeToString(), db=self._roles)

    def users(self, txn: lmdb.Transaction) -> list[auth_pb2.User]:
        """Every user, by name."""
        users = [auth_pb2.User.FromString(v) for v in txn.cursor(db=self._users).iternext(keys=False)]
        users.sort(key=lambda u: u.name)  # byte order of names, as bbolt lists them
        return users

    def typical_bcrypt_cost(self, txn: lmdb.Transaction) -> int | None:
        """The bcrypt cost most users' password hashes have (the higher on a tie); None if no
        user has a password. Unknown users are checked at this cost, so a miss costs what a hit does."""
        counts: dict[int, int] = {}
        for user in self.users(txn):
            cost = bcrypt_cost(user.password)
            if cost is not None:
                counts[cost] = counts.get(cost, 0) + 1
        return max(counts, key=lambda c: (counts[c], c)) if counts else None

    def roles(self, txn: lmdb.Transaction) -> list[auth_pb2.Role]:
        """Every role, by name."""
        roles = [auth_pb2.Role.FromString(v) for v in txn.cursor(db=self._roles).iternext(keys=False)]
        roles.sort(key=lambda r: r.name)
        return roles

    def load(self, txn: lmdb.Transaction, users: Iterable[auth_pb2.User], roles: Iterable[auth_pb2.Role],
             enabled: bool, revision: int) -> None:
        """Users (with their password hashes), roles and the auth state read from another
        store's snapshot, into an empty auth store; the caller checked them."""
        for user in users:
            self._put_user(txn, user)
        for role in roles:
            self._put_role(txn, role)
        self._set_revision(txn, revision)
        txn.put(_ENABLED, b"\x01" if enabled else b"\x00", db=self._meta)
        if enabled:
            txn.put(_ENABLED_AT, revision.to_bytes(8, "big"), db=self._meta)

    # ------------------------------------------------------------------ meta

    def is_enabled(self, txn: lmdb.Transaction) -> bool:
        return txn.get(_ENABLED, db=self._meta) == b"\x01"

    def revision(self, txn: lmdb.Transaction) -> int:
        raw = txn.get(_REVISION, db=self._meta)
        return int.from_bytes(raw, "big") if raw else 0

    def _set_revision(self, txn: lmdb.Transaction, rev: int) -> None:
        txn.put(_REVISION, rev.to_bytes(8, "big"), db=self._meta)

    def _bump(self, txn: lmdb.Transaction) -> None:
        self._set_revision(txn, self.revision(txn) + 1)

    def _credentials_key(self, name: str) -> bytes:
        return self._key(_CREDENTIALS + name.encode())

    def _set_credentials(self, txn: lmdb.Transaction, name: str) -> None:
        txn.put(self._credentials_key(name), self.revision(txn).to_bytes(8, "big"), db=self._meta)

    def credentials_revision(self, txn: lmdb.Transaction, name: str) -> int:
        """The oldest auth revision a token of ``name`` may carry and still be live (a JWT's
        ``revision`` claim): none from before the user's last password set or the last enable."""
        raw = txn.get(self._credentials_key(name), db=self._meta) if name else None
        enabled_at = txn.get(_ENABLED_AT, db=self._meta)
        return max(int.from_bytes(raw or b"", "big"), int.from_bytes(enabled_at or b"", "big"))

    def token_user(self, txn: lmdb.Transaction, digest: bytes) -> str | None:
        """The user of the live simple token with this digest, else None."""
        raw = txn.get(digest, db=self._tokens) if digest else None
        return raw[_TOKEN_HEAD.size :].decode() if raw is not None else None

    def token_count(self, txn: lmdb.Transaction) -> int:
        """How many simple tokens are live (a drop shows as a decrease; watches re-check then)."""
        return int(txn.stat(self._tokens)["entries"])

    # ------------------------------------------------------------------ queries used by authorize

    def has_role(self, txn: lmdb.Transaction, user: str, role: str) -> bool:
        u = self.get_user(txn, user)
        return u is not None and role in u.roles

    def user_record(self, txn: lmdb.Transaction, name: str) -> tuple[bytes, auth_pb2.User] | None:
        """`name`'s stored record and its parse, for authorization: from a cache used only while the
        stored bytes are those it was parsed from (right by construction, as ``user_permissions``'
        cache). The parse is shared between checks and threads, so it must never be modified
        (``get_user`` gives a copy to change)."""
        raw = txn.get(self._key(name), db=self._users) if name else None
        if raw is None:
            return None
        hit = self._user_cache.get(name)
        if hit is not None and hit[0] == raw:
            return hit
        if len(self._user_cache) >= CHECK_CACHE_NAMES:
            self._user_cache.clear()
        record = (raw, auth_pb2.User.FromString(raw))
        self._user_cache[name] = record
        return record

    def user_permissions(self, txn: lmdb.Transaction, name: str,
                         record: tuple[bytes, auth_pb2.User] | None = None) -> UserPermissions | None:
        """The merged key permissions of `name` (None if no such user), from a cache.

        A cache entry is used only while the stored user record and the records of its roles are
        byte-for-byte those it was built from. That is a few LMDB reads and memcmps per check, and
        it makes the cache right by construction: no entry can outlive an aborted transaction, a
        snapshot restore, or a revision number that was reused with different content.
        ``record``: ``user_record(txn, name)`` when the caller has it already (same transaction).
        """
        if record is None:
            record = self.user_record(txn, name)
        if record is None:
            return None
        raw_user, user = record
        raw_roles = tuple(txn.get(self._key(r), db=self._roles) if r else None for r in user.roles)
        hit = self._perm_cache.get(name)
        if hit is not None and hit[0] == raw_user and hit[1] == raw_roles:
            return hit[2]
        perms: list[auth_pb2.Permission] = []
        for raw in raw_roles:
            if raw is not None:  # a granted role that does not exist grants nothing
                perms.extend(auth_pb2.Role.FromString(raw).keyPermission)
        built = UserPermissions.from_permissions(perms)
        if len(self._perm_cache) >= CHECK_CACHE_NAMES:
            self._perm_cache.clear()
        self._perm_cache[name] = (raw_user, raw_roles, built)
        return built

    # ------------------------------------------------------------------ enable / disable / status

    def enable(self, txn: lmdb.Transaction, req: pb.AuthEnableRequest) -> pb.AuthEnableResponse:
        """Idempotent; needs user root holding role root; does not bump the revision (etcd)."""
        if self.is_enabled(txn):
            return pb.AuthEnableResponse()
        root = self.get_user(txn, ROOT_USER)
        if root is None:
            raise EtcdError(Err.ROOT_USER_NOT_EXIST)
        if not has_root_role(root):
            raise EtcdError(Err.ROOT_ROLE_NOT_EXIST)
        txn.put(_ENABLED, b"\x01", db=self._meta)
        txn.put(_ENABLED_AT, self.revision(txn).to_bytes(8, "big"), db=self._meta)
        return pb.AuthEnableResponse()

    def disable(self, txn: lmdb.Transaction, req: pb.AuthDisableRequest) -> pb.AuthDisableResponse:
        """Idempotent; when it does disable, it bumps the revision and drops every simple token."""
        if not self.is_enabled(txn):
            return pb.AuthDisableResponse()
        txn.put(_ENABLED, b"\x00", db=self._meta)
        self._bump(txn)
        txn.drop(self._tokens, delete=False)
        txn.drop(self._user_tokens, delete=False)
        return pb.AuthDisableResponse()

    def status(self, txn: lmdb.Transaction, req: pb.AuthStatusRequest) -> pb.AuthStatusResponse:
        return pb.AuthStatusResponse(enabled=self.is_enabled(txn), authRevision=self.revision(txn))

    # ------------------------------------------------------------------ users

    @staticmethod
    def _decode_hash(hashed_password: str) -> bytes:
        """The proxy sends base64(bcrypt hash); a bad encoding is etcd's ErrNoPasswordUser.

        The plaintext `password` field is ignored: it is always empty in raftgate's log, and
        hashing at apply (etcd's pre-3.5 path) would bring randomness into apply.
        """
        try:
            return base64.b64decode(hashed_password, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise EtcdError(Err.NO_PASSWORD_USER) from exc

    def user_add(self, txn: lmdb.Transaction, req: pb.AuthUserAddRequest) -> pb.AuthUserAddResponse:
        if not req.name:
            raise EtcdError(Err.USER_EMPTY)
        if self.get_user(txn, req.name) is not None:
            raise EtcdError(Err.USER_ALREADY_EXIST)
        options = auth_pb2.UserAddOptions(no_password=req.options.no_password)
        password = b"" if options.no_password else self._decode_hash(req.hashedPassword)
        self._put_user(txn, auth_pb2.User(name=req.name.encode(), password=password, options=options))
        self._bump(txn)
        self._set_credentials(txn, req.name)
        self.lockout.clear(txn, req.name)  # failures counted while the name did not exist
        return pb.AuthUserAddResponse()

    def user_delete(self, txn: lmdb.Transaction, req: pb.AuthUserDeleteRequest) -> pb.AuthUserDeleteResponse:
        if self.is_enabled(txn) and req.name == ROOT_USER:
            raise EtcdError(Err.INVALID_AUTH_MGMT)
        if self.get_user(txn, req.name) is None:
            raise EtcdError(Err.USER_NOT_FOUND)
        txn.delete(self._key(req.name), db=self._users)
        txn.delete(self._credentials_key(req.name), db=self._meta)
        self._bump(txn)
        self._drop_user_tokens(txn, req.name)
        self.lockout.clear(txn, req.name)
        return pb.AuthUserDeleteResponse()

    def user_get(self, txn: lmdb.Transaction, req: pb.AuthUserGetRequest) -> pb.AuthUserGetResponse:
        user = self.get_user(txn, req.name)
        if user is None:
            raise EtcdError(Err.USER_NOT_FOUND)
        return pb.AuthUserGetResponse(roles=list(user.roles))

    def user_list(self, txn: lmdb.Transaction, req: pb.AuthUserListRequest) -> pb.AuthUserListResponse:
        return pb.AuthUserListResponse(users=[u.name.decode() for u in self.users(txn)])

    def user_change_password(
        self, txn: lmdb.Transaction, req: pb.AuthUserChangePasswordRequest
    ) -> pb.AuthUserChangePasswordResponse:
        """A no_password user stays passwordless; the user's simple tokens are dropped."""
        user = self.get_user(txn, req.name)
        if user is None:
            raise EtcdError(Err.USER_NOT_FOUND)
        no_password = user.HasField("options") and user.options.no_password
        user.password = b"" if no_password else self._decode_hash(req.hashedPassword)
        self._put_user(txn, user)
        self._bump(txn)
        self._set_credentials(txn, req.name)
        self._drop_user_tokens(txn, req.name)
        self.lockout.clear(txn, req.name)  # root's `user passwd` lifts a lockout
        return pb.AuthUserChangePasswordResponse()

    def user_grant_role(self, txn: lmdb.Transaction, req: pb.AuthUserGrantRoleRequest) -> pb.AuthUserGrantRoleResponse:
        """Role "root" need not exist; a duplicate grant is a successful no-op without a bump."""
        user = self.get_user(txn, req.user)
        if user is None:
            raise EtcdError(Err.USER_NOT_FOUND)
        if req.role != ROOT_ROLE and self.get_role(txn, req.role) is None:
            raise EtcdError(Err.ROLE_NOT_FOUND)
        i = bisect.bisect_left(user.roles, req.role)
        if i < len(user.roles) and user.roles[i] == req.role:
            return pb.AuthUserGrantRoleResponse()
        user.roles.insert(i, req.role)
        self._put_user(txn, user)
        self._bump(txn)
        return pb.AuthUserGrantRoleResponse()

    def user_revoke_role(
        self, txn: lmdb.Transaction, req: pb.AuthUserRevokeRoleRequest
    ) -> pb.AuthUserRevokeRoleResponse:
        if self.is_enabled(txn) and req.name == ROOT_USER and req.role == ROOT_ROLE:
            raise EtcdError(Err.INVALID_AUTH_MGMT)
        user = self.get_user(txn, req.name)
        if user is None:
            raise EtcdError(Err.USER_NOT_FOUND)
        kept = [r for r in user.roles if r != req.role]
        if len(kept) == len(user.roles):
            raise EtcdError(Err.ROLE_NOT_GRANTED)
        del user.roles[:]
        user.roles.extend(kept)
        self._put_user(txn, user)
        self._bump(txn)
        return pb.AuthUserRevokeRoleResponse()

    # ------------------------------------------------------------------ roles

    def role_add(self, txn: lmdb.Transaction, req: pb.AuthRoleAddRequest) -> pb.AuthRoleAddResponse:
        if not req.name:
            raise EtcdError(Err.ROLE_EMPTY)
        if self.get_role(txn, req.name) is not None:
            raise EtcdError(Err.ROLE_ALREADY_EXIST)
        self._put_role(txn, auth_pb2.Role(name=req.name.encode()))
        self._bump(txn)
        return pb.AuthRoleAddResponse()

    def role_delete(self, txn: lmdb.Transaction, req: pb.AuthRoleDeleteRequest) -> pb.AuthRoleDeleteResponse:
        """Also strips the role from every user holding it; still a single revision bump."""
        if self.is_enabled(txn) and req.role == ROOT_ROLE:
            raise EtcdError(Err.INVALID_AUTH_MGMT)
        if self.get_role(txn, req.role) is None:
            raise EtcdError(Err.ROLE_NOT_FOUND)
        txn.delete(self._key(req.role), db=self._roles)
        for user in self.users(txn):
            if req.role in user.roles:
                kept = [r for r in user.roles if r != req.role]
                del user.roles[:]
                user.roles.extend(kept)
                self._put_user(txn, user)
        self._bump(txn)
        return pb.AuthRoleDeleteResponse()

    def role_get(self, txn: lmdb.Transaction, req: pb.AuthRoleGetRequest) -> pb.AuthRoleGetResponse:
        role = self.get_role(txn, req.role)
        if role is None:
            raise EtcdError(Err.ROLE_NOT_FOUND)
        if req.role == ROOT_ROLE:
            return pb.AuthRoleGetResponse(perm=[_root_perm()])
        return pb.AuthRoleGetResponse(perm=list(role.keyPermission))

    def role_list(self, txn: lmdb.Transaction, req: pb.AuthRoleListRequest) -> pb.AuthRoleListResponse:
        return pb.AuthRoleListResponse(roles=[r.name.decode() for r in self.roles(txn)])

    def role_grant_permission(
        self, txn: lmdb.Transaction, req: pb.AuthRoleGrantPermissionRequest
    ) -> pb.AuthRoleGrantPermissionResponse:
        """Upsert on exact (key, range_end): the type is overwritten, not merged.

        Like etcd, the existing entry is looked up by a binary search on `key` alone and only the
        first entry with that key is compared; when several entries share a key, a re-grant of a
        later one appends a duplicate (which a revoke then removes together with the original).
        """
        if not req.HasField("perm"):
            raise EtcdError(Err.PERMISSION_NOT_GIVEN)
        perm = req.perm
        if not is_valid_permission_range(perm.key, perm.range_end):
            raise EtcdError(Err.INVALID_AUTH_MGMT)
        role = self.get_role(txn, req.name)
        if role is None:
            raise EtcdError(Err.ROLE_NOT_FOUND)
        perms = list(role.keyPermission)
        keys = [p.key for p in perms]
        i = bisect.bisect_left(keys, perm.key)
        if i < len(perms) and perms[i].key == perm.key and perms[i].range_end == perm.range_end:
            perms[i].permType = perm.permType
        else:
            perms.append(auth_pb2.Permission(permType=perm.permType, key=perm.key, range_end=perm.range_end))
            perms.sort(key=lambda p: p.key)  # stable: equal keys keep their grant order
        del role.keyPermission[:]
        role.keyPermission.extend(perms)
        self._put_role(txn, role)
        self._bump(txn)
        return pb.AuthRoleGrantPermissionResponse()

    def role_revoke_permission(
        self, txn: lmdb.Transaction, req: pb.AuthRoleRevokePermissionRequest
    ) -> pb.AuthRoleRevokePermissionResponse:
        """Needs an exact (key, range_end) match and removes every duplicate of it."""
        role = self.get_role(txn, req.role)
        if role is None:
            raise EtcdError(Err.ROLE_NOT_FOUND)
        kept = [p for p in role.keyPermission if p.key != req.key or p.range_end != req.range_end]
        if len(kept) == len(role.keyPermission):
            raise EtcdError(Err.PERMISSION_NOT_GRANTED)
        del role.keyPermission[:]
        role.keyPermission.extend(kept)
        self._put_role(txn, role)
        self._bump(txn)
        return pb.AuthRoleRevokePermissionResponse()

    # ------------------------------------------------------------------ authenticate and tokens

    def authenticate(self, txn: lmdb.Transaction, req: ipb.InternalAuthenticateRequest, index: int) -> str:
        """Issues a token for a password the proxy already checked at ``req.checked_revision``.

        Re-checks what may have changed since the check: auth still enabled, the user still there
        and still password-based, and the revision unchanged (else :class:`RevisionMoved`). A simple
        token is ``prefix + "." + index`` and is registered here, on every node, in log order; for
        JWT (empty prefix) nothing is registered and "" is returned (the proxy signs).
        """
        if not self.is_enabled(txn):
            raise EtcdError(Err.AUTH_NOT_ENABLED)
        user = self.get_user(txn, req.name)
        if user is None:
            raise EtcdError(Err.AUTH_FAILED)
        if not req.lockout_off and self.lockout.is_locked(txn, req.name, req.issued_at_unix_ms):
            raise EtcdError(Err.AUTH_FAILED)  # locked out: the wrong-password answer, whatever the password
        if user.HasField("options") and user.options.no_password:
            raise EtcdError(Err.NO_PASSWORD_USER)
        current = self.revision(txn)
        if req.checked_revision != current:
            raise RevisionMoved(req.checked_revision, current)
        self.lockout.clear(txn, req.name)  # a successful login resets the count
        if not req.simple_token:
            return ""
        token = make_token(req.simple_token, index)
        tkey = token_digest(token)
        value = _TOKEN_HEAD.pack(req.issued_at_unix_ms, req.ttl_seconds) + req.name.encode()
        txn.put(tkey, value, db=self._tokens)
        txn.put(self._key(req.name), tkey, db=self._user_tokens)  # dupsort: a no-op if already there
        return token

    def record_failures(self, txn: lmdb.Transaction, req: ipb.AuthFailuresEntry, at_ms: int) -> int:
        """Counts failed password checks (lockout.py); returns how many names they locked now."""
        locked = 0
        for name in req.names[:MAX_NAMES_PER_ENTRY]:
            exists = self.get_user(txn, name) is not None
            locked += self.lockout.record_failure(txn, name, at_ms, req.attempts, req.duration_ms, exists)
        return locked

    def lookup_token(self, txn: lmdb.Transaction, token: str) -> tuple[str, int, int] | None:
        """(username, issued_at_unix_ms, ttl_seconds) of a live simple token, else None."""
        if not token:
            return None
        raw = txn.get(token_digest(token), db=self._tokens)
        if raw is None:
            return None
        issued, ttl = _TOKEN_HEAD.unpack_from(raw)
        return raw[_TOKEN_HEAD.size :].decode(), issued, ttl

    def expire_tokens(self, txn: lmdb.Transaction, digests: Iterable[bytes]) -> None:
        """Drops tokens (by digest) whose TTL ran out; unknown ones are ignored (expiry may race a
        delete)."""
        for tkey in digests:
            if not tkey:
                continue
            raw = txn.get(tkey, db=self._tokens)
            if raw is None:
                continue
            txn.delete(tkey, db=self._tokens)
            txn.delete(self._key(raw[_TOKEN_HEAD.size :]), tkey, db=self._user_tokens)

    def list_tokens(self, txn: lmdb.Transaction) -> list[tuple[bytes, tuple[str, int, int]]]:
        """Every live simple token as (digest, (username, issued_at_unix_ms, ttl_seconds)), for the
        sweeper."""
        out: list[tuple[bytes, tuple[str, int, int]]] = []
        for tkey, raw in txn.cursor(db=self._tokens):
            issued, ttl = _TOKEN_HEAD.unpack_from(raw)
            out.append((bytes(tkey), (raw[_TOKEN_HEAD.size :].decode(), issued, ttl)))
        return out

    def _drop_user_tokens(self, txn: lmdb.Transaction, name: str) -> None:
        ukey = self._key(name)
        cur = txn.cursor(db=self._user_tokens)
        if not cur.set_key(ukey):
            return
        for tkey in list(cur.iternext_dup()):
            txn.delete(tkey, db=self._tokens)
        txn.delete(ukey, db=self._user_tokens)  # without a value: every duplicate of the key
