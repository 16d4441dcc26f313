"""Every Prometheus metric of the authproxy, defined once, with the only label values allowed.

Names follow Prometheus conventions: ``raftgate_proxy_`` prefix, counters end in ``_total``,
durations are ``_seconds``, labels are snake_case. Label values come only from closed sets (the
results below, the method table, gRPC status codes, ``InternalRaftRequest`` field names): never a
user name, key, token or password, nor anything else a client chooses, so a client can neither
read secrets from ``/metrics`` nor blow up its cardinality.
"""

from __future__ import annotations

from typing import Literal

import grpc
from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from protos.etcdserverpb import raft_internal_pb2 as ipb
from raftgate.errors import Err
from raftgate.fast_histogram import FastHistogram

# The *_created series double every counter and histogram for no use in dashboards or alerts.
disable_created_metrics()

AuthResult = Literal[
    "ok", "auth_failed", "not_enabled", "no_password", "verify_only", "no_token_provider",
    "revision_retry_exhausted", "rate_limited", "error",
]
AUTH_RESULTS: tuple[AuthResult, ...] = AuthResult.__args__  # type: ignore[attr-defined]

TokenKind = Literal["simple", "jwt", "workload"]
TokenResult = Literal["valid", "cache_hit", "invalid", "expired"]
TOKEN_KINDS: tuple[TokenKind, ...] = TokenKind.__args__  # type: ignore[attr-defined]
TOKEN_RESULTS: tuple[TokenResult, ...] = TokenResult.__args__  # type: ignore[attr-defined]

#: The two bcrypt lanes (proxy/passwords.py): check (Authenticate), hash (UserAdd, UserChangePassword).
BcryptOperation = Literal["check", "hash"]
BCRYPT_OPERATIONS: tuple[BcryptOperation, ...] = BcryptOperation.__args__  # type: ignore[attr-defined]

RefreshReason = Literal["expired", "invalid_token", "old_revision", "user_empty", "credentials_changed"]
REFRESH_REASONS: tuple[RefreshReason, ...] = RefreshReason.__args__  # type: ignore[attr-defined]

# bcrypt: ~1 ms at cost 4, ~60 ms at cost 10, ~250 ms at cost 12.
_BCRYPT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Always on (raftgate/fast_histogram.py: well under 1 µs an observation), on the event loop only.
LINK_CALLS_PER_MESSAGE = FastHistogram(
    "raftgate_proxy_link_calls_per_message",
    "Calls in one message the proxy sent to a store node on its DoStream (DoBatch size).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
_REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

AUTHENTICATIONS = Counter(
    "raftgate_proxy_authentications_total", "Authenticate calls handled by this proxy, by result.", ["result"]
)
#: etcd counts its /health answers as etcd_server_health_success / _failures
GATEWAY_HEALTH_CHECKS = Counter(
    "raftgate_proxy_gateway_health_checks_total", "GET /health answers on the JSON gateway, by result.", ["result"]
)
AUTHENTICATE_REVISION_RETRIES = Counter(
    "raftgate_proxy_authenticate_revision_retries_total",
    "Authenticate attempts started again because the auth revision moved during the password check.",
)
BCRYPT_DURATION = Histogram(
    "raftgate_proxy_bcrypt_duration_seconds",
    "Time of one bcrypt operation on the worker pool (check: Authenticate; hash: UserAdd/ChangePassword).",
    ["operation"],
    buckets=_BCRYPT_BUCKETS,
)
BCRYPT_QUEUE_DEPTH = Gauge(
    "raftgate_proxy_bcrypt_queue_depth", "bcrypt operations waiting for a free worker thread, by lane (operation).",
    ["operation"],
)
TOKEN_VALIDATIONS = Counter(
    "raftgate_proxy_token_validations_total", "Tokens resolved by this proxy, by token kind and result.",
    ["kind", "result"],
)
REQUESTS = Counter(
    "raftgate_proxy_requests_total", "etcd v3 RPCs finished, by service, method and gRPC status code.",
    ["service", "method", "code"],
)
REQUEST_DURATION = Histogram(
    "raftgate_proxy_request_duration_seconds", "Time to answer a unary etcd v3 RPC.", ["service", "method"],
    buckets=_REQUEST_BUCKETS,
)
OPEN_STREAMS = Gauge("raftgate_proxy_open_streams", "Streaming etcd v3 RPCs open right now.", ["service", "method"])
WATCH_SUBSTREAMS = Gauge(
    "raftgate_proxy_watch_substreams",
    "Client Watch streams carried as sub-streams of the proxy's shared watch streams to the store (WatchShared).",
)
WATCH_SLOW_CLOSES = Counter(
    "raftgate_proxy_watch_slow_closes_total",
    "Watch sub-streams closed because their client read too slowly (resumed from the store's history).",
)
PERMISSION_DENIALS = Counter(
    "raftgate_proxy_permission_denials_total", "Store answers 'permission denied', by request kind.", ["kind"]
)
OLD_REVISION_REFUSALS = Counter(
    "raftgate_proxy_old_revision_refusals_total",
    "Store answers 'revision of auth store is old', by request kind.",
    ["kind"],
)
IDENTITY_REFRESHES = Counter(
    "raftgate_proxy_identity_refreshes_total",
    "Sidecar identity mode: new tokens fetched for the lent identity, by reason.",
    ["reason"],
)
IDENTITY_RELOADS = Counter(
    "raftgate_proxy_identity_file_reloads_total",
    "Sidecar identity mode: identity files re-read after they changed, by result.",
    ["result"],
)
JWT_KEY_RELOADS = Counter(
    "raftgate_proxy_jwt_key_reloads_total",
    "JWT keys re-read after their files changed (source files) or fetched from jwks-url (source jwks_url), "
    "by result; an error keeps the keys in force.",
    ["source", "result"],
)

AUDIT_WRITTEN = Counter("raftgate_proxy_audit_records_written_total", "Audit log records written (--audit-log).")
AUDIT_DROPPED = Counter(
    "raftgate_proxy_audit_records_dropped_total",
    "Audit log records dropped because the queue was full (the log could not be written fast enough, or at all).",
)
AUDIT_REFUSALS = Counter(
    "raftgate_proxy_audit_refusals_total",
    "Requests refused with 'raftgate: audit log unavailable' (--audit-fail-closed).",
)
AUDIT_WRITE_ERRORS = Counter("raftgate_proxy_audit_write_errors_total", "Failed opens or writes of the audit log.")
AUDIT_WRITABLE = Gauge("raftgate_proxy_audit_log_writable", "1 while the audit log can be written, else 0.")
AUDIT_QUEUE_BYTES = Gauge("raftgate_proxy_audit_queue_bytes", "Audit records waiting for the writer, in bytes.")

# Zero series for the closed label sets, so rates and alerts work before the first event.
for _r in AUTH_RESULTS:
    AUTHENTICATIONS.labels(_r)
for _k in TOKEN_KINDS:
    for _t in TOKEN_RESULTS:
        TOKEN_VALIDATIONS.labels(_k, _t)
for _source in ("files", "jwks_url"):
    for _result in ("ok", "error"):
        JWT_KEY_RELOADS.labels(_source, _result)
for _op in BCRYPT_OPERATIONS:
    BCRYPT_DURATION.labels(_op)
    BCRYPT_QUEUE_DEPTH.labels(_op)

_FIELD_NAMES = {f.number: f.name for f in ipb.InternalRaftRequest.DESCRIPTOR.fields}


def request_kind(field: int) -> str:
    """The request kind label for a method's field in InternalRaftRequest (the store uses the same names)."""
    return _FIELD_NAMES.get(field, "other")


def authentication(result: AuthResult) -> None:
    AUTHENTICATIONS.labels(result).inc()


def token_validation(kind: TokenKind, result: TokenResult) -> None:
    TOKEN_VALIDATIONS.labels(kind, result).inc()


def store_refusal(field: int, code: grpc.StatusCode, details: str) -> None:
    """Counts a store answer that is a permission denial or an old-revision refusal."""
    if code == Err.PERMISSION_DENIED.code and details == Err.PERMISSION_DENIED.message:
        PERMISSION_DENIALS.labels(request_kind(field)).inc()
    elif code == Err.AUTH_OLD_REVISION.code and details == Err.AUTH_OLD_REVISION.message:
        OLD_REVISION_REFUSALS.labels(request_kind(field)).inc()


def identity_refresh(reason: RefreshReason) -> None:
    IDENTITY_REFRESHES.labels(reason).inc()
