"""etcd's error wording on the JSON gateway: how a gRPC status, a refused request and an unserved path
are answered over HTTP, byte for byte as etcd 3.5's gateway (grpc-gateway v1 and Go's net/http)."""

from __future__ import annotations

import json
from http import HTTPStatus

import grpc
from aiohttp import web

from proxy.gateway_json import JSON_TYPE, dumps

C = grpc.StatusCode

#: grpc-gateway's runtime.HTTPStatusFromCode (v1, which etcd 3.5 uses).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    C.OK: 200, C.CANCELLED: 408, C.UNKNOWN: 500, C.INVALID_ARGUMENT: 400, C.DEADLINE_EXCEEDED: 504,
    C.NOT_FOUND: 404, C.ALREADY_EXISTS: 409, C.PERMISSION_DENIED: 403, C.UNAUTHENTICATED: 401,
    C.RESOURCE_EXHAUSTED: 429, C.FAILED_PRECONDITION: 400, C.ABORTED: 409, C.OUT_OF_RANGE: 400,
    C.UNIMPLEMENTED: 501, C.INTERNAL: 500, C.UNAVAILABLE: 503, C.DATA_LOSS: 500,
}
DEADLINE_EXCEEDED = "context deadline exceeded"


class Abort(Exception):
    """What ``context.abort`` raises here: the call ends with this gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def error_body(code: grpc.StatusCode, details: str) -> bytes:
    """grpc-gateway v1's errorBody: ``error`` and ``message`` both hold the status message."""
    return dumps({"error": details, "code": code.value[0], "message": details})


def stream_error_body(code: grpc.StatusCode, details: str) -> bytes:
    """grpc-gateway v1's error chunk, when a stream ends with an error."""
    status = HTTP_STATUS.get(code, 500)
    return dumps({"error": {"grpc_code": code.value[0], "http_code": status, "message": details,
                            "http_status": reason(status)}})


def reason(status: int) -> str:
    return HTTPStatus(status).phrase


def error_response(code: grpc.StatusCode, details: str) -> web.Response:
    return web.Response(status=HTTP_STATUS.get(code, 500), body=error_body(code, details), content_type=JSON_TYPE)


def plain(status: int, text: str) -> web.Response:
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


def http_error(status: int) -> web.Response:
    """Go's http.Error, as grpc-gateway answers a path or method it does not serve."""
    response = web.Response(status=status, text=reason(status) + "\n", content_type="text/plain", charset="utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def host_refused(shown: str) -> web.Response:
    """etcd's DNS-rebinding refusal (421) of a Host not in --host-whitelist, naming it."""
    return plain(421, _HOST_REFUSED.format(host=json.dumps(shown)))


def origin_refused(shown: str) -> web.Response:
    """The refusal (403) of a request from a web page of an origin not in --cors, naming it."""
    return plain(403, _ORIGIN_REFUSED.format(origin=json.dumps(shown)))
