"""The JSON gateway as a web page and a careless client meet it (issue 21 item 8).

A web page in a browser on the same machine (or network) can send requests to a local gateway:
cross-origin, and with DNS rebinding even same-origin under the attacker's own name. With auth off
(a fresh ``raftgate local``) the gateway reads and writes everything, so: no CORS headers unless
``--cors`` names the origin, a request carrying an ``Origin`` that ``--cors`` does not allow is not
served, and a ``Host`` that ``--host-whitelist`` does not list is refused as etcd refuses it (421).

Descriptors: a client that sends half a header and stalls is disconnected after the header timeout,
a stalled unary body after the body timeout (streams are never cut by either), and idle connections
beyond the connection limit do not take the proxy's descriptors from its gRPC port or from
well-behaved gateway clients. Requests are sent as raw bytes, so Host and Origin are exactly what
a browser would send.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.processes import (
    Program,
    RaftgateLocal,
    etcdctl,
    free_port,
    proxy_program,
    stop_together,
    store_program,
    wait_for,
    wait_serving,
)

pytestmark = pytest.mark.slow

WAIT = 60.0  # upper bound on a loaded machine, never a timing assertion
EVIL = "https://evil.example"
APP = "https://app.example"
#: etcd's CORS headers (its addCORSHeader), as a preflight answer carries them
CORS_METHODS = "POST, GET, OPTIONS, PUT, DELETE"
CORS_HEADERS = "accept, content-type, authorization"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


Answer = tuple[str, dict[str, str], bytes]


def exchange(address: tuple[str, int], head: str, body: bytes = b"") -> Answer:
    """One request, its head given line by line (``Connection: close`` and ``Content-Length``
    added): (status line, headers with lower-case names, body)."""
    raw = (head + f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    with socket.create_connection(address, timeout=WAIT) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    top, _, rest = answer.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, rest


def put(address: tuple[str, int], key: bytes, *, host: str | None = None, origin: str | None = None) -> Answer:
    host = f"{address[0]}:{address[1]}" if host is None else host
    head = f"POST /v3/kv/put HTTP/1.1\r\nHost: {host}\r\n"
    if origin is not None:
        head += f"Origin: {origin}\r\nContent-Type: text/plain;charset=UTF-8\r\n"  # a browser's simple POST
    return exchange(address, head, json.dumps({"key": b64(key), "value": b64(b"pwned")}).encode())


def stored(address: tuple[str, int], key: bytes) -> bool:
    status, _, body = exchange(address, f"POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1:{address[1]}\r\n",
                               json.dumps({"key": b64(key)}).encode())
    assert status == "HTTP/1.1 200 OK", (status, body)
    return "kvs" in json.loads(body)


def stalls_until_closed(address: tuple[str, int], sent: bytes) -> bytes:
    """Sends ``sent``, then nothing; returns what the server wrote before it closed the connection
    (fails if it is still open after WAIT)."""
    with socket.create_connection(address, timeout=WAIT) as sock:
        sock.sendall(sent)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"the gateway kept a stalled connection open for {WAIT} s (sent {sent!r}, got {answer!r})")
    return answer


# --- raftgate local: what a fresh developer machine runs ---------------------------------------------


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    gateway = free_port()
    server = RaftgateLocal(tmp_path_factory.mktemp("exposure-local"),
                           extra_args=["--nodes", "1", "--gateway-port", str(gateway)])
    with server:
        yield ("127.0.0.1", gateway)


def test_local_gateway_gives_no_other_origin_access_by_default(local: tuple[str, int]) -> None:
    status, headers, _ = put(local, b"/cross-origin", origin=EVIL)
    assert "access-control-allow-origin" not in headers, (status, headers)
    assert not stored(local, b"/cross-origin"), "a cross-origin page wrote through the gateway"
    status, headers, _ = exchange(local, f"OPTIONS /v3/kv/put HTTP/1.1\r\nHost: 127.0.0.1:{local[1]}\r\n"
                                         f"Origin: {EVIL}\r\nAccess-Control-Request-Method: POST\r\n")
    assert "access-control-allow-origin" not in headers, (status, headers)
    # no Origin (curl, etcd3gw): served, and no CORS headers either
    status, headers, _ = put(local, b"/plain")
    assert status == "HTTP/1.1 200 OK" and "access-control-allow-origin" not in headers, (status, headers)


def test_local_gateway_refuses_a_host_it_does_not_know(local: tuple[str, int]) -> None:
    """DNS rebinding: the page's own name now points at 127.0.0.1; the browser sends Host: its name."""
    status, headers, body = put(local, b"/rebound", host=f"evil.example:{local[1]}")
    assert status == "HTTP/1.1 421 Misdirected Request", (status, body)
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert b'--host-whitelist "evil.example"' in body, body
    assert not stored(local, b"/rebound")
    for host in (f"localhost:{local[1]}", f"127.0.0.1:{local[1]}", f"[::1]:{local[1]}", "localhost", "127.0.0.1"):
        status, _, body = put(local, b"/ok", host=host)
        assert status == "HTTP/1.1 200 OK", (host, status, body)
    for host in (f"127.0.0.2:{local[1]}", "evil.example", f"localhost.evil.example:{local[1]}", ""):
        assert put(local, b"/no", host=host)[0] == "HTTP/1.1 421 Misdirected Request", host


# --- raftgate proxy ------------------------------------------------------------------------------------


class Proxies:
    """Proxies started on demand in front of one store; each is stopped at the end of the module."""

    def __init__(self, workdir: Path, store: str) -> None:
        self.workdir = workdir
        self.store = store
        self.started: list[Program] = []

    def start(self, *flags: str, wrap: Callable[[list[str]], list[str]] | None = None) -> tuple[str, tuple[str, int]]:
        """A proxy with these flags and a gateway: (its gRPC endpoint, the gateway's address)."""
        port, gateway = free_port(), free_port()
        program = proxy_program(self.workdir, self.store, f"http://127.0.0.1:{port}", "--listen-gateway-urls",
                                f"http://127.0.0.1:{gateway}", *flags, name=f"proxy{len(self.started)}")
        if wrap is not None:
            inner = program.command
            program.command = lambda: wrap(inner())  # type: ignore[method-assign]
        self.started.append(program)
        program.start()
        wait_serving(f"127.0.0.1:{port}")
        return f"127.0.0.1:{port}", ("127.0.0.1", gateway)


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxies]:
    tmp = tmp_path_factory.mktemp("exposure-proxy")
    store, internal = store_program(tmp)
    with store:
        out = Proxies(tmp, internal)
        try:
            yield out
        finally:
            stop_together(out.started)


def test_proxy_defaults_refuse_other_origins_and_dns_names(proxies: Proxies) -> None:
    _, gateway = proxies.start()
    status, headers, _ = put(gateway, b"/p/cross", origin=EVIL)
    assert status == "HTTP/1.1 403 Forbidden" and "access-control-allow-origin" not in headers, (status, headers)
    assert not stored(gateway, b"/p/cross")
    assert put(gateway, b"/p/rebound", host=f"evil.example:{gateway[1]}")[0] == "HTTP/1.1 421 Misdirected Request"
    # an address is no name a page can rebind: a client that dials an IP address is served
    for host in (f"127.0.0.1:{gateway[1]}", f"localhost:{gateway[1]}", f"10.1.2.3:{gateway[1]}",
                 f"[fd00::1]:{gateway[1]}"):
        assert put(gateway, b"/p/ok", host=host)[0] == "HTTP/1.1 200 OK", host


def test_proxy_cors_preflight_is_answered_as_etcd_answers_it(proxies: Proxies) -> None:
    _, gateway = proxies.start("--cors", APP, "--host-whitelist", "raftgate.example")
    host = f"raftgate.example:{gateway[1]}"
    status, headers, body = exchange(gateway, f"OPTIONS /v3/kv/put HTTP/1.1\r\nHost: {host}\r\nOrigin: {APP}\r\n"
                                              "Access-Control-Request-Method: POST\r\n"
                                              "Access-Control-Request-Headers: authorization, content-type\r\n")
    assert (status, body) == ("HTTP/1.1 200 OK", b"")
    assert (headers["access-control-allow-origin"], headers["access-control-allow-methods"],
            headers["access-control-allow-headers"]) == (APP, CORS_METHODS, CORS_HEADERS)
    status, headers, _ = put(gateway, b"/c/app", host=host, origin=APP)
    assert status == "HTTP/1.1 200 OK" and headers["access-control-allow-origin"] == APP, (status, headers)
    status, headers, _ = put(gateway, b"/c/evil", host=host, origin=EVIL)
    assert status == "HTTP/1.1 403 Forbidden" and "access-control-allow-origin" not in headers, (status, headers)
    # a listed host replaces the defaults, as in etcd (loopback is not added)
    assert put(gateway, b"/c/loop", host=f"127.0.0.1:{gateway[1]}")[0] == "HTTP/1.1 421 Misdirected Request"


def test_proxy_cors_star_is_etcd_s_default_answer(proxies: Proxies) -> None:
    """``--cors '*' --host-whitelist '*'``: what etcd answers with its own defaults."""
    _, gateway = proxies.start("--cors", "*", "--host-whitelist", "*")
    status, headers, _ = put(gateway, b"/s/any", host="anything.example", origin=EVIL)
    assert status == "HTTP/1.1 200 OK" and headers["access-control-allow-origin"] == "*", (status, headers)
    assert headers["access-control-allow-methods"] == CORS_METHODS
    status, headers, _ = put(gateway, b"/s/plain")
    assert headers["access-control-allow-origin"] == "*"


def test_half_a_header_is_disconnected_after_the_timeout(proxies: Proxies) -> None:
    """The proxy's defaults: a client that sends half a header (or nothing) is disconnected."""
    _, gateway = proxies.start()
    # both at once: each waits out the default header timeout, so side by side they take it once
    with ThreadPoolExecutor(2) as pool:
        half = pool.submit(stalls_until_closed, gateway, b"POST /v3/kv/range HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        silent = pool.submit(stalls_until_closed, gateway, b"")
        half.result(), silent.result()


def test_a_stalled_body_is_answered_and_closed_but_streams_are_never_cut(proxies: Proxies) -> None:
    _, gateway = proxies.start("--gateway-header-timeout", "1s", "--gateway-body-timeout", "1s")
    watch = open_watch(gateway, b"/t/w")
    status, _, body = exchange(gateway, "POST /v3/lease/grant HTTP/1.1\r\nHost: 127.0.0.1\r\n", b'{"TTL": 60}')
    assert status == "HTTP/1.1 200 OK", body
    lease = json.dumps({"ID": json.loads(body)["ID"]}).encode()
    keepalive = socket.create_connection(gateway, timeout=WAIT)
    keepalive.sendall(b"POST /v3/lease/keepalive HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                      b"%x\r\n%s\r\n" % (len(lease), lease))
    answers = b""
    while answers.count(b'"TTL"') < 1:
        chunk = keepalive.recv(65536)
        assert chunk, answers
        answers += chunk
    try:
        # a unary body that stops halfway: answered 408 and closed once the body timeout passed
        answer = stalls_until_closed(gateway, b"POST /v3/kv/put HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                              b"Content-Length: 100\r\n\r\n{\"key\": ")
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
        # both timeouts have passed for the watch too (it sent nothing since): it still delivers
        assert put(gateway, b"/t/w")[0] == "HTTP/1.1 200 OK"
        delivers(watch, b"pwned")
        keepalive.sendall(b"%x\r\n%s\r\n" % (len(lease), lease))  # the lease's stream, also quiet since
        while answers.count(b'"TTL"') < 2:
            chunk = keepalive.recv(65536)
            assert chunk, f"the keepalive stream was cut: {answers!r}"
            answers += chunk
    finally:
        watch.close()
        keepalive.close()


def _low_descriptor_limit(command: list[str]) -> list[str]:
    """The proxy under ``ulimit -n 256``: descriptors run out after a couple of hundred connections."""
    return ["sh", "-c", 'ulimit -n 256 && exec "$0" "$@"', *command]


def open_watch(gateway: tuple[str, int], key: bytes) -> socket.socket:
    """A /v3/watch stream on ``key``, created (its first answer read)."""
    watch = socket.create_connection(gateway, timeout=WAIT)
    first = json.dumps({"create_request": {"key": b64(key)}}).encode()
    watch.sendall(b"POST /v3/watch HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"%x\r\n%s\r\n" % (len(first), first))
    seen = b""
    while b'"created":true' not in seen:
        chunk = watch.recv(65536)
        assert chunk, seen
        seen += chunk
    return watch


def delivers(watch: socket.socket, value: bytes) -> None:
    seen = b""
    while b64(value).encode() not in seen:
        chunk = watch.recv(65536)
        assert chunk, f"the watch stream was cut: {seen!r}"
        seen += chunk


def test_idle_connections_beyond_the_limit_starve_neither_grpc_nor_the_gateway(proxies: Proxies) -> None:
    grpc, gateway = proxies.start(wrap=_low_descriptor_limit)
    held: list[socket.socket] = []
    watch = open_watch(gateway, b"/idle/gw")  # a stream is never the connection closed to make room
    held.append(watch)
    try:
        misses = 0
        while len(held) < 400 and misses < 5:  # past the proxy's whole descriptor limit
            try:
                held.append(socket.create_connection(gateway, timeout=2))
            except OSError:
                misses += 1
        rc, out, err = etcdctl(f"http://{grpc}", "put", "/idle/grpc", "v", timeout=30, dial_timeout="5s")
        assert rc == 0, f"the gRPC port stopped serving: {out} {err}"
        proc = subprocess.run(["curl", "-s", "-m", "30", "-w", "\n%{http_code}", f"http://127.0.0.1:{gateway[1]}"
                               "/v3/kv/put", "-d", json.dumps({"key": b64(b"/idle/gw"), "value": b64(b"v")})],
                              capture_output=True, text=True, timeout=60)
        assert proc.stdout.endswith("\n200"), f"a well-behaved gateway request failed: {proc.stdout!r} {proc.stderr}"
        delivers(watch, b"v")
    finally:
        for sock in held:
            with contextlib.suppress(OSError):
                sock.close()
    wait_for(lambda: stored(gateway, b"/idle/gw"), WAIT, "the gateway to serve after the idle connections closed")
