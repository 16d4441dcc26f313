"""etcd's JSON gateway (grpc-gateway): the etcd v3 API as JSON over HTTP/1.1 (``--listen-gateway-urls``).

The HTTP server and its routes. No API semantics live here. Each HTTP request becomes the
protobuf bytes of its request message (proxy/gateway_json.py: Go's JSON rules) and goes to the
very handler the gRPC server registers for that method (proxy/services.py: token extraction,
stamping, store calls, errors), with a small stand-in for the gRPC call context carrying the
``Authorization`` header as gRPC metadata. The answer's bytes become JSON as etcd 3.5's gateway
writes it; a gRPC status becomes etcd's error object with grpc-gateway's HTTP status
(proxy/gateway_errors.py). Cluster answers name the members' gateways, not their gRPC URLs
(proxy/gateway_members.py); ``GET /health`` and ``/metrics`` are served as on etcd's client URL
(proxy/gateway_health.py).

Streams (``/v3/watch``, ``/v3/lease/keepalive``, ``/v3/maintenance/snapshot``) answer one
``{"result": ...}`` object per line, chunked; the request body is read as a stream of JSON objects
while answers go out. A slow reader holds memory bounded: each write waits for the socket to drain,
the handler is not pulled meanwhile, and the watch pipeline stops reading the store at its own
bound (proxy/watch.py). A request body is bounded like a gRPC message (``--max-request-bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import posixpath
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import grpc
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from prometheus_client import REGISTRY, generate_latest

from protos.etcdserverpb import rpc_pb2
from proxy import gateway_health
from proxy.gateway_access import Access, Limits, hostname
from proxy.gateway_errors import (
    DEADLINE_EXCEEDED,
    HTTP_STATUS,
    Abort,
    error_response,
    host_refused,
    http_error,
    origin_refused,
    plain,
    stream_error_body,
)
from proxy.gateway_health import Store as HealthStore
from proxy.gateway_json import (
    JSON_TYPE,
    READ_CHUNK,
    JsonError,
    JsonValues,
    TooLarge,
    dumps,
    first_value,
    parse_request,
    to_json,
)
from proxy.gateway_members import GatewayMembers, MemberDirectory
from proxy.pipeline import Pipeline
from proxy.services import handler as grpc_handler
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

#: what the store's Maintenance.Status reports (a test keeps the two equal)
ETCD_VERSION = "3.7.1"
ETCD_CLUSTER_VERSION = "3.7.0"
#: what etcd's /metrics answers with (Prometheus' text format, which generate_latest writes)
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METADATA_PREFIX = "grpc-metadata-"  # grpc-gateway passes these headers on as metadata, prefix cut
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
                 access: Access | None = None, limits: Limits | None = None,
                 members: MemberDirectory | None = None, health: HealthStore | None = None) -> None:
        """``max_message_bytes``: the gRPC server's receive limit; one request message larger than
        that is refused as grpc-go refuses it. A body may be larger as JSON (base64 takes 4/3).
        ``access``: --cors and --host-whitelist (default: no origin; localhost and IP addresses).
        ``members``: where each member's gateway is (Cluster answers name them); ``health``: what
        ``/health`` asks (with it, ``/health`` and ``/metrics`` are served as on etcd's client URL)."""
        self.listen = tuple(listen)
        self.max_message_bytes = max_message_bytes
        self.max_body_bytes = 2 * max_message_bytes + READ_CHUNK
        self.access = access or Access()
        self.limits = limits or Limits()
        self.routes = routes(pipeline)
        self.members = GatewayMembers(members) if members is not None else None
        self.health = gateway_health.HealthChecker(health) if health is not None else None
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
            return host_refused(shown)
        origin = request.headers.get("Origin")
        if self.access.any_origin:
            request[_ALLOWED_ORIGIN] = "*"
        elif origin is not None:
            if not self.access.origin_allowed(origin):
                shown = origin[:_SHOWN]
                log.info("gateway: refused a request from a web page of origin %r (not in --cors)", shown)
                return origin_refused(shown)
            request[_ALLOWED_ORIGIN] = origin
        return None

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        clean = clean_path(path)
        if clean != path:
            return _redirect(request, clean)
        if path == "/version":
            if request.method != "GET":
                response = http_error(405)
                response.headers["Allow"] = "GET"
                return response
            return self.version()
        if self.health is not None and path == "/health":
            return await gateway_health.health(request, self.health)
        if self.health is not None and path == "/metrics":
            return await _metrics()
        route = self.routes.get(path)
        if route is None:
            return http_error(404)
        if request.method != "POST":
            return http_error(405)
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
            values = JsonValues(request.content.read, self.max_body_bytes)
            try:
                async with asyncio.timeout(self.limits.body_timeout):
                    more, value = await _next(values)
                requests = _requests(self.check_message(_request(route, value)), values, route, self, path) \
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
            data = self.check_message(_request(route, body))
            if handler.response_streaming:
                return await self.stream(request, route, context, data)
            remaining = context.time_remaining()
            try:
                if remaining is not None and remaining <= 0:
                    raise TimeoutError  # a deadline already passed: the call is not run (as gRPC does)
                async with asyncio.timeout(remaining):
                    answer = await handler.unary_unary(data, context)
            except TimeoutError:
                raise Abort(C.DEADLINE_EXCEEDED, DEADLINE_EXCEEDED) from None
            if self.members is not None and route.method.service == "Cluster":
                answer = await self.members.rewrite(answer, route.response)
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
        response = plain(408, "raftgate: the request body did not arrive in time\n")
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
        try:
            return first_value(raw)
        except JsonError as e:
            raise Abort(C.INVALID_ARGUMENT, str(e)) from None

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


async def _metrics() -> web.Response:
    """The process's Prometheus registry, as etcd serves /metrics on its client URL (made off the
    event loop, as the --metrics-addr server does)."""
    body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, REGISTRY)
    return web.Response(body=body, headers={"Content-Type": METRICS_TYPE})


def _request(route: Route, value: Any) -> bytes:
    """The request message's bytes; JSON that does not decode is InvalidArgument (grpc-gateway)."""
    try:
        return parse_request(route.request, value)
    except JsonError as e:
        raise Abort(C.INVALID_ARGUMENT, str(e)) from None


async def _next(values: JsonValues) -> tuple[bool, Any]:
    """The body's next JSON value (see JsonValues.next), its refusals as gRPC statuses."""
    try:
        return await values.next()
    except JsonError as e:
        raise Abort(C.INVALID_ARGUMENT, str(e)) from None
    except TooLarge as e:
        raise Abort(C.RESOURCE_EXHAUSTED, str(e)) from None


async def _requests(first: bytes, values: JsonValues, route: Route, gateway: Gateway,
                    path: str) -> AsyncIterator[bytes]:
    """The first request (already decoded), then the others as they come. A later one that does
    not decode ends the client's side of the stream, as grpc-gateway stops sending then (the
    answers keep coming)."""
    yield first
    while True:
        try:
            more, value = await _next(values)
            if not more:
                return
            data = gateway.check_message(_request(route, value))
        except Abort:  # its reason may quote the client's data: not logged
            log.info("gateway: %s: a streamed request does not decode; no more are read", path)
            return
        yield data


async def _no_requests() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator

