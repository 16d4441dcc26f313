"""Audit records: one JSON line per auditable event, built from a closed set of request fields.

A record names the method, the user the request ran as, the client address, the result (``"ok"``
or etcd's error message), the keys (base64, as etcd's JSON gateway writes bytes), the auth
revision, the duration and a token's sha256 fingerprint - never a password, a token or a value.
Every string and key is cut to a bound, so a line never exceeds MAX_RECORD_BYTES.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2
from raftgate.methods import METHODS, Kind, Method, Perm

#: One record's bound: strings and keys are cut (``"truncated": true``) so a line never exceeds it.
MAX_RECORD_BYTES = 16 << 10
MAX_KEY_BYTES = 256  # of each key or range_end, before base64
MAX_TEXT_CHARS = 256  # of the user name, peer, result and names
MAX_TXN_OPS = 8  # a Txn's compares and ops recorded (depth first); more: "truncated"

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


class Fields:
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
    f = Fields()
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


def _txn_fields(f: Fields, txn: Any) -> None:
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
    f = Fields()
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


def status_result(code: grpc.StatusCode | None, details: str | None) -> str:
    if code is None or code == grpc.StatusCode.OK:
        return "ok"
    if code == grpc.StatusCode.CANCELLED and not details:
        return "context canceled"  # grpc-go's words for a client that went away
    return result_text(details or code.name)


def is_refusal(code: grpc.StatusCode | None) -> bool:
    """An error answer, not a client's own cancellation."""
    return code is not None and code not in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED)
