"""The audit log (``--audit-log``): one JSON object per line for every auditable event.

Why here and this way: the proxy sees every client request (etcd has no audit trail, #21764), so
it is where Vault-style audit records belong. A record names the method, the user the request ran
as, the client address, the result (``"ok"`` or etcd's error message), the keys (base64, as etcd's
JSON gateway writes bytes), the auth revision, the duration and a token's sha256 fingerprint —
never a password, a token or a value: records are built from a closed set of request fields.

Writes never block the event loop: records go into a queue bounded in bytes that one writer
thread drains with plain ``os.write`` calls. At the bound a record is dropped and counted
(``raftgate_proxy_audit_records_dropped_total``); with ``--audit-fail-closed`` a request is
admitted only when the log is writable and its record is sure to fit (room is reserved when the
request arrives), otherwise it is refused with ``Unavailable`` ``raftgate: audit log unavailable``
(Vault's rule: nothing served unaudited). A write that fails is kept and tried again (every
``RETRY_SECONDS``, or at once on SIGHUP, which also reopens the file for logrotate), so a full disk
loses nothing until the queue is full.

Levels (``--audit-level``): ``auth`` — Authenticate and every auth administration call (the Auth
service's methods that are not open to anyone: derived from raftgate/methods.py); ``denials``
(default) — those plus every request answered with an error (a client's own cancellation is not a
refusal); ``all`` — every request. Watch streams are recorded per create and cancel, not per event.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import contextvars
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2
from proxy import metrics
from proxy.tokens.extract import extract_token
from raftgate.errors import Err
from raftgate.methods import METHODS, Kind, Method, Perm
from raftgate.token_verifier import fingerprint

log = logging.getLogger(__name__)

STDOUT = "-"
LEVELS = ("auth", "denials", "all")
DEFAULT_LEVEL = "denials"
#: Bytes of records (and reservations) the queue holds at most.
QUEUE_BYTES = 8 << 20
#: One record's bound: strings and keys are cut (``"truncated": true``) so a line never exceeds it.
MAX_RECORD_BYTES = 16 << 10
MAX_KEY_BYTES = 256  # of each key or range_end, before base64
MAX_TEXT_CHARS = 256  # of the user name, peer, result and names
MAX_TXN_OPS = 8  # a Txn's compares and ops recorded (depth first); more: "truncated"
RETRY_SECONDS = 1.0  # a log that cannot be written is tried again this often
BATCH_BYTES = 256 << 10  # written with one os.write
UNAVAILABLE = Err.AUDIT_UNAVAILABLE

#: Auditable at every level: Authenticate, and the Auth service's administration calls.
AUTH_METHODS = frozenset(m for m in METHODS if m.service == "Auth" and (m.perm is not Perm.OPEN
                                                                        or m.kind is Kind.AUTHENTICATE))
_GO_STATUS = re.compile(r"rpc error: code = \w+ desc = (.*)", re.S)
_REQUEST_TYPES: dict[tuple[str, str], type[Message]] = {}


def _request_type(method: Method) -> type[Message]:
    key = (method.service, method.name)
    found = _REQUEST_TYPES.get(key)
    if found is None:
        desc = rpc_pb2.DESCRIPTOR.services_by_name[method.service].methods_by_name[method.name]
        found = _REQUEST_TYPES[key] = GetMessageClass(desc.input_type)
    return found


# --- records ------------------------------------------------------------------------------------


def rfc3339(wall: float) -> str:
    """UTC, microseconds, ``Z``: sorts as text, as Vault's and Kubernetes' audit times do."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def b64(data: bytes) -> tuple[str, bool]:
    """etcd's JSON gateway form of bytes; cut at MAX_KEY_BYTES (True when cut)."""
    return base64.b64encode(data[:MAX_KEY_BYTES]).decode("ascii"), len(data) > MAX_KEY_BYTES


def text(value: str) -> tuple[str, bool]:
    return value[:MAX_TEXT_CHARS], len(value) > MAX_TEXT_CHARS


def result_text(message: str) -> str:
    """etcd's message, without the ``rpc error: code = X desc =`` a watch's cancel_reason carries."""
    match = _GO_STATUS.fullmatch(message)
    return match.group(1) if match else message


class _Fields:
    """Builds a record's optional fields, cutting what is too long and noting that it did."""

    def __init__(self) -> None:
        self.out: dict[str, Any] = {}
        self.truncated = False

    def key(self, name: str, data: bytes, into: dict[str, Any] | None = None) -> None:
        if data:
            (into if into is not None else self.out)[name], cut = b64(data)
            self.truncated |= cut

    def text(self, name: str, value: str) -> None:
        if value:
            self.out[name], cut = text(value)
            self.truncated |= cut


def request_fields(method: Method, request: bytes | None) -> dict[str, Any]:
    """The keys (and, for auth administration, the user and role names) a request names.

    Only these fields are read: never a value, a password or a lease's secrets. A request that
    does not decode gives nothing (its refusal says why)."""
    if not request or method.kind is Kind.WATCH or method.field == 0:
        return {}
    try:
        message: Any = _request_type(method).FromString(request)
    except (DecodeError, Exception):  # noqa: BLE001 - a malformed request names no key
        return {}
    f = _Fields()
    if method.service == "KV" and method.name != "Compact":
        if method.name == "Txn":
            _txn_fields(f, message)
        else:
            f.key("key", message.key)
            if method.name != "Put":
                f.key("range_end", message.range_end)
    elif method.service == "Auth":
        # the user or role acted on (each request names them in its own fields)
        names = message.DESCRIPTOR.fields_by_name
        target = "target_role" if method.name.startswith("Role") else "target_user"
        for name in ("name", "user"):
            if name in names:
                f.text(target, getattr(message, name))
        if "role" in names:
            f.text("target_role", message.role)
        if method.name in ("RoleGrantPermission", "RoleRevokePermission"):
            perm = message.perm if method.name == "RoleGrantPermission" else message
            f.key("key", perm.key)
            f.key("range_end", perm.range_end)
            if method.name == "RoleGrantPermission":
                f.out["perm"] = auth_pb2.Permission.Type.Name(perm.permType) \
                    if perm.permType in auth_pb2.Permission.Type.values() else int(perm.permType)
    if f.truncated:
        f.out["truncated"] = True
    return f.out


def _txn_fields(f: _Fields, txn: Any) -> None:
    """A Txn's compares and ops, depth first, at most MAX_TXN_OPS of them: {op, key, range_end};
    the walk stops there (``truncated``), so a huge Txn costs no more than a small one."""
    ops: list[dict[str, Any]] = []
    stack: list[Iterable[tuple[str, Any]]] = [_txn_items(txn)]
    while stack:
        item = next(iter(stack[-1]), None)
        if item is None:
            stack.pop()
            continue
        kind, body = item
        if len(ops) >= MAX_TXN_OPS:
            f.truncated = True
            break
        if kind == "txn":
            stack.append(_txn_items(body))
        entry: dict[str, Any] = {"op": kind}
        if kind != "txn":
            f.key("key", body.key, entry)
            if kind != "put":
                f.key("range_end", body.range_end, entry)
        ops.append(entry)
    f.out["ops"] = ops


def _txn_items(txn: Any) -> Iterable[tuple[str, Any]]:
    """(kind, message) for each compare and op of one Txn level (an iterator: consumed once)."""

    def items() -> Iterable[tuple[str, Any]]:
        for compare in txn.compare:
            yield "compare", compare
        for op in (*txn.success, *txn.failure):
            which = op.WhichOneof("request")
            if which is not None:
                yield {"request_range": "range", "request_put": "put", "request_delete_range": "delete_range",
                       "request_txn": "txn"}[which], getattr(op, which)

    return iter(items())


def method_path(method: Method) -> str:
    return f"/{method.full_service}/{method.name}"


def build(*, wall: float, method: Method, user: str, peer: str, result: str, auth_revision: int,
          duration_ms: float, token_fp: str, extra: dict[str, Any] | None = None) -> bytes:
    """One record as a JSON line (bytes, ``\\n`` ended, at most MAX_RECORD_BYTES)."""
    f = _Fields()
    record: dict[str, Any] = {"time": rfc3339(wall), "method": method_path(method)}
    record["user"], cut_user = text(user)
    record["peer"], cut_peer = text(peer)
    record["result"], cut_result = text(result)
    f.truncated = cut_user or cut_peer or cut_result
    record.update({"auth_revision": auth_revision, "duration_ms": round(duration_ms, 3), "token_fp": token_fp})
    if extra:
        record.update((k, v) for k, v in extra.items() if k not in record)
    if f.truncated:
        record["truncated"] = True
    line = json.dumps(record, separators=(",", ":")).encode("ascii") + b"\n"
    if len(line) > MAX_RECORD_BYTES:  # pathological names: keep the core fields only
        for name in ("ops", "target_user", "target_role", "key", "range_end"):
            record.pop(name, None)
        record["truncated"] = True
        line = json.dumps(record, separators=(",", ":")).encode("ascii") + b"\n"
    return line


# --- one call's record --------------------------------------------------------------------------


@dataclass
class Call:
    """What one RPC's record knows; the pipeline fills in the identity as it resolves it."""

    method: Method
    peer: str
    wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    user: str = ""
    auth_revision: int = 0
    token_fp: str = ""
    #: Authenticate of a locked-out name: the client's answer is a wrong password's, the record says so
    locked: bool = False
    #: the token ``token_fp`` was taken of, so that noting it again costs no second hash (never
    #: recorded, never shown; the record holds only its fingerprint)
    token: str | None = field(default=None, repr=False, compare=False)


CURRENT: contextvars.ContextVar[Call | None] = contextvars.ContextVar("raftgate_audit_call", default=None)


def noted_token(token: str | None) -> None:
    """The token the current call presents (its fingerprint only); no-op without an audit log."""
    call = CURRENT.get()
    if call is not None and token != call.token:
        call.token, call.token_fp = token, "" if token is None else fingerprint(token)


def noted_locked() -> None:
    """The current Authenticate named a locked-out user (for the operator; never for the client)."""
    call = CURRENT.get()
    if call is not None:
        call.locked = True


def noted_identity(username: str, revision: int) -> None:
    """The identity the current call runs as (what the store's header will say)."""
    call = CURRENT.get()
    if call is not None:
        call.user, call.auth_revision = username, revision


def status_result(code: grpc.StatusCode | None, details: str | None) -> str:
    if code is None or code == grpc.StatusCode.OK:
        return "ok"
    if code == grpc.StatusCode.CANCELLED and not details:
        return "context canceled"  # grpc-go's words for a client that went away
    return result_text(details or code.name)


def is_refusal(code: grpc.StatusCode | None) -> bool:
    """An error answer, not a client's own cancellation."""
    return code is not None and code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED)


# --- the writer ---------------------------------------------------------------------------------


class AuditLogError(OSError):
    """The audit log cannot be opened at start-up."""


class AuditLog:
    """The queue (bounded in bytes) and the writer thread behind ``--audit-log``.

    The event loop only calls ``admit``/``submit``/``release``/``reopen`` (a short lock, no I/O);
    the writer thread does every open and write.
    """

    def __init__(self, path: str, level: str = DEFAULT_LEVEL, *, fail_closed: bool = False,
                 queue_bytes: int = QUEUE_BYTES) -> None:
        if level not in LEVELS:
            raise ValueError(f"audit level {level!r} is not one of {', '.join(LEVELS)}")
        self.path = path
        self.level = level
        self.fail_closed = fail_closed
        self.queue_bytes = queue_bytes
        self._lock = threading.Condition(threading.Lock())
        self._lines: collections.deque[bytes] = collections.deque()
        self._queued = 0  # bytes in _lines and _unwritten
        self._reserved = 0  # bytes promised to admitted requests
        self._unwritten = b""  # the rest of a batch whose write failed: written first, never dropped
        self._writable = True
        self._reopen = False
        self._closing = False
        self._dropping = False  # logged once per episode
        self._fd: int | None = None
        self._thread: threading.Thread | None = None

    # -- life

    def start(self) -> None:
        """Opens the file (an AuditLogError if it cannot: better to stop than to serve unaudited)
        and starts the writer thread."""
        try:
            self._fd = self._open()
        except OSError as e:
            raise AuditLogError(f"--audit-log: cannot open {self.path!r}: {e.strerror}") from None
        metrics.AUDIT_WRITABLE.set(1)
        self._thread = threading.Thread(target=self._run, name="raftgate-audit", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Writes what is queued (for at most ``timeout`` seconds), then stops the thread."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._fd is not None and self.path != STDOUT and (self._thread is None or not self._thread.is_alive()):
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def reopen(self) -> None:
        """SIGHUP: the writer closes and opens the file again (logrotate), and retries at once."""
        with self._lock:
            self._reopen = True
            self._lock.notify_all()

    # -- the event loop's side

    def wants(self, method: Method, code: grpc.StatusCode | None) -> bool:
        """Whether this level records a call of ``method`` that ended with ``code``."""
        if self.level == "all" or method in AUTH_METHODS:
            return True
        return self.level == "denials" and is_refusal(code)

    def admit(self) -> bool:
        """Fail-closed admission: the log is writable and one record's room is reserved (give it
        back with ``submit(..., reserved=True)`` or ``release``). Without fail-closed: True."""
        if not self.fail_closed:
            return True
        with self._lock:
            if self._writable and self._queued + self._reserved + MAX_RECORD_BYTES <= self.queue_bytes:
                self._reserved += MAX_RECORD_BYTES
                return True
        metrics.AUDIT_REFUSALS.inc()
        return False

    def release(self, count: int = 1) -> None:
        if self.fail_closed and count:
            with self._lock:
                self._reserved = max(0, self._reserved - count * MAX_RECORD_BYTES)

    def submit(self, line: bytes, *, reserved: bool = False) -> bool:
        """Queues one record; False (dropped, counted) when it does not fit."""
        with self._lock:
            if reserved and self.fail_closed:
                self._reserved = max(0, self._reserved - MAX_RECORD_BYTES)
            elif self._queued + self._reserved + len(line) > self.queue_bytes:
                first = not self._dropping
                self._dropping = True
                metrics.AUDIT_DROPPED.inc()
                if first:
                    log.warning("audit log queue full (%d bytes): records are dropped and counted in "
                                "raftgate_proxy_audit_records_dropped_total", self.queue_bytes)
                return False
            self._lines.append(line)
            self._queued += len(line)
            metrics.AUDIT_QUEUE_BYTES.set(self._queued)
            self._lock.notify_all()
            return True

    @property
    def writable(self) -> bool:
        return self._writable

    # -- the writer thread

    def _open(self) -> int:
        if self.path == STDOUT:
            return 1
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _run(self) -> None:
        retry_at = 0.0  # while the log cannot be written: when to try again
        while True:
            with self._lock:
                while not (self._closing or self._reopen):
                    if not self._writable:
                        left = retry_at - time.monotonic()
                        if left <= 0:
                            break
                        self._lock.wait(left)
                    elif self._lines or self._unwritten:
                        break
                    else:
                        self._lock.wait()
                reopen, self._reopen = self._reopen, False
                closing = self._closing
                # only the lines are taken here (the event loop waits for this lock at every
                # request); the batch is joined outside it, in linear time
                parts = [self._unwritten] if self._unwritten else []
                size = len(self._unwritten)
                while self._lines and size < BATCH_BYTES:
                    parts.append(self._lines.popleft())
                    size += len(parts[-1])
                self._unwritten = b""
            batch = b"".join(parts)
            if closing and not batch and not reopen:
                return
            written, error = self._write(batch, reopen)
            with self._lock:
                self._unwritten = batch[written:]
                self._queued -= written
                metrics.AUDIT_QUEUE_BYTES.set(self._queued)
                if written:
                    metrics.AUDIT_WRITTEN.inc(batch.count(b"\n", 0, written))
                if error is None:
                    if not self._writable:
                        log.warning("audit log %s is writable again", self.path)
                    self._writable, self._dropping = True, False
                else:
                    metrics.AUDIT_WRITE_ERRORS.inc()
                    if self._writable:
                        log.error("audit log %s cannot be written (%s): records wait in the queue (at most %d "
                                  "bytes); %s", self.path, error.strerror or error, self.queue_bytes,
                                  "requests are refused (--audit-fail-closed)" if self.fail_closed
                                  else "beyond it they are dropped")
                    self._writable = False
                    retry_at = time.monotonic() + RETRY_SECONDS
                metrics.AUDIT_WRITABLE.set(1 if self._writable else 0)
                if closing and (error is not None or not (self._lines or self._unwritten)):
                    return

    def _write(self, batch: bytes, reopen: bool) -> tuple[int, OSError | None]:
        """Writes ``batch`` (reopening first if asked or if the file is not open); returns the bytes
        written and the error that stopped it."""
        try:
            if reopen or self._fd is None:
                if self._fd is not None and self.path != STDOUT:
                    with contextlib.suppress(OSError):
                        os.close(self._fd)
                self._fd = None
                self._fd = self._open()
        except OSError as e:
            return 0, e
        written = 0
        view = memoryview(batch)
        try:
            while written < len(batch):
                written += os.write(self._fd, view[written:])
        except OSError as e:
            return written, e
        return written, None


# --- the handler wrappers (proxy/services.py puts them around every etcd method) -----------------


def _finish(audit: AuditLog, call: Call, code: grpc.StatusCode | None, details: str | None,
            request: bytes | None, answer: bytes | None, reserved: bool) -> None:
    """Builds and queues the call's record if its level wants it; never raises into the call."""
    try:
        method = call.method
        if not audit.wants(method, code):
            if reserved:
                audit.release()
            return
        extra = request_fields(method, request)
        user, token_fp = call.user, call.token_fp
        if method.kind is Kind.AUTHENTICATE:
            user, token_fp = _login(request, answer, extra)
            if call.locked:
                extra["locked"] = True
        line = build(wall=call.wall, method=method, user=user, peer=call.peer, result=status_result(code, details),
                     auth_revision=call.auth_revision, duration_ms=(time.perf_counter() - call.started) * 1000,
                     token_fp=token_fp, extra=extra)
        audit.submit(line, reserved=reserved)
    except Exception:  # noqa: BLE001 - an audit bug must not fail or hang the request
        log.exception("audit record for %s not built", call.method.name)
        if reserved:
            audit.release()


def _login(request: bytes | None, answer: bytes | None, extra: dict[str, Any]) -> tuple[str, str]:
    """Authenticate: the user is the name that tried to log in; the fingerprint is of the token
    it was given (so later records of that token lead back to this login)."""
    name = extra.pop("target_user", "")
    token_fp = ""
    if answer:
        with contextlib.suppress(DecodeError):
            token = rpc_pb2.AuthenticateResponse.FromString(answer).token
            token_fp = fingerprint(token) if token else ""
    return name, token_fp


def _status(context: Any, error: BaseException | None) -> tuple[grpc.StatusCode | None, str | None]:
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED, None
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code, context.details()
    if error is not None:
        return grpc.StatusCode.UNKNOWN, type(error).__name__
    return grpc.StatusCode.OK, None


def _call(method: Method, context: Any) -> Call:
    """The call's record so far: the client's token fingerprint is known before anything is
    resolved (the pipeline notes the identity, and the lent token in identity mode, later)."""
    token = extract_token(context.invocation_metadata())
    call = Call(method, context.peer(), token_fp="" if token is None else fingerprint(token), token=token)
    CURRENT.set(call)
    return call


def unary(audit: AuditLog, method: Method, behaviour: Any) -> Any:
    async def audited(request: bytes, context: Any) -> bytes:
        call = _call(method, context)
        admitted = audit.admit()
        error: BaseException | None = None
        answer: bytes | None = None
        try:
            if not admitted:
                await context.abort(UNAVAILABLE.code, UNAVAILABLE.message)
            answer = await behaviour(request, context)
            return answer
        except BaseException as e:
            error = e
            raise
        finally:
            code, details = _status(context, error)
            _finish(audit, call, code, details, request, answer, admitted and audit.fail_closed)

    return audited


def stream(audit: AuditLog, method: Method, behaviour: Any) -> Any:
    async def audited(request: Any, context: Any) -> AsyncIterator[bytes]:
        call = _call(method, context)
        admitted = audit.admit()
        error: BaseException | None = None
        try:
            if not admitted:
                await context.abort(UNAVAILABLE.code, UNAVAILABLE.message)
            async for message in behaviour(request, context):
                yield message
        except BaseException as e:
            error = e
            raise
        finally:
            code, details = _status(context, error)
            _finish(audit, call, code, details, request if isinstance(request, bytes) else None, None,
                    admitted and audit.fail_closed)

    return audited


# --- watch creates and cancels --------------------------------------------------------------------


@dataclass
class WatchCreate:
    """A create sent to the store and not answered yet: who sent it, when, and its reservation."""

    user: str
    auth_revision: int
    token_fp: str
    wall: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    reserved: bool = False


class WatchEvents:
    """One watch stream's records: each create (its answer) and each cancel, never an event."""

    def __init__(self, audit: AuditLog, call: Call) -> None:
        self.audit = audit
        self.call = call

    def creating(self) -> WatchCreate | None:
        """A create arrives (after its token was resolved); None: refused (fail-closed)."""
        if not self.audit.admit():
            return None
        call = self.call
        return WatchCreate(call.user, call.auth_revision, call.token_fp, reserved=self.audit.fail_closed)

    def created(self, pending: WatchCreate | None, create: Any, watch_id: int, result: str) -> None:
        """The store answered a create: ``result`` "ok", or the reason it refused it."""
        reserved = pending is not None and pending.reserved
        if not self.audit.wants(self.call.method, None if result == "ok" else grpc.StatusCode.UNKNOWN):
            if reserved:
                self.audit.release()
            return
        who = pending or WatchCreate(self.call.user, self.call.auth_revision, self.call.token_fp)
        self._record(who.wall, (time.perf_counter() - who.started) * 1000, who.user, who.auth_revision,
                     who.token_fp, "create", create, watch_id, result, reserved)

    def canceled(self, create: Any | None, watch_id: int, result: str) -> None:
        """A watch ended: at the client's request ("ok"), or by the store or a dead token (why)."""
        if not self.audit.wants(self.call.method, None if result == "ok" else grpc.StatusCode.UNKNOWN):
            return
        call = self.call
        self._record(time.time(), 0.0, call.user, call.auth_revision, call.token_fp, "cancel", create, watch_id,
                     result, False)

    def abandoned(self, pending: Iterable[WatchCreate]) -> None:
        """The stream ended before the store answered these creates: their room is given back."""
        self.audit.release(sum(1 for p in pending if p.reserved))

    def _record(self, wall: float, duration_ms: float, user: str, auth_revision: int, token_fp: str, what: str,
                create: Any | None, watch_id: int, result: str, reserved: bool) -> None:
        try:
            f = _Fields()
            f.out["watch"] = what
            f.out["watch_id"] = watch_id
            if create is not None:
                f.key("key", create.key)
                f.key("range_end", create.range_end)
            if f.truncated:
                f.out["truncated"] = True
            line = build(wall=wall, method=self.call.method, user=user, peer=self.call.peer,
                         result=result_text(result), auth_revision=auth_revision, duration_ms=duration_ms,
                         token_fp=token_fp, extra=f.out)
            self.audit.submit(line, reserved=reserved)
        except Exception:  # noqa: BLE001 - never fail the stream for its record
            log.exception("audit record for a watch %s not built", what)
            if reserved:
                self.audit.release()


def watch_events(audit: AuditLog | None) -> WatchEvents | None:
    """The current watch stream's recorder (None without an audit log)."""
    call = CURRENT.get()
    if audit is None or call is None:
        return None
    return WatchEvents(audit, call)
