"""The one table of every etcd v3 method: how the proxy serves it, how the store answers and checks it.

Both programs read it (this package imports neither), so a method is one row, and every place that
dispatches on methods is derived from it: the proxy's gRPC handlers (proxy/services.py) and which
requests it retries (proxy/store_client.py); the store's read path and Maintenance dispatch
(authstore/api/), the applier's handlers and authorize's permission kinds (authstore/state/).
tests/unit/test_method_table.py holds the table against etcd's rpc.proto descriptors and checks
that every row has its handler on both sides.

A row: the etcd service and method; ``request``, the field of InternalRaftRequest that carries it
to the store (its answer comes back under the same field number in InternalResponse; Watch has its
own store stream); the proxy's way of serving it (``Kind``: the Pipeline method of that name); the
store's ``Route``; the permission ``Perm`` authorize applies; whether it only reads, and whether the
proxy may send it again after a failure whose outcome it does not know. The store's handler is
named after the request: ``Applier._handlers[request]`` (LOG, READ), ``Maintenance._<request>``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from protos.etcdserverpb import raft_internal_pb2 as ipb

ETCD_PACKAGE = "etcdserverpb"


class Kind(enum.Enum):
    """How the proxy serves a method; the value names the Pipeline method that does."""

    UNARY = "unary"
    #: Unary store call whose answer is re-framed for a server stream (KV.RangeStream).
    RANGE_STREAM = "range_stream"
    #: Server stream from Store.Snapshot (Maintenance.Snapshot).
    SNAPSHOT = "snapshot"
    #: Bidirectional stream, one store call per client message (Lease.LeaseKeepAlive).
    KEEPALIVE = "keepalive"
    #: Bidirectional stream to the store leader's Store.WatchBatches (proxy/watch.py).
    WATCH = "watch"
    #: Handled by the proxy's Authenticate flow, not forwarded as is.
    AUTHENTICATE = "authenticate"
    #: Forwarded after the proxy hashes the password (UserAdd, UserChangePassword).
    HASH_PASSWORD = "hash_password"


class Route(enum.Enum):
    """Where the store answers a request."""

    #: Proposed to Raft, then applied by the applier's handler (the body may make it a READ:
    #: a Txn without writes, an Alarm GET; authstore/api/server.py decides).
    LOG = "log"
    #: Answered from applied state at a read point by the applier's handler; never logged.
    READ = "read"
    #: Answered by Maintenance._<request> after the one authorization (membership through Raft).
    MAINTENANCE = "maintenance"
    #: The store's own Store.Snapshot stream.
    SNAPSHOT = "snapshot"
    #: The store's own Store.WatchBatches stream.
    WATCH = "watch"
    #: No handler: the applier answers `not capable` (etcd's LeaseCheckpoint, kept in the schema).
    NONE = "none"


class Perm(enum.Enum):
    """The check authorize applies (authstore/state/auth/authorize.py, etcd 3.7.1's rules)."""

    #: Never checked: Authenticate checks the password itself, AuthStatus is public.
    OPEN = "open"
    #: Any caller with a user name (etcd's requireAuthInfo).
    AUTHENTICATED = "authenticated"
    #: Root only (etcd's IsAdminPermitted).
    ADMIN = "admin"
    #: The keys it reads or writes, every compare and branch of a Txn included (isOpPermitted).
    KEYS = "keys"
    #: A user name, then the keys attached to the lease(s) it touches.
    LEASE_KEYS = "lease_keys"
    #: Root, or the caller's own user (UserGet) or one of its roles (RoleGet).
    ADMIN_OR_SELF = "admin_or_self"
    #: Any user to read (Alarm GET), root to change.
    ADMIN_TO_CHANGE = "admin_to_change"
    #: An entry only the store proposes, with no caller identity: not checked.
    INTERNAL = "internal"


#: Checked by a rule that reads the request's body: authorize has one per request (authorize.RULES).
BODY_PERMS = frozenset({Perm.KEYS, Perm.LEASE_KEYS, Perm.ADMIN_OR_SELF, Perm.ADMIN_TO_CHANGE})


@dataclass(frozen=True)
class Request:
    """What the store knows of one InternalRaftRequest field."""

    request: str
    route: Route
    perm: Perm
    read_only: bool = False
    retry: bool = False


@dataclass(frozen=True)
class Method(Request):
    """One etcd method, as both programs see it."""

    service: str = ""
    name: str = ""
    kind: Kind = Kind.UNARY

    @property
    def full_service(self) -> str:
        return f"{ETCD_PACKAGE}.{self.service}"

    @property
    def field(self) -> int:
        """The field number of the request in InternalRaftRequest (0: Watch, its own stream)."""
        return _FIELD_NUMBERS[self.request] if self.request else 0


_FIELD_NUMBERS = {f.name: f.number for f in ipb.InternalRaftRequest.DESCRIPTOR.fields}


def _m(service: str, name: str, request: str, route: Route, perm: Perm, kind: Kind = Kind.UNARY, *,
       read_only: bool = False, retry: bool = False) -> Method:
    if request:
        _FIELD_NUMBERS[request]  # noqa: B018 - a row naming no field fails here, at import
    return Method(request, route, perm, read_only, retry, service, name, kind)


# short names for the rows below
L, R, M = Route.LOG, Route.READ, Route.MAINTENANCE
ADMIN, AUTHN, KEYS, LEASE = Perm.ADMIN, Perm.AUTHENTICATED, Perm.KEYS, Perm.LEASE_KEYS

METHODS: tuple[Method, ...] = (
    _m("KV", "Range", "range", R, KEYS, read_only=True, retry=True),
    _m("KV", "RangeStream", "range", R, KEYS, Kind.RANGE_STREAM, read_only=True, retry=True),
    _m("KV", "Put", "put", L, KEYS),
    _m("KV", "DeleteRange", "delete_range", L, KEYS),
    _m("KV", "Txn", "txn", L, KEYS),
    _m("KV", "Compact", "compaction", L, ADMIN),
    # the watch hub checks each watched interval as a Range (authstore/api/watch/hub.py)
    _m("Watch", "Watch", "", Route.WATCH, KEYS, Kind.WATCH, read_only=True),
    _m("Lease", "LeaseGrant", "lease_grant", L, AUTHN),
    _m("Lease", "LeaseRevoke", "lease_revoke", L, LEASE),
    _m("Lease", "LeaseKeepAlive", "lease_keep_alive", M, LEASE, Kind.KEEPALIVE),
    _m("Lease", "LeaseTimeToLive", "lease_time_to_live", M, LEASE, read_only=True, retry=True),
    _m("Lease", "LeaseLeases", "lease_leases", M, LEASE, read_only=True, retry=True),
    _m("Cluster", "MemberAdd", "member_add", M, ADMIN),
    _m("Cluster", "MemberRemove", "member_remove", M, ADMIN),
    _m("Cluster", "MemberUpdate", "member_update", L, ADMIN),
    _m("Cluster", "MemberList", "member_list", M, AUTHN, read_only=True, retry=True),
    _m("Cluster", "MemberPromote", "member_promote", M, ADMIN),
    _m("Maintenance", "Alarm", "alarm", L, Perm.ADMIN_TO_CHANGE),
    _m("Maintenance", "Status", "status", M, AUTHN, read_only=True, retry=True),
    _m("Maintenance", "Defragment", "defragment", M, ADMIN),
    _m("Maintenance", "Hash", "hash", M, ADMIN, read_only=True, retry=True),
    _m("Maintenance", "HashKV", "hash_kv", M, ADMIN, read_only=True, retry=True),
    # safe to ask again until its first message only: StoreClient.snapshot does
    _m("Maintenance", "Snapshot", "snapshot", Route.SNAPSHOT, ADMIN, Kind.SNAPSHOT, read_only=True),
    _m("Maintenance", "MoveLeader", "move_leader", M, ADMIN),
    _m("Maintenance", "Downgrade", "downgrade", M, ADMIN),
    _m("Auth", "AuthEnable", "auth_enable", L, ADMIN),
    _m("Auth", "AuthDisable", "auth_disable", L, ADMIN),
    _m("Auth", "AuthStatus", "auth_status", R, Perm.OPEN, read_only=True, retry=True),
    _m("Auth", "Authenticate", "authenticate", L, Perm.OPEN, Kind.AUTHENTICATE),
    _m("Auth", "UserAdd", "auth_user_add", L, ADMIN, Kind.HASH_PASSWORD),
    _m("Auth", "UserGet", "auth_user_get", R, Perm.ADMIN_OR_SELF, read_only=True, retry=True),
    _m("Auth", "UserList", "auth_user_list", R, ADMIN, read_only=True, retry=True),
    _m("Auth", "UserDelete", "auth_user_delete", L, ADMIN),
    _m("Auth", "UserChangePassword", "auth_user_change_password", L, ADMIN, Kind.HASH_PASSWORD),
    _m("Auth", "UserGrantRole", "auth_user_grant_role", L, ADMIN),
    _m("Auth", "UserRevokeRole", "auth_user_revoke_role", L, ADMIN),
    _m("Auth", "RoleAdd", "auth_role_add", L, ADMIN),
    _m("Auth", "RoleGet", "auth_role_get", R, Perm.ADMIN_OR_SELF, read_only=True, retry=True),
    _m("Auth", "RoleList", "auth_role_list", R, ADMIN, read_only=True, retry=True),
    _m("Auth", "RoleDelete", "auth_role_delete", L, ADMIN),
    _m("Auth", "RoleGrantPermission", "auth_role_grant_permission", L, ADMIN),
    _m("Auth", "RoleRevokePermission", "auth_role_revoke_permission", L, ADMIN),
)

#: Entries only the store (or, auth_failures, the proxy itself) proposes (lease keeper, token expiry,
#: quota, member attributes, lockout counts). No client
#: RPC maps to them: the proxy only forwards a client's bytes under the field of the RPC it serves.
INTERNAL: tuple[Request, ...] = (
    Request("lease_checkpoint", Route.NONE, Perm.INTERNAL),
    Request("lease_renew", L, Perm.INTERNAL),
    Request("lease_expire", L, Perm.INTERNAL),
    Request("expire_tokens", L, Perm.INTERNAL),
    # failed password checks, recorded by a proxy itself (never a client's bytes): lockout
    Request("auth_failures", L, Perm.INTERNAL),
    Request("member_attr_set", L, Perm.INTERNAL),
    Request("store_alarm", L, Perm.INTERNAL),
)

#: Every InternalRaftRequest field the store may meet, by name (what the store calls a request kind).
REQUESTS: dict[str, Request] = {
    **{m.request: Request(m.request, m.route, m.perm, m.read_only, m.retry) for m in METHODS if m.request},
    **{e.request: e for e in INTERNAL},
}

SERVICES: tuple[str, ...] = tuple(dict.fromkeys(m.service for m in METHODS))


def requests(*, routes: tuple[Route, ...] = (), perms: tuple[Perm, ...] | frozenset[Perm] = ()) -> frozenset[str]:
    """The request names with one of these routes or permissions."""
    return frozenset(r for r, q in REQUESTS.items() if q.route in routes or q.perm in perms)


#: Field numbers of the requests the proxy may send again whatever happened (they only read).
RETRY_FIELDS = frozenset(m.field for m in METHODS if m.retry)


class MissingHandler(Exception):
    """A row of the table without its handler, or a handler without its row."""


T = TypeVar("T")


def checked(handlers: dict[str, T], expected: frozenset[str], where: str) -> dict[str, T]:
    """`handlers`, once its keys are exactly `expected` (request names from this table).

    A program whose dispatch misses a row stops when it builds it, instead of answering that
    request wrongly later; tests/unit/test_method_table.py builds every one.
    """
    missing, extra = sorted(expected - handlers.keys()), sorted(handlers.keys() - expected)
    if missing or extra:
        raise MissingHandler(f"{where}: no handler for {missing}, no row for {extra} (raftgate/methods.py)")
    return handlers
