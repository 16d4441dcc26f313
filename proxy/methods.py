"""The table of every etcd v3 method the proxy serves and where it goes in the internal request.

One row per method: the etcd service and method name, how it streams, and the field number of the
request in InternalRaftRequest (== the field number of the answer in InternalResponse). Handlers
are built from this table, so adding a method is one line and no method can be forgotten.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

ETCD_PACKAGE = "etcdserverpb"


class Kind(enum.Enum):
    UNARY = "unary"
    #: Unary store call whose answer is re-framed for a server stream (KV.RangeStream).
    RANGE_STREAM = "range_stream"
    #: Server stream from Store.Snapshot (Maintenance.Snapshot).
    SNAPSHOT = "snapshot"
    #: Bidirectional stream, one store call per client message (Lease.LeaseKeepAlive).
    KEEPALIVE = "keepalive"
    #: Not served (none today).
    UNIMPLEMENTED = "unimplemented"
    #: Bidirectional stream to the store leader's Store.WatchBatches (proxy/watch.py).
    WATCH = "watch"
    #: Handled by the proxy's Authenticate flow, not forwarded as is.
    AUTHENTICATE = "authenticate"
    #: Forwarded after the proxy hashes the password (UserAdd, UserChangePassword).
    HASH_PASSWORD = "hash_password"


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    field: int
    kind: Kind = Kind.UNARY

    @property
    def full_service(self) -> str:
        return f"{ETCD_PACKAGE}.{self.service}"


def _m(service: str, name: str, field: int, kind: Kind = Kind.UNARY) -> Method:
    return Method(service, name, field, kind)


METHODS: tuple[Method, ...] = (
    _m("KV", "Range", 3),
    _m("KV", "RangeStream", 3, Kind.RANGE_STREAM),
    _m("KV", "Put", 4),
    _m("KV", "DeleteRange", 5),
    _m("KV", "Txn", 6),
    _m("KV", "Compact", 7),
    _m("Watch", "Watch", 0, Kind.WATCH),
    _m("Lease", "LeaseGrant", 8),
    _m("Lease", "LeaseRevoke", 9),
    _m("Lease", "LeaseKeepAlive", 3022, Kind.KEEPALIVE),
    _m("Lease", "LeaseTimeToLive", 3020),
    _m("Lease", "LeaseLeases", 3021),
    _m("Cluster", "MemberAdd", 3011),
    _m("Cluster", "MemberRemove", 3012),
    _m("Cluster", "MemberUpdate", 3013),
    _m("Cluster", "MemberList", 3010),
    _m("Cluster", "MemberPromote", 3014),
    _m("Maintenance", "Alarm", 10),
    _m("Maintenance", "Status", 3000),
    _m("Maintenance", "Defragment", 3001),
    _m("Maintenance", "Hash", 3002),
    _m("Maintenance", "HashKV", 3003),
    _m("Maintenance", "Snapshot", 3004, Kind.SNAPSHOT),
    _m("Maintenance", "MoveLeader", 3005),
    _m("Maintenance", "Downgrade", 3006),
    _m("Auth", "AuthEnable", 1000),
    _m("Auth", "AuthDisable", 1011),
    _m("Auth", "AuthStatus", 1013),
    _m("Auth", "Authenticate", 1012, Kind.AUTHENTICATE),
    _m("Auth", "UserAdd", 1100, Kind.HASH_PASSWORD),
    _m("Auth", "UserGet", 1102),
    _m("Auth", "UserList", 1106),
    _m("Auth", "UserDelete", 1101),
    _m("Auth", "UserChangePassword", 1103, Kind.HASH_PASSWORD),
    _m("Auth", "UserGrantRole", 1104),
    _m("Auth", "UserRevokeRole", 1105),
    _m("Auth", "RoleAdd", 1200),
    _m("Auth", "RoleGet", 1202),
    _m("Auth", "RoleList", 1107),
    _m("Auth", "RoleDelete", 1201),
    _m("Auth", "RoleGrantPermission", 1203),
    _m("Auth", "RoleRevokePermission", 1204),
)

SERVICES: tuple[str, ...] = tuple(dict.fromkeys(m.service for m in METHODS))
