"""The store's internal port, as one table: who may call each method, carrying which requests.

Why one table: the rules used to live in several places (a list of requests a sidecar may not
send, a refusal per handler, an interceptor that opened health only), each with its own partial
list, and one handler (Store.Snapshot) authorized whatever request kind the caller put into it -
a sidecar's credential downloaded the whole store (issue 21). Here every method the internal port
serves has one row; the store enforces it in one place (authstore/api/interceptors.py ``admit``, which
every handler goes through) and refuses what has no row.

A row names, per caller class, whether that class may call the method and, for a method that
carries an InternalRaftRequest (``Do``, a DoStream ``DO`` call, ``Snapshot``), which request kinds
(raftgate/methods.py REQUESTS: every InternalRaftRequest field) it may carry. What a row allows
is then judged as usual: a central proxy's stamped header, a sidecar's token verified by the store
(then etcd's checks, e.g. ``Snapshot``'s root-only one, apply to that identity).

Caller classes (authstore/api/callers.py tells them apart by credential):
* CENTRAL: a central proxy, trusted to name the user (root-equivalent);
* SIDECAR: a sidecar, trusted with nothing about identity;
* NONE: no valid credential (development secret mode: no secret or a wrong one; with mTLS the
  handshake refuses such a caller before any method).

tests/unit/test_internal_access_table.py holds the rows against the proto descriptors and the
store's handlers; tests/internal/test_internal_access.py calls every cell against a running store.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from protos.storepb import store_pb2
from raftgate.methods import REQUESTS


class Caller(enum.Enum):
    """A class of internal caller, decided by its credential alone."""

    CENTRAL = "central"
    SIDECAR = "sidecar"
    NONE = "none"


STORE_SERVICE = store_pb2.DESCRIPTOR.services_by_name["Store"].full_name
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"


def rpc(service: str, method: str) -> str:
    """A gRPC method's path, as the server sees it (``HandlerCallDetails.method``)."""
    return f"/{service}/{method}"


def stream_call(method: str) -> str:
    """A DoStream call's method (a DoCall.Method name), named under DoStream."""
    return f"{rpc(STORE_SERVICE, 'DoStream')}#{method}"


DO = rpc(STORE_SERVICE, "Do")
DO_STREAM = rpc(STORE_SERVICE, "DoStream")
SNAPSHOT = rpc(STORE_SERVICE, "Snapshot")
CREDENTIALS = rpc(STORE_SERVICE, "Credentials")
RESOLVE_TOKEN = rpc(STORE_SERVICE, "ResolveToken")
LEADER = rpc(STORE_SERVICE, "Leader")
WATCH_BATCHES = rpc(STORE_SERVICE, "WatchBatches")
WATCH_SHARED = rpc(STORE_SERVICE, "WatchShared")
CHALLENGE = rpc(STORE_SERVICE, "Challenge")
CALL_DO = stream_call("DO")
CALL_CREDENTIALS = stream_call("CREDENTIALS")
CALL_RESOLVE_TOKEN = stream_call("RESOLVE_TOKEN")
CALL_AUTHENTICATE = stream_call("AUTHENTICATE")
HEALTH_CHECK = rpc(HEALTH_SERVICE, "Check")
HEALTH_WATCH = rpc(HEALTH_SERVICE, "Watch")
HEALTH_LIST = rpc(HEALTH_SERVICE, "List")
REFLECTION = rpc(REFLECTION_SERVICE, "ServerReflectionInfo")

# ---- request kinds ----

C, S, N = Caller.CENTRAL, Caller.SIDECAR, Caller.NONE
BOTH: frozenset[Caller] = frozenset({C, S})
CENTRAL_ONLY: frozenset[Caller] = frozenset({C})
NOBODY: frozenset[Caller] = frozenset()

#: Every request kind (InternalRaftRequest field): the classes that may send it on Do and in
#: DoStream's DO calls. A proxy forwards its client's request under the field of the etcd method
#: it serves; the store then judges the identity (a central proxy's stamp, a sidecar's token).
DO_SENDERS: dict[str, frozenset[Caller]] = {
    **dict.fromkeys(("range", "put", "delete_range", "txn", "compaction"), BOTH),
    **dict.fromkeys(("lease_grant", "lease_revoke", "lease_keep_alive", "lease_time_to_live", "lease_leases"), BOTH),
    **dict.fromkeys(("member_add", "member_remove", "member_update", "member_list", "member_promote"), BOTH),
    **dict.fromkeys(("alarm", "status", "defragment", "hash", "hash_kv", "move_leader", "downgrade"), BOTH),
    # Maintenance.Snapshot travels on Store.Snapshot, and nothing else does (issue 21)
    "snapshot": NOBODY,
    **dict.fromkeys(("auth_enable", "auth_disable", "auth_status"), BOTH),
    **dict.fromkeys(("auth_user_add", "auth_user_delete", "auth_user_get", "auth_user_change_password",
                     "auth_user_grant_role", "auth_user_revoke_role", "auth_user_list"), BOTH),
    **dict.fromkeys(("auth_role_add", "auth_role_delete", "auth_role_get", "auth_role_grant_permission",
                     "auth_role_revoke_permission", "auth_role_list"), BOTH),
    # registers a token for a password its sender checked: a central proxy checks passwords
    # itself; a sidecar may not (it logs in with DoStream's AUTHENTICATE, which the store checks)
    "authenticate": CENTRAL_ONLY,
    # failed password checks a central proxy counts for the lockout (proxy/authenticate.py)
    "auth_failures": CENTRAL_ONLY,
    # entries only the store proposes (lease keeper, token expiry, quota, member attributes)
    **dict.fromkeys(("lease_checkpoint", "lease_renew", "lease_expire", "expire_tokens", "member_attr_set",
                     "store_alarm"), NOBODY),
}

#: The request kinds each class may carry on Do and in DoStream's DO calls.
CENTRAL_DO_KINDS = frozenset(k for k, who in DO_SENDERS.items() if C in who)
SIDECAR_DO_KINDS = frozenset(k for k, who in DO_SENDERS.items() if S in who)
#: What Store.Snapshot carries: the snapshot request only.
SNAPSHOT_KINDS = frozenset({"snapshot"})

#: A method that carries no request kind.
NO_KINDS = None


@dataclass(frozen=True)
class Row:
    """One method: ``may`` maps each class allowed to call it to the request kinds it may carry
    (``NO_KINDS``: the method carries none); a class not in it is refused. ``does`` words the
    refusal ("a sidecar credential may not <does>")."""

    method: str
    does: str
    may: Mapping[Caller, frozenset[str] | None]

    @property
    def carries_kinds(self) -> bool:
        return any(kinds is not None for kinds in self.may.values())


ROWS: tuple[Row, ...] = (
    Row(DO, "call Do", {C: CENTRAL_DO_KINDS, S: SIDECAR_DO_KINDS}),
    Row(DO_STREAM, "open DoStream", {C: NO_KINDS, S: NO_KINDS}),
    Row(CALL_DO, "send DO calls", {C: CENTRAL_DO_KINDS, S: SIDECAR_DO_KINDS}),
    # the password hashes: only a central proxy checks passwords itself
    Row(CALL_CREDENTIALS, "read password hashes (Credentials)", {C: NO_KINDS}),
    Row(CREDENTIALS, "read password hashes (Credentials)", {C: NO_KINDS}),
    # resolving any token names its user: a sidecar's tokens are verified by the store instead
    Row(CALL_RESOLVE_TOKEN, "resolve tokens (ResolveToken)", {C: NO_KINDS}),
    Row(RESOLVE_TOKEN, "resolve tokens (ResolveToken)", {C: NO_KINDS}),
    # the store checks the password itself (how sidecars log in)
    Row(CALL_AUTHENTICATE, "log in (AUTHENTICATE)", {C: NO_KINDS, S: NO_KINDS}),
    # the snapshot request only; then etcd's root-only check, on the identity the store verified
    Row(SNAPSHOT, "take snapshots", {C: SNAPSHOT_KINDS, S: SNAPSHOT_KINDS}),
    # who leads and where members are: no secret, what a proxy connects to anyway
    Row(LEADER, "ask for the leader", {C: NO_KINDS, S: NO_KINDS}),
    # each create is judged as a Range for the stream's identity (a sidecar's: its token's)
    Row(WATCH_BATCHES, "watch", {C: NO_KINDS, S: NO_KINDS}),
    # WatchBatches streams as sub-streams of one: each served as a WatchBatches stream, as above
    Row(WATCH_SHARED, "watch", {C: NO_KINDS, S: NO_KINDS}),
    # a nonce to prove a development secret over (raftgate/secret_proof.py): asked before any
    # credential is proven, so open to all; with mTLS there is nothing to prove (UNIMPLEMENTED)
    Row(CHALLENGE, "ask for a challenge", {C: NO_KINDS, S: NO_KINDS, N: NO_KINDS}),
    # probes carry no credential (Check answers at once)
    Row(HEALTH_CHECK, "check health", {C: NO_KINDS, S: NO_KINDS, N: NO_KINDS}),
    # a stream that never ends: open to anyone, it let a caller without a credential hold
    # thousands (memory without bound before authentication); probes use Check
    Row(HEALTH_WATCH, "watch health", {C: NO_KINDS, S: NO_KINDS}),
    # grpc's asyncio health servicer does not implement List (it raises, and each call would
    # log a traceback): refused to everyone
    Row(HEALTH_LIST, "list health", {}),
    # the internal contract, to authenticated callers only
    Row(REFLECTION, "use reflection", {C: NO_KINDS, S: NO_KINDS}),
)

TABLE: dict[str, Row] = {row.method: row for row in ROWS}
#: The methods a caller without a credential may call (secret mode lets them through unproven).
OPEN_TO_NONE: tuple[str, ...] = tuple(row.method for row in ROWS if Caller.NONE in row.may)

UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, "raftgate: internal port requires proxy credentials")


def short_name(method: str) -> str:
    """``Store/Do``, ``Store/DoStream#CREDENTIALS``, ``Health/Check``: how a refusal names a method."""
    return method.rsplit(".", 1)[-1]


def decide(method: str, caller: Caller, kind: str | None = None) -> tuple[grpc.StatusCode, str] | None:
    """None if ``caller`` may call ``method`` (carrying ``kind``, if given), else the refusal
    (gRPC code, message). A method without a row is refused to everyone."""
    row = TABLE.get(method)
    if caller is Caller.NONE and (row is None or caller not in row.may):
        return UNAUTHENTICATED
    if row is None:
        return grpc.StatusCode.PERMISSION_DENIED, f"raftgate: {short_name(method)} has no internal access rule"
    if caller not in row.may:
        return grpc.StatusCode.PERMISSION_DENIED, f"raftgate: a {caller.value} credential may not {row.does}"
    if kind is None:
        return None
    kinds = row.may[caller]
    if kinds is None or kind not in kinds:
        return (grpc.StatusCode.PERMISSION_DENIED,
                f"raftgate: a {caller.value} credential may not send {kind} on {short_name(method)}")
    return None


def _check_table() -> None:
    """Every request kind has its senders, and every kind a row names is a request kind (a
    typo would silently allow nothing)."""
    missing, extra = sorted(REQUESTS.keys() - DO_SENDERS.keys()), sorted(DO_SENDERS.keys() - REQUESTS.keys())
    if missing or extra:
        raise ValueError(f"raftgate/internal_access.py: no senders for {missing}, senders of no request {extra}")
    for row in ROWS:
        for kinds in row.may.values():
            unknown = (kinds or frozenset()) - REQUESTS.keys()
            if unknown:
                raise ValueError(f"raftgate/internal_access.py: {row.method} names no request {sorted(unknown)}")


_check_table()
