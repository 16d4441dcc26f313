"""etcd's JSON gateway (grpc-gateway): the etcd v3 API as JSON over HTTP/1.1 (``--listen-gateway-urls``).

No API semantics live here. Each HTTP request becomes the protobuf bytes of its request message
(``json_format``, which reads both the proto and the JSON field names and, like grpc-gateway,
ignores unknown fields), and goes to the very handler the gRPC server registers for that method
(proxy/services.py: token extraction, stamping, store calls, errors), with a small stand-in for
the gRPC call context carrying the ``Authorization`` header as gRPC metadata. The answer's bytes
become JSON as etcd 3.5's gateway writes it: proto field names, int64 as strings, bytes as base64,
default values left out. A gRPC status becomes etcd's error object with grpc-gateway's HTTP status
(runtime.HTTPStatusFromCode).

Streams (``/v3/watch``, ``/v3/lease/keepalive``, ``/v3/maintenance/snapshot``) answer one
``{"result": ...}`` object per line, chunked; the request body is read as a stream of JSON objects
while answers go out. A slow reader holds memory bounded: each write waits for the socket to drain,
the handler is not pulled meanwhile, and the watch pipeline stops reading the store at its own
bound (proxy/watch.py). A request body is bounded like a gRPC message (``--max-request-bytes``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import contextlib
import html
import json
import logging
import posixpath
import re
import string
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import grpc
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from protos.etcdserverpb import rpc_pb2
from proxy.gateway_access import Access, Limits, hostname
from proxy.pipeline import Pipeline
from proxy.services import _handler as grpc_handler
from raftgate.methods import METHODS, Method

log = logging.getLogger(__name__)


class _NotHttp(logging.Filter):
    """aiohttp logs bytes that are not HTTP/1.1 (a port scanner, an HTTP/2 client on this port) as
    an ERROR with a traceback quoting them. The client already has its 400; the log gets one line
    without the client's bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        log.info("gateway: refused a request that is not HTTP/1.1 (HTTP %d)", exc.code)
        return False


logging.getLogger("aiohttp.server").addFilter(_NotHttp())

C = grpc.StatusCode


class _Number(float):
    """A JSON number that is not an integer Python holds exactly (a fraction, an exponent, or more
    digits than ``int()`` takes): its text is kept, for Go's refusal that quotes it."""

    text: str

    def __new__(cls, text: str) -> _Number:
        try:
            value = float(text)
        except (ValueError, OverflowError):
            value = float("inf")
        number = super().__new__(cls, value)
        number.text = text
        return number


def _parse_int(text: str) -> int | _Number:
    return int(text) if len(text) <= _INT_DIGITS else _Number(text)


_INT_DIGITS = 1000  # far above any int64 and below int()'s own limit (4300 digits)
_DECODER = json.JSONDecoder(parse_float=_Number, parse_int=_parse_int)
#: encoding/json's maxNestingDepth: one more level is refused as "exceeded max depth"
GO_MAX_DEPTH = 10000
_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _raw_decode(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value at ``text[start]`` and where it ends. Nesting deeper than Python's recursion
    allows is decoded anyway up to Go's depth, and refused past it in Go's words (never a
    RecursionError, which would be an internal error)."""
    try:
        return _DECODER.raw_decode(text, start)
    except RecursionError:
        pass
    depth = 0
    for match in _NESTING.finditer(text, start):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > GO_MAX_DEPTH:
                raise Abort(C.INVALID_ARGUMENT, f"invalid character {_quote_char(token)} exceeded max depth")
        elif token in "]}":
            depth -= 1
            if depth <= 0:
                break
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2 * GO_MAX_DEPTH)  # the C decoder takes one level per nesting level
    try:
        return _DECODER.raw_decode(text, start)
    finally:
        sys.setrecursionlimit(limit)


def _quote_char(ch: str) -> str:
    """Go's quoteChar: a character as encoding/json's syntax errors quote it (strconv.Quote's escapes)."""
    if ch == "'":
        return "'\\''"
    if ch == '"':
        return "'\"'"
    if ch in _GO_CHAR_ESCAPES:
        return "'" + _GO_CHAR_ESCAPES[ch] + "'"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"'\\x{ord(ch):02x}'"
    if not ch.isprintable():
        return f"'\\u{ord(ch):04x}'" if ord(ch) <= 0xFFFF else f"'\\U{ord(ch):08x}'"
    return f"'{ch}'"


_GO_CHAR_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                    "\v": "\\v", "\\": "\\\\"}

#: etcd 3.5's gateway routes (rpc.proto's google.api.http options): every one is POST.
PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("KV", "Range"): ("/v3/kv/range",),
    ("KV", "Put"): ("/v3/kv/put",),
    ("KV", "DeleteRange"): ("/v3/kv/deleterange",),
    ("KV", "Txn"): ("/v3/kv/txn",),
    ("KV", "Compact"): ("/v3/kv/compaction",),
    ("Watch", "Watch"): ("/v3/watch",),
    ("Lease", "LeaseGrant"): ("/v3/lease/grant",),
    ("Lease", "LeaseRevoke"): ("/v3/lease/revoke", "/v3/kv/lease/revoke"),
    ("Lease", "LeaseKeepAlive"): ("/v3/lease/keepalive",),
    ("Lease", "LeaseTimeToLive"): ("/v3/lease/timetolive", "/v3/kv/lease/timetolive"),
    ("Lease", "LeaseLeases"): ("/v3/lease/leases", "/v3/kv/lease/leases"),
    ("Cluster", "MemberAdd"): ("/v3/cluster/member/add",),
    ("Cluster", "MemberRemove"): ("/v3/cluster/member/remove",),
    ("Cluster", "MemberUpdate"): ("/v3/cluster/member/update",),
    ("Cluster", "MemberList"): ("/v3/cluster/member/list",),
    ("Cluster", "MemberPromote"): ("/v3/cluster/member/promote",),
    ("Maintenance", "Alarm"): ("/v3/maintenance/alarm",),
    ("Maintenance", "Status"): ("/v3/maintenance/status",),
    ("Maintenance", "Defragment"): ("/v3/maintenance/defragment",),
    # etcd's rpc.proto gives HashKV the same path as Hash; the first registered (Hash) answers it.
    ("Maintenance", "Hash"): ("/v3/maintenance/hash",),
    ("Maintenance", "Snapshot"): ("/v3/maintenance/snapshot",),
    ("Maintenance", "MoveLeader"): ("/v3/maintenance/transfer-leadership",),
    ("Maintenance", "Downgrade"): ("/v3/maintenance/downgrade",),
    ("Auth", "AuthEnable"): ("/v3/auth/enable",),
    ("Auth", "AuthDisable"): ("/v3/auth/disable",),
    ("Auth", "AuthStatus"): ("/v3/auth/status",),
    ("Auth", "Authenticate"): ("/v3/auth/authenticate",),
    ("Auth", "UserAdd"): ("/v3/auth/user/add",),
    ("Auth", "UserGet"): ("/v3/auth/user/get",),
    ("Auth", "UserList"): ("/v3/auth/user/list",),
    ("Auth", "UserDelete"): ("/v3/auth/user/delete",),
    ("Auth", "UserChangePassword"): ("/v3/auth/user/changepw",),
    ("Auth", "UserGrantRole"): ("/v3/auth/user/grant",),
    ("Auth", "UserRevokeRole"): ("/v3/auth/user/revoke",),
    ("Auth", "RoleAdd"): ("/v3/auth/role/add",),
    ("Auth", "RoleGet"): ("/v3/auth/role/get",),
    ("Auth", "RoleList"): ("/v3/auth/role/list",),
    ("Auth", "RoleDelete"): ("/v3/auth/role/delete",),
    ("Auth", "RoleGrantPermission"): ("/v3/auth/role/grant",),
    ("Auth", "RoleRevokePermission"): ("/v3/auth/role/revoke",),
}

#: grpc-gateway's runtime.HTTPStatusFromCode (v1, which etcd 3.5 uses).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    C.OK: 200, C.CANCELLED: 408, C.UNKNOWN: 500, C.INVALID_ARGUMENT: 400, C.DEADLINE_EXCEEDED: 504,
    C.NOT_FOUND: 404, C.ALREADY_EXISTS: 409, C.PERMISSION_DENIED: 403, C.UNAUTHENTICATED: 401,
    C.RESOURCE_EXHAUSTED: 429, C.FAILED_PRECONDITION: 400, C.ABORTED: 409, C.OUT_OF_RANGE: 400,
    C.UNIMPLEMENTED: 501, C.INTERNAL: 500, C.UNAVAILABLE: 503, C.DATA_LOSS: 500,
}
JSON_TYPE = "application/json"
#: what the store's Maintenance.Status reports (a test keeps the two equal)
ETCD_VERSION = "3.7.1"
ETCD_CLUSTER_VERSION = "3.7.0"
METADATA_PREFIX = "grpc-metadata-"  # grpc-gateway passes these headers on as metadata, prefix cut
READ_CHUNK = 64 * 1024
STOP_GRACE = 1.0
BACKLOG = 128  # aiohttp's sites' listen backlog
REFUSAL_LOG_INTERVAL = 10.0  # seconds between warnings about connections refused at the limit
#: etcd's CORS headers (its addCORSHeader), beside Access-Control-Allow-Origin
CORS_HEADERS = {"Access-Control-Allow-Methods": "POST, GET, OPTIONS, PUT, DELETE",
                "Access-Control-Allow-Headers": "accept, content-type, authorization"}
_ALLOWED_ORIGIN = "raftgate.cors"  # request key: the Access-Control-Allow-Origin to answer with
#: written to a connection over --gateway-max-connections (none of them idle), which is then closed
_TOO_MANY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
             b"Connection: close\r\nContent-Length: 39\r\n\r\nraftgate: too many gateway connections\n")
_SHOWN = 200  # characters of a refused Host or Origin that are logged and answered
#: grpc-gateway passes the gRPC answer's header metadata on, prefixed
GRPC_HEADERS = {"Grpc-Metadata-Content-Type": "application/grpc"}
_BASE64_ALPHABET = frozenset(string.ascii_letters + string.digits + "+/")


class Abort(Exception):
    """What ``context.abort`` raises here: the call ends with this gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class GatewayContext:
    """The part of grpc.aio.ServicerContext the etcd handlers use, for one HTTP request."""

    def __init__(self, metadata: tuple[tuple[str, str], ...], peer: str, deadline: float | None) -> None:
        self._metadata = metadata
        self._peer = peer
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details
        raise Abort(code, details)


@dataclass(frozen=True)
class Route:
    method: Method
    request: type[Message]
    response: type[Message]
    handler: grpc.RpcMethodHandler


def routes(pipeline: Pipeline) -> dict[str, Route]:
    """Path -> the method, its message classes and the gRPC server's own handler for it."""
    by_name = {(m.service, m.name): m for m in METHODS}
    out: dict[str, Route] = {}
    for key, paths in PATHS.items():
        method = by_name[key]
        desc = rpc_pb2.DESCRIPTOR.services_by_name[method.service].methods_by_name[method.name]
        route = Route(method, GetMessageClass(desc.input_type), GetMessageClass(desc.output_type),
                      grpc_handler(pipeline, method))
        for path in paths:
            out[path] = route
    return out


# --- JSON <-> protobuf ----------------------------------------------------------------------------


def to_json(message: Message) -> dict[str, Any]:
    """etcd's gateway output (JSONPb{OrigName: true}): proto names, int64 as strings, defaults left out."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def dumps(value: Any) -> bytes:
    """Compact JSON as Go's encoding/json writes it: UTF-8 as is, and <, >, &, U+2028, U+2029
    escaped (outside strings JSON has none of them, so replacing them all is safe)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_GO_ESCAPES).encode("utf-8", errors="replace")


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                             "\u2029": "\\u2029"})


def parse_request(route: Route, value: Any) -> bytes:
    """One JSON request object -> the request message's bytes; a bad one is InvalidArgument (as
    grpc-gateway answers a body it cannot decode). ``null`` is an empty request, as in Go."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal {_json_kind(value)} into Go value of type "
                                         f"map[string]json.RawMessage")
    message = route.request()
    try:
        json_format.ParseDict(_checked(value, message.DESCRIPTOR), message)
    except (json_format.ParseError, ValueError, TypeError) as e:
        raise Abort(C.INVALID_ARGUMENT, str(e)) from None
    except RecursionError:  # json_format stops at 100 levels; this is a safety net
        raise Abort(C.INVALID_ARGUMENT, "Message too deep") from None
    return message.SerializeToString()


def _checked(value: dict[str, Any], descriptor: Any, depth: int = 0) -> dict[str, Any]:
    """``value`` without the keys the message does not have (grpc-gateway ignores them), with its
    bytes, bool, integer and enum fields checked as Go decodes them: json_format would take bad
    base64 silently. Past json_format's own depth limit the rest is left to its refusal."""
    fields: dict[str, Any] = {}
    for f in descriptor.fields:
        fields[f.name] = f
        fields[f.json_name] = f
    out: dict[str, Any] = {}
    for key, item in value.items():
        f = fields.get(key)
        if f is None:
            continue
        repeated = f.is_repeated
        message = f.type == FieldDescriptor.TYPE_MESSAGE
        if repeated and item is not None and not isinstance(item, list):
            raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal {_json_kind(item)} into Go value of type "
                                            f"[]json.RawMessage")
        items = item if repeated and isinstance(item, list) else [item]
        checked = []
        for one in items:
            if message and one is None and repeated:
                one = {}  # Go: a null in a list of messages is an empty message
            if message and one is not None and not isinstance(one, dict):
                raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal {_json_kind(one)} into Go value of type "
                                                f"map[string]json.RawMessage")
            if one is not None and f.type == FieldDescriptor.TYPE_BYTES:
                _check_base64(one)
            elif one is not None and f.type == FieldDescriptor.TYPE_STRING:
                if not isinstance(one, str):
                    raise Abort(C.INVALID_ARGUMENT,
                                f"json: cannot unmarshal {_json_kind(one)} into Go value of type string")
                one = _SURROGATE.sub("\ufffd", one)  # Go reads a lone surrogate escape as U+FFFD
            elif one is not None and f.type == FieldDescriptor.TYPE_BOOL and not isinstance(one, bool):
                raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal {_json_kind(one)} into Go value of type bool")
            elif one is not None and f.type in _GO_INT:
                one = _check_int(one, _GO_INT[f.type])
                if one is None:  # a quoted null: the field keeps its zero value, as in Go
                    continue
            elif one is not None and not isinstance(one, str) and f.type == FieldDescriptor.TYPE_ENUM:
                one = _check_int(one, "protoreflect.EnumNumber")  # a number: any int32, as in Go
            elif isinstance(one, str) and f.type == FieldDescriptor.TYPE_ENUM and one not in f.enum_type.values_by_name:
                raise Abort(C.INVALID_ARGUMENT, f"unknown value {json.dumps(json.dumps(one))} for enum "
                                                f"{f.enum_type.full_name}")
            elif isinstance(one, dict) and message and depth < _CHECK_DEPTH:
                one = _checked(one, f.message_type, depth + 1)
            checked.append(one)
        if repeated and isinstance(item, list):
            out[key] = checked
        elif checked:
            out[key] = checked[0]
    return out


_CHECK_DEPTH = 100  # json_format.ParseDict's max_recursion_depth
_SURROGATE = re.compile("[\ud800-\udfff]")  # alone: the decoder joins a pair into one character


_GO_INT = {FieldDescriptor.TYPE_INT64: "int64", FieldDescriptor.TYPE_UINT64: "uint64",
           FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_UINT32: "uint32"}
_GO_RANGE = {"int64": (-(1 << 63), (1 << 63) - 1), "uint64": (0, (1 << 64) - 1),
             "int32": (-(1 << 31), (1 << 31) - 1), "uint32": (0, (1 << 32) - 1),
             "protoreflect.EnumNumber": (-(1 << 31), (1 << 31) - 1)}
_INTEGER = re.compile(r"-?[0-9]+")
_DIGITS = frozenset(string.digits)
_SPACE = " \t\r\n"


def _check_int(value: Any, go_type: str) -> int | None:
    """An integer field as Go's jsonpb reads it: a number, or a string whose text is read as JSON
    (``" 5"`` is 5, ``"null"`` leaves the field unset). The value for json_format, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal {_json_kind(value)} into Go value of type {go_type}")
    if isinstance(value, str):
        token = _go_number(json.dumps(value, ensure_ascii=False)[1:-1], go_type)
        if token is None:
            return None
    else:
        token = value.text if isinstance(value, _Number) else repr(value) if isinstance(value, float) else str(value)
    low, high = _GO_RANGE[go_type]
    if not _INTEGER.fullmatch(token) or len(token) > 21 or not low <= int(token) <= high:
        raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal number {token} into Go value of type {go_type}")
    return int(token)


def _go_number(raw: str, go_type: str) -> str | None:
    """The number token in a quoted integer's text, scanned as Go scans it (the closing quote
    read as a space), or None for ``null``; Go's syntax error otherwise."""
    text = raw + " "
    i = len(text) - len(text.lstrip(_SPACE))
    if i == len(text):
        raise Abort(C.INVALID_ARGUMENT, "unexpected end of JSON input")

    def bad(at: int, context: str) -> Abort:
        return Abort(C.INVALID_ARGUMENT, f"invalid character {_quote_char(text[at])} {context}")

    def digits(at: int) -> int:
        while text[at] in _DIGITS:
            at += 1
        return at

    start = i
    if text[i] != "-" and text[i] not in _DIGITS:
        word = text[i:].rstrip(_SPACE)
        if word == "null":
            return None
        if word in ("true", "false"):
            raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal bool into Go value of type {go_type}")
        raise bad(i, "looking for beginning of value")
    if text[i] == "-":
        i += 1
        if text[i] not in _DIGITS:
            raise bad(i, "in numeric literal")
    i = i + 1 if text[i] == "0" else digits(i)
    if text[i] == ".":
        i += 1
        if text[i] not in _DIGITS:
            raise bad(i, "after decimal point in numeric literal")
        i = digits(i)
    if text[i] in "eE":
        i += 1
        if text[i] in "+-":
            i += 1
        if text[i] not in _DIGITS:
            raise bad(i, "in exponent of numeric literal")
        i = digits(i)
    token = text[start:i]
    rest = text[i:].lstrip(_SPACE)
    if rest:
        raise bad(len(text) - len(rest), "after top-level value")
    return token


def _json_kind(value: Any) -> str:
    """encoding/json's name for a JSON value's kind, for its ``cannot unmarshal`` errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


def _check_base64(value: Any) -> None:
    """Go's base64.StdEncoding, which etcd's gateway decodes bytes fields with (errors as Go words them)."""
    if not isinstance(value, str):
        raise Abort(C.INVALID_ARGUMENT, f"json: cannot unmarshal {_json_kind(value)} into Go value of type []uint8")
    text = value.replace("\r", "").replace("\n", "")
    try:
        base64.b64decode(text, validate=True)
        return
    except (binascii.Error, ValueError):
        pass
    bad = next((i for i, ch in enumerate(text) if ch not in _BASE64_ALPHABET), None)
    if bad is None or text[bad] == "=":
        bad = min(bad if bad is not None else len(text), len(text) // 4 * 4)
    raise Abort(C.INVALID_ARGUMENT, f"illegal base64 data at input byte {bad}")


#: Python's reasons -> encoding/json's wording (what etcd's gateway answers for a body that is not JSON)
_GO_SYNTAX = {
    "Expecting value": "looking for beginning of value",
    "Expecting property name enclosed in double quotes": "looking for beginning of object key string",
    "Expecting ':' delimiter": "after object key",
    "Expecting ',' delimiter": "after object key:value pair",
    "Invalid control character at": "in string literal",
}


def go_json_error(error: json.JSONDecodeError) -> str:
    """A JSON syntax error as Go's encoding/json words it (``invalid character 'x' ...``)."""
    if error.pos >= len(error.doc):
        return "unexpected EOF"
    if error.msg == "Invalid \\escape" and error.pos + 1 < len(error.doc):
        return f"invalid character {_quote_char(error.doc[error.pos + 1])} in string escape code"
    char = _quote_char(error.doc[error.pos])
    context = _GO_SYNTAX.get(error.msg, "looking for beginning of value")
    if error.msg == "Expecting ',' delimiter" and error.doc.lstrip().startswith("["):
        context = "after array element"
    return f"invalid character {char} {context}"


def error_body(code: grpc.StatusCode, details: str) -> bytes:
    """grpc-gateway v1's errorBody: ``error`` and ``message`` both hold the status message."""
    return dumps({"error": details, "code": code.value[0], "message": details})


def stream_error_body(code: grpc.StatusCode, details: str) -> bytes:
    """grpc-gateway v1's error chunk, when a stream ends with an error."""
    status = HTTP_STATUS.get(code, 500)
    return dumps({"error": {"grpc_code": code.value[0], "http_code": status, "message": details,
                            "http_status": _reason(status)}})


def _reason(status: int) -> str:
    return HTTPStatus(status).phrase


def error_response(code: grpc.StatusCode, details: str) -> web.Response:
    return web.Response(status=HTTP_STATUS.get(code, 500), body=error_body(code, details), content_type=JSON_TYPE)


def _plain(status: int, text: str) -> web.Response:
    """A text answer as Go's http.Error writes one."""
    response = web.Response(status=status, text=text, content_type="text/plain", charset="utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


_HOST_REFUSED = """
raftgate's JSON gateway received your request, but the Host header was unrecognized.

To fix this, add the host name you use to the gateway's list:
  - e.g. raftgate proxy --host-whitelist {host} (or raftgate local --host-whitelist)

This refusal prevents "DNS Rebinding" attacks (CVE-2018-5702), as etcd's does.

"""
_ORIGIN_REFUSED = """raftgate's JSON gateway does not serve web pages of origin {origin}.
To allow them, list the origin: raftgate proxy --cors {origin} (or raftgate local --cors).
"""


def _text(status: int) -> web.Response:
    """Go's http.Error, as grpc-gateway answers a path or method it does not serve."""
    response = web.Response(status=status, text=_reason(status) + "\n", content_type="text/plain", charset="utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


# --- the HTTP side ----------------------------------------------------------------------------------


def clean_path(path: str) -> str:
    """Go's ServeMux cleanPath: ``.``, ``..`` and repeated slashes resolved, a final slash kept."""
    if not path.startswith("/"):
        path = "/" + path
    clean = "/" + posixpath.normpath(path).lstrip("/")  # POSIX keeps a leading "//"; Go does not
    if path.endswith("/") and clean != "/":
        clean += "/"
    return clean


def _redirect(request: web.Request, path: str) -> web.Response:
    """Go's ServeMux redirect to the clean path (301, the query kept); http.Redirect writes its small
    HTML body for GET and HEAD only."""
    location = quote(path, safe="/$&+,:;=@-_.~")
    if request.rel_url.raw_query_string:
        location += "?" + request.rel_url.raw_query_string
    response = web.Response(status=301)
    response.headers["Location"] = location
    if request.method in ("GET", "HEAD"):
        response.content_type, response.charset = "text/html", "utf-8"
        response.text = f'<a href="{html.escape(location)}">Moved Permanently</a>.\n\n'
    return response


def _metadata(request: web.Request) -> tuple[tuple[str, str], ...]:
    """Headers as grpc-gateway passes them on: Authorization as ``authorization``, and every
    ``Grpc-Metadata-K`` as ``k``."""
    out: list[tuple[str, str]] = []
    for key, value in request.headers.items():
        lower = key.lower()
        if lower == "authorization":
            out.append(("authorization", value))
        elif lower.startswith(METADATA_PREFIX) and len(lower) > len(METADATA_PREFIX):
            out.append((lower[len(METADATA_PREFIX):], value))
    return tuple(out)


async def _cors(request: web.Request, response: web.StreamResponse) -> None:
    """etcd's CORS headers on an answer to an allowed origin (``*``: on every answer, as etcd's
    default); a specific origin is echoed, with ``Vary: Origin`` for caches."""
    origin = request.get(_ALLOWED_ORIGIN)
    if origin is None:
        return
    response.headers.setdefault("Access-Control-Allow-Origin", origin)
    for key, value in CORS_HEADERS.items():
        response.headers.setdefault(key, value)
    if origin != "*":
        response.headers.add("Vary", "Origin")


_TIMEOUT_UNITS = {"H": 3600 * 10**9, "M": 60 * 10**9, "S": 10**9, "m": 10**6, "u": 10**3, "n": 1}  # in ns
DEADLINE_EXCEEDED = "context deadline exceeded"
_INT64 = 1 << 63


def _deadline(header: str | None) -> float | None:
    """The ``Grpc-Timeout`` header (``10S``, ``500m``) as grpc-gateway reads it: the call's deadline.
    Go parses the amount as an int64 and multiplies it by the unit in int64 nanoseconds, which
    wraps: a product past int64 is a negative timeout (the deadline has passed), as in etcd."""
    if header is None or header == "":
        return None
    unit = _TIMEOUT_UNITS.get(header[-1])
    if len(header) < 2 or unit is None or not re.fullmatch(r"[+-]?[0-9]{1,19}", header[:-1]) \
            or not -_INT64 <= int(header[:-1]) < _INT64:
        raise Abort(C.INVALID_ARGUMENT, f"invalid grpc-timeout: {header}")
    nanoseconds = (int(header[:-1]) * unit + _INT64) % (2 * _INT64) - _INT64
    return None if nanoseconds == 0 else time.monotonic() + nanoseconds / 1e9  # 0: none, as in grpc-gateway


def _peer(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return "unix:" if isinstance(peer, str) else ""


class _Connection(asyncio.Protocol):
    """aiohttp's protocol for one gateway connection, inside the gateway's own bounds: the header
    timeout (aiohttp's keep-alive timer covers idle connections, and on older versions not a
    connection's first request) and the connection limit. Requests themselves are aiohttp's."""

    def __init__(self, gateway: Gateway, inner: asyncio.Protocol) -> None:
        self.gateway = gateway
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a request's handler is running (its body and answer have their own bounds)
        self.refused = False  # over the limit: never handed to aiohttp
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if not self.gateway._admit(self):
            self.refused = True
            transport.write(_TOO_MANY)  # type: ignore[attr-defined]
            transport.close()
            return
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return
        if not self.busy and self._timer is None:
            self._arm()  # a new request's first bytes: its header has header_timeout from now
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.gateway._release(self)
        if not self.refused:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    def begin(self) -> None:
        """A request's header is complete and its handler runs: no header timeout now."""
        self.busy = True
        self._disarm()

    def end(self) -> None:
        """The handler is done; idle until the next request's first byte (aiohttp's keep-alive)."""
        self.busy = False

    def close(self) -> None:
        """Drops the connection at once (nothing it waits for is sent)."""
        self._disarm()
        if self.transport is not None:
            self.transport.abort()

    def _arm(self) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(self.gateway.limits.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self.busy:
            log.debug("gateway: closed a connection whose request header did not arrive within %.1f s",
                      self.gateway.limits.header_timeout)
            self.close()


class Gateway:
    def __init__(self, pipeline: Pipeline, listen: Sequence[str], *, max_message_bytes: int,
                 access: Access | None = None, limits: Limits | None = None) -> None:
        """``max_message_bytes``: the gRPC server's receive limit; one request message larger than
        that is refused as grpc-go refuses it. A body may be larger as JSON (base64 takes 4/3).
        ``access``: --cors and --host-whitelist (default: no origin; localhost and IP addresses)."""
        self.listen = tuple(listen)
        self.max_message_bytes = max_message_bytes
        self.max_body_bytes = 2 * max_message_bytes + READ_CHUNK
        self.access = access or Access()
        self.limits = limits or Limits()
        self.routes = routes(pipeline)
        self._runner: web.AppRunner | None = None
        self._servers: list[asyncio.AbstractServer] = []
        #: open connections, oldest first: the one evicted at the limit is the oldest idle one
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        self._refused = 0  # connections refused at the limit since the last warning
        self._refusal_logged = -REFUSAL_LOG_INTERVAL
        self.addresses: list[str] = []

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_response_prepare.append(_cors)
        return app

    async def start(self) -> list[str]:
        # handler_cancellation: a client that hangs up ends its handler (and a watch's store stream).
        # shutdown_timeout: open streams (watches) get this long to end when the proxy stops.
        # auto_decompress off: Go's server inflates no request body (Content-Encoding is not read),
        # and a small gzip body must not become hundreds of MB here.
        # keepalive_timeout: an idle connection between requests (aiohttp's own); the header
        # timeout and the connection limit are _Connection's.
        self._runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=STOP_GRACE, auto_decompress=False,
                                     keepalive_timeout=self.limits.idle_timeout)
        await self._runner.setup()
        handlers = self._runner.server
        assert handlers is not None
        loop = asyncio.get_running_loop()

        def connection() -> _Connection:
            return _Connection(self, handlers())

        for address in self.listen:
            if address.startswith("unix:"):
                self._servers.append(await loop.create_unix_server(connection, address.removeprefix("unix:"),
                                                                   backlog=BACKLOG))
                self.addresses.append(address)
                continue
            host, _, port = address.rpartition(":")
            try:
                server = await loop.create_server(connection, host.strip("[]"), int(port), reuse_port=False,
                                                  backlog=BACKLOG)
            except OSError as e:
                raise OSError(f"cannot listen on {address} (gateway): {e.strerror or e}") from None
            self._servers.append(server)
            sockets = server.sockets or []
            bound = sockets[0].getsockname()[1] if sockets else int(port)
            self.addresses.append(f"{host}:{bound}")
        return self.addresses

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        self._servers = []
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for conn in list(self._open.values()):
            conn.close()

    def _admit(self, conn: _Connection) -> bool:
        """Room for one more connection: at the limit the oldest one not in a request is closed
        (an idle or stalled client, never a running request or stream); none: refused."""
        if len(self._open) >= self.limits.max_connections:
            victim = next((c for c in self._open.values() if not c.busy), None)
            if victim is None:
                self._refused += 1
                now = time.monotonic()
                if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:  # a flood of connects is one line
                    log.warning("gateway: refused %d connection(s): %d are open, each in a request "
                                "(--gateway-max-connections)", self._refused, len(self._open))
                    self._refused, self._refusal_logged = 0, now
                return False
            self._release(victim)
            victim.close()
        assert conn.transport is not None
        self._open[conn.transport] = conn
        return True

    def _release(self, conn: _Connection) -> None:
        if conn.transport is not None and self._open.get(conn.transport) is conn:
            del self._open[conn.transport]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Who may ask (Host, Origin), then the request; its connection is busy meanwhile."""
        conn = self._open.get(request.transport) if request.transport is not None else None
        if conn is not None:
            conn.begin()
        try:
            refused = self.refusal(request)
            if refused is not None:
                return refused
            if request.method == "OPTIONS":
                return web.Response()  # a CORS preflight, as etcd answers it
            return await self.dispatch(request)
        finally:
            if conn is not None:
                conn.end()

    def refusal(self, request: web.Request) -> web.Response | None:
        """etcd's DNS-rebinding refusal for a Host not in --host-whitelist (421); a request from a
        web page of an origin not in --cors (403). Else None, and the CORS answer is noted."""
        host = request.headers.get("Host", "")
        if not self.access.host_allowed(host):
            shown = hostname(host)[:_SHOWN]  # the name compared, as etcd shows it
            log.info("gateway: refused a request for host %r (not in --host-whitelist: DNS rebinding)", shown)
            return _plain(421, _HOST_REFUSED.format(host=json.dumps(shown)))
        origin = request.headers.get("Origin")
        if self.access.any_origin:
            request[_ALLOWED_ORIGIN] = "*"
        elif origin is not None:
            if not self.access.origin_allowed(origin):
                shown = origin[:_SHOWN]
                log.info("gateway: refused a request from a web page of origin %r (not in --cors)", shown)
                return _plain(403, _ORIGIN_REFUSED.format(origin=json.dumps(shown)))
            request[_ALLOWED_ORIGIN] = origin
        return None

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        clean = clean_path(path)
        if clean != path:
            return _redirect(request, clean)
        if path == "/version":
            if request.method != "GET":
                response = _text(405)
                response.headers["Allow"] = "GET"
                return response
            return self.version()
        route = self.routes.get(path)
        if route is None:
            return _text(404)
        if request.method != "POST":
            return _text(405)
        try:
            deadline = _deadline(request.headers.get("Grpc-Timeout"))
        except Abort as e:
            return error_response(e.code, e.details)
        context = GatewayContext(_metadata(request), _peer(request), deadline)
        handler = route.handler
        if handler.request_streaming:
            # grpc-gateway decodes the first request before it answers: one that does not decode
            # is an error of its own (not a gRPC status: Unknown, 500); an empty body, no requests.
            # The first request has the body timeout; the stream after it has none.
            values = _Values(request, self.max_body_bytes)
            try:
                async with asyncio.timeout(self.limits.body_timeout):
                    more, value = await values.next()
                requests = _requests(self.check_message(parse_request(route, value)), values, route, self) \
                    if more else _no_requests()
            except TimeoutError:
                return await self._body_timed_out(request)
            except Abort as e:
                code = e.code if e.code is C.RESOURCE_EXHAUSTED else C.UNKNOWN
                return error_response(code, e.details)
            return await self.stream(request, route, context, requests)
        try:
            try:
                async with asyncio.timeout(self.limits.body_timeout):
                    body = await self._body(request)
            except TimeoutError:
                return await self._body_timed_out(request)
            data = self.check_message(parse_request(route, body))
            if handler.response_streaming:
                return await self.stream(request, route, context, data)
            try:
                answer = await asyncio.wait_for(handler.unary_unary(data, context), context.time_remaining())
            except TimeoutError:
                raise Abort(C.DEADLINE_EXCEEDED, DEADLINE_EXCEEDED) from None
        except Abort as e:
            return error_response(e.code, e.details)
        except Exception:
            log.exception("gateway: %s failed", path)
            return error_response(C.UNKNOWN, "raftgate: internal error")
        return web.Response(body=dumps(to_json(route.response.FromString(answer))), content_type=JSON_TYPE,
                            headers=GRPC_HEADERS)

    async def _body_timed_out(self, request: web.Request) -> web.Response:
        """A body that did not arrive within the body timeout: 408, and the connection closes at
        once (aiohttp would otherwise wait up to its lingering time for the rest of the body)."""
        log.info("gateway: %s: the request body did not arrive within %.1f s", request.path, self.limits.body_timeout)
        response = _plain(408, "raftgate: the request body did not arrive in time\n")
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        if request.protocol is not None:
            request.protocol.force_close()  # the answer is written; close() sends it before closing
        return response

    async def _body(self, request: web.Request) -> Any:
        """The whole body as one JSON value; an empty body is an empty request (grpc-gateway)."""
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise self._too_large(request.content_length or self.max_body_bytes) from None
        return self.decode(raw)

    def decode(self, raw: bytes) -> Any:
        """The first JSON value of the body (Go's json.Decoder reads no further)."""
        if len(raw) > self.max_body_bytes:
            raise self._too_large(len(raw))
        text = raw.decode("utf-8", errors="replace").lstrip(" \t\r\n")
        if not text:
            return {}
        try:
            return _raw_decode(text)[0]
        except json.JSONDecodeError as e:
            raise Abort(C.INVALID_ARGUMENT, go_json_error(e)) from None

    def _too_large(self, size: int) -> Abort:
        """grpc-go's refusal of a message over the receive limit."""
        return Abort(C.RESOURCE_EXHAUSTED,
                     f"grpc: received message larger than max ({size} vs. {self.max_message_bytes})")

    def check_message(self, data: bytes) -> bytes:
        if len(data) > self.max_message_bytes:
            raise self._too_large(len(data))
        return data

    async def stream(self, request: web.Request, route: Route, context: GatewayContext,
                     data: bytes | AsyncIterator[bytes]) -> web.StreamResponse:
        """Answers as ``{"result": ...}`` lines; an error before the first answer sets the status."""
        handler = route.handler
        if isinstance(data, bytes):
            answers = handler.unary_stream(self.check_message(data), context)
        else:
            answers = handler.stream_stream(data, context)
        response: web.StreamResponse | None = None
        try:
            try:
                async with asyncio.timeout(context.time_remaining()):
                    async for answer in answers:
                        line = dumps({"result": to_json(route.response.FromString(answer))}) + b"\n"
                        if response is None:
                            # no length: chunked on HTTP/1.1, until close on HTTP/1.0 (as etcd answers)
                            response = web.StreamResponse(status=200,
                                                          headers={"Content-Type": JSON_TYPE, **GRPC_HEADERS})
                            await response.prepare(request)
                        await response.write(line)  # waits while the client is behind: nothing more is pulled
            except TimeoutError:
                raise Abort(C.DEADLINE_EXCEEDED, DEADLINE_EXCEEDED) from None
        except Abort as e:
            body = stream_error_body(e.code, e.details)
            if response is None:
                return web.Response(status=HTTP_STATUS.get(e.code, 500), body=body, content_type=JSON_TYPE)
            await response.write(body)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("gateway: stream %s failed", request.path)
            if response is None:
                return error_response(C.UNKNOWN, "raftgate: internal error")
        finally:
            with contextlib.suppress(Exception):
                await answers.aclose()  # type: ignore[attr-defined]
        if response is None:
            response = web.StreamResponse(status=200, headers={"Content-Type": JSON_TYPE, **GRPC_HEADERS})
            await response.prepare(request)
        await response.write_eof()
        return response

    @staticmethod
    def version() -> web.Response:
        """GET /version as etcd answers it, without credentials (clients such as etcd3gw find the
        API path with it)."""
        return web.Response(body=dumps({"etcdserver": ETCD_VERSION, "etcdcluster": ETCD_CLUSTER_VERSION}),
                            content_type=JSON_TYPE)


class _Values:
    """The request body as a stream of JSON values, each handed on as soon as it is complete.

    A syntax error raises Abort (Go's wording) as soon as it is certain; one value may be at most
    the body bound. The body may come a few bytes at a time: a value is decoded when it starts,
    when a scan of the new text alone finds its end, and when it has doubled since the last try
    (so a syntax error is still found early), never whole again on every chunk (that was O(n^2)).
    """

    def __init__(self, request: web.Request, limit: int) -> None:
        self.request = request
        self.limit = limit
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pieces: list[str] = []  # the text; the current value starts at ``offset`` in the first
        self.offset = 0
        self.size = 0  # characters from ``offset`` on
        self.eof = False
        self.scan = _EndScan()
        self.tried: int | None = None  # the size at the last try for this value (None: not tried)

    async def next(self) -> tuple[bool, Any]:
        """(True, value), or (False, None) at the end of the body."""
        while True:
            if self.eof or self.tried is None or self.scan.ended or self.size >= 2 * self.tried:
                text = self.pieces[0] if len(self.pieces) == 1 else "".join(self.pieces)
                self.pieces = [text]
                begin = _NOT_WS.search(text, self.offset)
                if begin is not None:
                    self.offset = begin.start()
                    self.size = len(text) - self.offset
                    try:
                        value, end = _raw_decode(text, self.offset)
                    except json.JSONDecodeError as e:
                        if self.eof or not _incomplete(e, text):
                            raise Abort(C.INVALID_ARGUMENT, go_json_error(e)) from None
                        self.tried, self.scan.ended = self.size, False
                    else:
                        self._start(text, end)
                        return True, value
                elif self.eof:
                    return False, None
                else:
                    self.pieces, self.offset, self.size = [], 0, 0
            if self.size > self.limit:
                raise Abort(C.RESOURCE_EXHAUSTED, f"a request over {self.limit} bytes")
            chunk = await self.request.content.read(READ_CHUNK)
            self.eof = not chunk
            piece = self.utf8.decode(chunk, final=self.eof)
            if piece:
                self.pieces.append(piece)
                self.size += len(piece)
                self.scan.feed(piece)

    def _start(self, text: str, at: int) -> None:
        """A new value begins at ``text[at]`` (what followed the last one, not copied)."""
        self.pieces, self.offset, self.size = [text], at, len(text) - at
        self.scan, self.tried = _EndScan(), None
        self.scan.feed(text, at)


_NOT_WS = re.compile(r"[^ \t\r\n]")
_STRUCTURE = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')
_DELIMITER = re.compile(r"[^0-9A-Za-z.+\-]")


class _EndScan:
    """Whether the JSON value fed so far may have ended: nesting and strings followed over each new
    piece alone (regex searches, nothing rescanned). Only a hint: the decoder has the last word."""

    def __init__(self) -> None:
        self.kind = ""  # "" (nothing yet), "{" (object or array), '"' (string), "x" (number, literal)
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.ended = False

    def feed(self, piece: str, i: int = 0) -> None:
        if self.ended:
            return
        n = len(piece)
        if not self.kind:
            begin = _NOT_WS.search(piece, i)
            if begin is None:
                return
            i = begin.start()
            first = piece[i]
            i += 1
            self.kind = "{" if first in "{[" else first if first == '"' else "x"
            self.depth, self.in_string = (1, False) if self.kind == "{" else (0, self.kind == '"')
        if self.kind == "x":
            self.ended = _DELIMITER.search(piece, i) is not None
            return
        while i < n:
            if self.in_string:
                if self.escaped:
                    self.escaped, i = False, i + 1
                    continue
                match = _IN_STRING.search(piece, i)
                if match is None:
                    return
                i = match.end()
                if match.group() == "\\":
                    self.escaped = True
                    continue
                self.in_string = False
                if self.kind == '"':
                    self.ended = True
                    return
                continue
            match = _STRUCTURE.search(piece, i)
            if match is None:
                return
            i = match.end()
            token = match.group()
            if token == '"':
                self.in_string = True
            elif token in "[{":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    self.ended = True
                    return


def _incomplete(error: json.JSONDecodeError, text: str) -> bool:
    """Whether more input could still make ``text`` a JSON value (else the error is final)."""
    if error.pos >= len(text) or error.msg.startswith("Unterminated string"):
        return True
    rest = text[error.pos:]
    return any(word.startswith(rest) for word in ("true", "false", "null")) or rest in ("-",)


async def _requests(first: bytes, values: _Values, route: Route, gateway: Gateway) -> AsyncIterator[bytes]:
    """The first request (already decoded), then the others as they come. A later one that does
    not decode ends the client's side of the stream, as grpc-gateway stops sending then (the
    answers keep coming)."""
    yield first
    while True:
        try:
            more, value = await values.next()
            if not more:
                return
            data = gateway.check_message(parse_request(route, value))
        except Abort:  # its reason may quote the client's data: not logged
            log.info("gateway: %s: a streamed request does not decode; no more are read", values.request.path)
            return
        yield data


async def _no_requests() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator
