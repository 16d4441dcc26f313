"""The gateway's HTTP surface as etcd's (Go's net/http ServeMux in front of grpc-gateway) answers
it, byte for byte where it matters: a path that is not clean (``//``, ``.``, ``..``, also once
percent-decoded) is redirected to its clean form (301, the query kept), and ``/version`` allows GET
only (405 with ``Allow: GET``). Expected answers measured on etcd 3.5.1 with curl.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from proxy.gateway import Gateway


class _Stub:
    async def unary(self, method: Any, request: bytes, context: Any) -> bytes:
        return pb.RangeResponse().SerializeToString()

    authenticate = hash_password = unary

    async def watch(self, method: Any, requests: Any, context: Any) -> Any:
        async for _ in requests:
            yield pb.WatchResponse(created=True).SerializeToString()

    range_stream = snapshot = keepalive = watch


def exchange(request: bytes) -> tuple[str, dict[str, str], bytes]:
    """One raw HTTP/1.1 request (sent as is, path untouched): (status line, headers, body)."""

    async def scenario() -> bytes:
        gateway = Gateway(_Stub(), ["127.0.0.1:0"], max_message_bytes=1 << 20)  # type: ignore[arg-type]
        await gateway.start()
        try:
            host, port = gateway.addresses[0].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request)
            answer = await asyncio.wait_for(reader.read(), 30)
            writer.close()
            return answer
        finally:
            await gateway.stop()

    raw = asyncio.run(scenario())
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, body


def post(path: str, body: bytes = b"{}", method: str = "POST") -> tuple[str, dict[str, str], bytes]:
    return exchange(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {len(body)}"
                    f"\r\n\r\n".encode() + body)


@pytest.mark.parametrize(("path", "location"), [
    ("//v3//kv/range?x=1", "/v3/kv/range?x=1"),
    ("/v3/kv/../kv/range", "/v3/kv/range"),
    ("/v3/kv/./range", "/v3/kv/range"),
    ("/v3/kv/range/..", "/v3/kv"),
    ("/v3/kv/range%2F..", "/v3/kv"),
])
def test_a_path_that_is_not_clean_is_redirected_as_go_s_mux_does(path: str, location: str) -> None:
    status, headers, body = post(path)
    assert (status, headers.get("location"), headers.get("content-length"), body) == (
        "HTTP/1.1 301 Moved Permanently", location, "0", b"")
    assert "content-type" not in headers and "access-control-allow-origin" not in headers  # no --cors: none


def test_a_get_redirect_has_go_s_html_body() -> None:
    status, headers, body = post("/v3/kv/../kv/range", b"", method="GET")
    assert (status, headers["location"], headers["content-type"], body) == (
        "HTTP/1.1 301 Moved Permanently", "/v3/kv/range", "text/html; charset=utf-8",
        b'<a href="/v3/kv/range">Moved Permanently</a>.\n\n')


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_version_allows_get_only(method: str) -> None:
    status, headers, body = post("/version", method=method)
    assert (status, headers.get("allow"), headers["content-type"], headers["x-content-type-options"], body) == (
        "HTTP/1.1 405 Method Not Allowed", "GET", "text/plain; charset=utf-8", "nosniff", b"Method Not Allowed\n")


def test_version_head_is_405_without_a_body() -> None:
    status, headers, body = exchange(b"HEAD /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert (status, headers.get("allow"), headers["content-length"], body) == (
        "HTTP/1.1 405 Method Not Allowed", "GET", "19", b"")


def test_clean_paths_are_served() -> None:
    assert post("/v3/kv/range")[0] == "HTTP/1.1 200 OK"
    assert exchange(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")[0] == "HTTP/1.1 200 OK"
    assert post("/version/", method="GET")[0] == "HTTP/1.1 404 Not Found"


def test_a_compressed_body_is_not_inflated() -> None:
    """etcd's gateway reads the body's bytes as they come, whatever Content-Encoding says (Go's
    server decodes none): a gzip body is JSON that does not start well, never 500 MB inflated from
    500 KB."""
    import gzip

    body = gzip.compress(b'{"key": "Zm9v"}')
    head = f"POST /v3/kv/range HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Encoding: gzip\r\n" \
           f"Content-Length: {len(body)}\r\n\r\n".encode()
    status, headers, answer = exchange(head + body)
    message = "invalid character '\\x1f' looking for beginning of value"
    expected = json.dumps({"error": message, "code": 3, "message": message}, separators=(",", ":"))
    assert (status, answer) == ("HTTP/1.1 400 Bad Request", expected.encode())


@pytest.mark.parametrize("path", ["/v3/watch", "/v3/lease/keepalive"])
def test_an_http_1_0_stream_is_answered_until_close(path: str, caplog: pytest.LogCaptureFixture) -> None:
    """HTTP/1.0 has no chunked encoding: etcd answers a stream's lines with no length and closes;
    it must not fail with an ERROR traceback and an empty reply."""
    body = b'{"create_request": {"key": "Zm9v"}}' if path == "/v3/watch" else b'{"ID": 1}'
    with caplog.at_level("DEBUG"):
        status, headers, answer = exchange(b"POST %s HTTP/1.0\r\nContent-Length: %d\r\n\r\n%s"
                                           % (path.encode(), len(body), body))
    assert status == "HTTP/1.0 200 OK" and "transfer-encoding" not in headers, (status, headers)
    assert answer.startswith(b'{"result":{'), answer
    assert not [r for r in caplog.records if r.levelno >= 40], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize(("timeout", "status"), [
    ("9999999999999999999H", "HTTP/1.1 400 Bad Request"),  # not an int64: Go's ParseInt refuses it
    ("9223372036854775808n", "HTTP/1.1 400 Bad Request"),
    ("9223372036854775807H", "HTTP/1.1 504 Gateway Timeout"),  # Go's int64 product wraps negative
    ("2562048H", "HTTP/1.1 504 Gateway Timeout"),
    ("2562047H", "HTTP/1.1 200 OK"),
    ("9223372036854775807n", "HTTP/1.1 200 OK"),
])
def test_grpc_timeout_overflow_as_grpc_gateway_reads_it(timeout: str, status: str) -> None:
    body = b'{"key": "Zm9v"}'
    answer = exchange(f"POST /v3/kv/range HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                      f"Grpc-Timeout: {timeout}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    assert answer[0] == status, answer
