"""The JSON gateway's translation (JSON <-> protobuf, gRPC status -> HTTP), its flag, and the bound
on a stream whose HTTP reader takes nothing; in process (the side-by-side tests with etcd are in
tests/conformance/test_gateway.py). Expected wordings are etcd 3.5.1's, measured with curl."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import ClientSession

from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2 as kv
from proxy.config import ConfigError, load
from proxy.gateway import Gateway, routes
from proxy.gateway_errors import HTTP_STATUS, error_body
from proxy.gateway_json import JsonError, dumps, parse_request, to_json


@pytest.fixture
def secret(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_text("dev-secret\n")
    return str(path)


def base(secret: str, *more: str) -> list[str]:
    return ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}", *more]


def test_gateway_flag_and_env(secret: str) -> None:
    assert load(base(secret), env={}).listen_gateway == ()
    cfg = load(base(secret, "--listen-gateway-urls=http://127.0.0.1:8080,unix:///tmp/gw.sock"), env={})
    assert cfg.listen_gateway == ("127.0.0.1:8080", "unix:/tmp/gw.sock")
    env = {"RAFTGATE_PROXY_LISTEN_GATEWAY_URLS": "http://0.0.0.0:2380"}
    assert load(base(secret), env=env).listen_gateway == ("0.0.0.0:2380",)
    assert load(base(secret, "--listen-gateway-urls=http://127.0.0.1:1"), env=env).listen_gateway == ("127.0.0.1:1",)
    with pytest.raises(ConfigError, match="--listen-gateway-urls"):
        load(base(secret, "--listen-gateway-urls=ftp://x:1"), env={})


class _Stub:
    """Stands in for the Pipeline: the gateway only calls its handler methods."""

    def __init__(self) -> None:
        self.produced = 0
        self.total = 64 << 20

    async def unary(self, method: Any, request: bytes, context: Any) -> bytes:
        return pb.RangeResponse().SerializeToString()

    authenticate = hash_password = unary

    async def watch(self, method: Any, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """1 KiB events for ever (64 MiB in all), whether or not anyone reads them."""
        answer = pb.WatchResponse(events=[kv.Event(kv=kv.KeyValue(key=b"k", value=b"v" * 1024))]).SerializeToString()
        while self.produced * len(answer) < self.total:
            self.produced += 1
            yield answer

    range_stream = snapshot = keepalive = unimplemented = watch


ROUTES = routes(_Stub())  # type: ignore[arg-type]


def parse(path: str, value: Any) -> bytes:
    return parse_request(ROUTES[path].request, value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1], "json: cannot unmarshal array into Go value of type map[string]json.RawMessage"),
        ("s", "json: cannot unmarshal string into Go value of type map[string]json.RawMessage"),
        ({"key": "Zm9"}, "illegal base64 data at input byte 0"),
        ({"key": "Zm9v-_"}, "illegal base64 data at input byte 4"),
        ({"key": "%%%"}, "illegal base64 data at input byte 0"),
        ({"key": 5}, "json: cannot unmarshal number into Go value of type []uint8"),
        ({"key": "Zm9v", "keys_only": "yes"}, "json: cannot unmarshal string into Go value of type bool"),
        ({"key": "Zm9v", "sortOrder": "BOGUS"},
         'unknown value "\\"BOGUS\\"" for enum etcdserverpb.RangeRequest.SortOrder'),
        ({"key": "Zm9v", "limit": "abc"}, "invalid character 'a' looking for beginning of value"),
    ],
)
def test_bad_requests_are_refused_in_gos_words(body: Any, message: str) -> None:
    """The gateway answers these InvalidArgument (tests/conformance/test_gateway.py compares with etcd)."""
    with pytest.raises(JsonError) as caught:
        parse("/v3/kv/range", body)
    assert str(caught.value) == message


def test_requests_take_both_names_and_ignore_unknown_fields() -> None:
    data = parse("/v3/kv/range", {"key": "Zm9v", "range_end": "Zm9w", "keysOnly": True, "limit": "5", "x": 1})
    assert pb.RangeRequest.FromString(data) == pb.RangeRequest(key=b"foo", range_end=b"fop", keys_only=True, limit=5)
    assert parse("/v3/lease/grant", {"TTL": 60, "ID": "7"}) == pb.LeaseGrantRequest(TTL=60, ID=7).SerializeToString()
    assert parse("/v3/kv/range", None) == b""  # null: an empty request, as in Go


def test_answers_as_etcds_gateway_writes_them() -> None:
    empty = pb.RangeResponse(header=pb.ResponseHeader(cluster_id=1, revision=2))
    assert to_json(empty) == {"header": {"cluster_id": "1", "revision": "2"}}  # no kvs, no count
    event = pb.WatchResponse(events=[kv.Event(kv=kv.KeyValue(key=b"k"))], created=True)
    assert to_json(event) == {"created": True, "events": [{"kv": {"key": "aw=="}}]}  # PUT: no type


def test_status_codes_as_grpc_gateway() -> None:
    assert set(HTTP_STATUS) == set(grpc.StatusCode)
    C = grpc.StatusCode
    assert [HTTP_STATUS[c] for c in (C.INVALID_ARGUMENT, C.PERMISSION_DENIED, C.UNAUTHENTICATED,
                                     C.FAILED_PRECONDITION, C.NOT_FOUND, C.RESOURCE_EXHAUSTED)] == [400, 403, 401,
                                                                                                    400, 404, 429]
    assert error_body(C.PERMISSION_DENIED, "etcdserver: permission denied") == (
        b'{"error":"etcdserver: permission denied","code":7,"message":"etcdserver: permission denied"}')


def test_a_watch_reader_that_takes_nothing_holds_the_stream_back() -> None:
    """The handler is not pulled while the socket is full: a client that reads nothing makes the
    producer stop far below its 64 MiB (each write waits for the socket to drain)."""
    stub = _Stub()

    async def scenario() -> None:
        gateway = Gateway(stub, ["127.0.0.1:0"], max_message_bytes=1 << 20)  # type: ignore[arg-type]
        await gateway.start()
        try:
            host, port = gateway.addresses[0].rsplit(":", 1)
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
            body = b'{"create_request": {"key": "aw=="}}'
            await asyncio.get_running_loop().sock_sendall(sock, b"POST /v3/watch HTTP/1.1\r\nHost: localhost\r\n"
                                                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            # Wait until the producer stops (or, broken, finishes): bounded, no timing asserted.
            last = -1
            for _ in range(600):
                await asyncio.sleep(0.1)
                if stub.produced == last or stub.produced * 1024 >= stub.total:
                    break
                last = stub.produced
            assert stub.produced * 1024 < 16 << 20, f"{stub.produced} KiB taken from the handler"
            sock.close()
        finally:
            await gateway.stop()

    asyncio.run(scenario())


def test_unknown_paths_and_methods_as_go() -> None:
    async def scenario() -> list[tuple[int, str, str]]:
        gateway = Gateway(_Stub(), ["127.0.0.1:0"], max_message_bytes=1 << 20)  # type: ignore[arg-type]
        await gateway.start()
        out = []
        try:
            url = f"http://{gateway.addresses[0]}"
            async with ClientSession() as session:
                for method, path in (("POST", "/v3/kv/nothing"), ("GET", "/v3/kv/range"), ("POST", "/v3/kv/range")):
                    async with session.request(method, url + path, data=b'{"key": "aw=="}') as r:
                        out.append((r.status, r.headers["Content-Type"], await r.text()))
        finally:
            await gateway.stop()
        return out

    assert asyncio.run(scenario()) == [
        (404, "text/plain; charset=utf-8", "Not Found\n"),
        (405, "text/plain; charset=utf-8", "Method Not Allowed\n"),
        (200, "application/json", "{}"),
    ]


def test_version_is_what_status_reports() -> None:
    """GET /version needs no credentials, so it cannot ask the store: its constant is the store's."""
    from authstore.api.maintenance import VERSION
    from proxy.gateway import ETCD_CLUSTER_VERSION, ETCD_VERSION

    assert ETCD_VERSION == VERSION
    assert ".".join(VERSION.split(".")[:2]) + ".0" == ETCD_CLUSTER_VERSION


def test_json_escaped_as_go() -> None:
    assert dumps({"roles": ["\u00fc<x>&", 'a"b']}) == '{"roles":["\u00fc\\u003cx\\u003e\\u0026","a\\"b"]}'.encode()


def test_a_gateway_port_in_use_is_refused() -> None:
    """No raftgate server shares a port (docs/configuration.md): the gateway's bind fails too."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    address = f"127.0.0.1:{held.getsockname()[1]}"

    async def scenario() -> None:
        gateway = Gateway(_Stub(), [address], max_message_bytes=1 << 20)  # type: ignore[arg-type]
        try:
            with pytest.raises(OSError, match=f"cannot listen on {address} \\(gateway\\)"):
                await gateway.start()
        finally:
            await gateway.stop()

    try:
        asyncio.run(scenario())
    finally:
        held.close()


@pytest.mark.parametrize("payload", [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00",
                                     b"garbage\x01\x02 /x HTTP/1.1\r\n\r\n"])
def test_bytes_that_are_not_http_are_refused_without_an_error_or_a_traceback(
        payload: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """A port scanner or a gRPC client pointed at the gateway port gets aiohttp's 400; the log gets
    one short line, not an ERROR with a traceback quoting the client's bytes (a healthy proxy logs
    no ERROR)."""
    async def scenario() -> bytes:
        gateway = Gateway(_Stub(), ["127.0.0.1:0"], max_message_bytes=1 << 20)  # type: ignore[arg-type]
        await gateway.start()
        try:
            host, port = gateway.addresses[0].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(payload)
            answer = await asyncio.wait_for(reader.read(64), 10)
            writer.close()
            return answer
        finally:
            await gateway.stop()

    with caplog.at_level("DEBUG"):
        assert asyncio.run(scenario()).startswith(b"HTTP/1.0 400")
    assert not [r for r in caplog.records if r.levelno >= 40 or r.exc_info], \
        [(r.levelname, r.getMessage()) for r in caplog.records]
    assert not any("garbage" in r.getMessage() or "\\x00" in r.getMessage() for r in caplog.records)


# --- --cors, --host-whitelist and the gateway's connection bounds (issue 21 item 8) ---------------------


def test_gateway_access_defaults(secret: str) -> None:
    from proxy.gateway_access import DEFAULT_MAX_CONNECTIONS, Access, default_max_connections

    cfg = load(base(secret, "--listen-gateway-urls=http://127.0.0.1:8080"), env={})
    assert cfg.gateway_access == Access(origins=frozenset(), hosts=None)  # no origin; localhost and addresses
    assert (cfg.gateway_limits.header_timeout, cfg.gateway_limits.body_timeout) == (10.0, 60.0)
    assert cfg.gateway_limits.max_connections == default_max_connections() <= DEFAULT_MAX_CONNECTIONS


def test_gateway_access_flags_and_env(secret: str) -> None:
    cfg = load(base(secret, "--cors", "https://App.example:443, http://b.example:8080", "--host-whitelist",
                    "Raftgate.example,[::1],10.0.0.5", "--gateway-header-timeout", "1.5s",
                    "--gateway-body-timeout", "2m", "--gateway-max-connections", "7"), env={})
    assert cfg.gateway_access.origins == {"https://app.example", "http://b.example:8080"}
    assert cfg.gateway_access.hosts == {"raftgate.example", "::1", "10.0.0.5"}
    assert (cfg.gateway_limits.header_timeout, cfg.gateway_limits.body_timeout) == (1.5, 120.0)
    assert cfg.gateway_limits.max_connections == 7
    env = {"RAFTGATE_PROXY_CORS": "*", "RAFTGATE_PROXY_HOST_WHITELIST": "*"}
    assert load(base(secret), env=env).gateway_access.origins == {"*"}
    assert load(base(secret), env=env).gateway_access.hosts == {"*"}


@pytest.mark.parametrize(("args", "needle"), [
    (["--cors", ""], "--cors: is empty"),
    (["--cors", "https://a.example/"], "is not an origin"),
    (["--cors", "https://a.example/app"], "is not an origin"),
    (["--cors", "a.example"], "is not an origin"),
    (["--cors", "https://user@a.example"], "is not an origin"),
    (["--cors", "null"], "is not an origin"),
    (["--host-whitelist", ""], "--host-whitelist: is empty"),
    (["--host-whitelist", "a.example:2379"], "without a port"),
    (["--host-whitelist", "http://a.example"], "without a port"),
    (["--gateway-header-timeout", "10"], "--gateway-header-timeout"),
    (["--gateway-header-timeout", "0s"], "must be in"),
    (["--gateway-body-timeout=-1s"], "must be in"),
    (["--gateway-max-connections", "0"], "--gateway-max-connections"),
])
def test_gateway_access_bad_values(secret: str, args: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        load(base(secret, *args), env={})


@pytest.mark.parametrize(("host", "default", "listed"), [
    ("127.0.0.1:2379", True, False), ("127.0.0.1", True, False), ("[::1]:2379", True, True), ("[::1]", True, True),
    ("localhost", True, False), ("LOCALHOST:80", True, False), ("10.1.2.3:1", True, False), ("", True, False),
    ("raftgate.example:2379", False, True), ("RAFTGATE.example", False, True),
    ("evil.example", False, False), ("127.0.0.1.nip.io:2379", False, False), ("localhost.", False, False),
    ("localhost.evil.example", False, False), ("[::1]x", False, False), ("0x7f000001", False, False),
    ("raftgate.example:x", False, False), ("raftgate.example:80:80", False, False),
])
def test_host_names_as_compared(host: str, default: bool, listed: bool) -> None:
    from proxy.gateway_access import Access, parse_hosts

    assert Access().host_allowed(host) is default
    assert Access(hosts=parse_hosts("raftgate.example,::1")).host_allowed(host) is listed
    assert Access(hosts=parse_hosts("*")).host_allowed(host)


@pytest.mark.parametrize(("origin", "allowed"), [
    ("https://app.example", True), ("https://APP.example:443", True), ("https://app.example:8443", False),
    ("http://app.example", False), ("https://app.example.evil.example", False), ("null", False), ("", False),
    ("https://app.example/", True), ("https://app.example/x", False),
])
def test_origins_as_compared(origin: str, allowed: bool) -> None:
    from proxy.gateway_access import Access, parse_origins

    assert Access(origins=parse_origins("https://app.example")).origin_allowed(origin) is allowed
    assert not Access().origin_allowed(origin)
    assert Access(origins=parse_origins("*")).origin_allowed(origin)


def test_local_gateway_flags() -> None:
    from raftgate.local import parse

    assert parse(["--gateway-port", "2380"], {}).host_whitelist == "localhost,127.0.0.1,::1"
    assert parse(["--gateway-port", "2380"], {}).cors is None
    cfg = parse(["--gateway-port", "2380", "--cors", "https://a.example", "--host-whitelist", "*"], {})
    assert (cfg.cors, cfg.host_whitelist) == ("https://a.example", "*")
    for flag in ("--cors", "--host-whitelist"):
        with pytest.raises(ConfigError, match=f"{flag}: is for the JSON gateway"):
            parse([flag, "*"], {})


def test_connections_over_the_limit_all_in_requests_are_refused_with_503() -> None:
    """At the limit with every connection in a request (here: streams whose first request has not
    come), a new connection gets 503 and is closed; once the body timeout ends those requests
    (408), the gateway serves again."""
    from proxy.gateway_access import Limits

    async def scenario() -> tuple[list[bytes], list[bytes], bytes]:
        gateway = Gateway(_Stub(), ["127.0.0.1:0"], max_message_bytes=1 << 20,  # type: ignore[arg-type]
                          limits=Limits(max_connections=2, body_timeout=1.0))
        await gateway.start()
        host, port = gateway.addresses[0].rsplit(":", 1)
        try:
            streams = []
            for _ in range(2):
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(b"POST /v3/watch HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
                streams.append((reader, writer))
            while sum(c.busy for c in gateway._open.values()) < 2:
                await asyncio.sleep(0.01)
            refused = []
            for _ in range(2):
                reader, writer = await asyncio.open_connection(host, int(port))
                refused.append(await asyncio.wait_for(reader.read(), 30))
                writer.close()
            ended = [await asyncio.wait_for(reader.read(), 60) for reader, _ in streams]
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            served = await asyncio.wait_for(reader.read(), 30)
            for _, w in streams:
                w.close()
            return refused, ended, served
        finally:
            await gateway.stop()

    refused, ended, served = asyncio.run(scenario())
    assert all(r.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for r in refused), refused
    assert all(r.startswith(b"HTTP/1.1 408 Request Timeout\r\n") for r in ended), ended
    assert served.startswith(b"HTTP/1.1 200 OK\r\n"), served
