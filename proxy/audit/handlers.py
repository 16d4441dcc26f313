"""The audit log's handler wrappers: each call's record in the making, queued when it ends.

proxy/services.py puts ``unary``/``stream`` around every etcd method: they admit the call
(``--audit-fail-closed``), keep its ``Call`` in ``CURRENT`` for the pipeline to note the token and
identity as it resolves them, and queue the record when the call ends, if its level wants it.
Watch streams are recorded per create and cancel (``WatchEvents``), not per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from protos.etcdserverpb import rpc_pb2
from proxy.audit.records import Fields, build, request_fields, result_text, status_result
from proxy.audit.writer import AuditLog
from proxy.tokens.extract import extract_token
from raftgate.errors import Err
from raftgate.methods import Kind, Method
from raftgate.token_verifier import fingerprint

log = logging.getLogger("proxy.audit")

UNAVAILABLE = Err.AUDIT_UNAVAILABLE


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
            f = Fields()
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
