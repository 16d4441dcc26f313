"""The gateway's streams against clients that misbehave, on a real store and proxy: many watch
streams, clients that hang up mid-stream, and one that asks for a watch and never reads.

What an operator sees must stay true: the store's ``raftgate_store_open_watches`` returns to where
it was once the HTTP clients are gone (no store stream leaks), and the proxy's memory does not grow
with what a reader that takes nothing is owed.
"""

from __future__ import annotations

import base64
import json
import socket
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.probes import sample, scrape
from tests.support.processes import Program, free_port, proxy_program, store_program, wait_for, wait_serving

pytestmark = pytest.mark.slow

WAIT = 120.0  # upper bound for a condition on a loaded machine, never a timing assertion
OPEN_WATCHES = "raftgate_store_open_watches"


@dataclass
class Deployment:
    gateway: tuple[str, int]
    store_metrics: str
    proxy: Program
    store: Program


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    workdir = tmp_path_factory.mktemp("gateway-streams")
    metrics = f"127.0.0.1:{free_port()}"
    store, internal = store_program(workdir, "--metrics-addr", metrics)
    port, gateway = free_port(), free_port()
    proxy = proxy_program(workdir, internal, f"http://127.0.0.1:{port}",
                          "--listen-gateway-urls", f"http://127.0.0.1:{gateway}")
    with store, proxy:
        wait_serving(f"127.0.0.1:{port}")
        yield Deployment(("127.0.0.1", gateway), metrics, proxy, store)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def post(d: Deployment, path: str, body: object) -> tuple[int, object]:
    out = subprocess.run(["curl", "-s", "-m", str(WAIT), "-w", "\n%{http_code}",
                          f"http://{d.gateway[0]}:{d.gateway[1]}{path}", "--data-binary", "@-"],
                         input=json.dumps(body), capture_output=True, text=True, timeout=WAIT + 10, check=True).stdout
    text, _, status = out.rpartition("\n")
    return int(status), json.loads(text)


def open_watch(d: Deployment, key: bytes, rcvbuf: int | None = None) -> socket.socket:
    """A /v3/watch request as curl sends it (the whole body, then the answers are read)."""
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(WAIT)
    sock.connect(d.gateway)
    body = json.dumps({"create_request": {"key": b64(key)}}).encode()
    sock.sendall(b"POST /v3/watch HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen[-500:]
        seen += chunk
    return seen


def open_watches(d: Deployment) -> float:
    return sample(scrape(d.store_metrics), OPEN_WATCHES)


def gauge_back_to(d: Deployment, value: float) -> None:
    wait_for(lambda: open_watches(d) == value, WAIT, f"{OPEN_WATCHES} back to {value} (now {open_watches(d)})")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_many_streams_then_hang_ups_leave_no_store_watch(d: Deployment) -> None:
    """100 streams each get created and the event; then half hang up cleanly, half reset: every
    store watch ends."""
    base = open_watches(d)
    socks = [open_watch(d, b"/many") for _ in range(100)]
    try:
        for sock in socks:
            read_until(sock, b'"created":true')
        wait_for(lambda: open_watches(d) == base + 100, WAIT, "100 store watches")
        assert post(d, "/v3/kv/put", {"key": b64(b"/many"), "value": b64(b"v")})[0] == 200
        for sock in socks:
            read_until(sock, b64(b"v").encode())
    finally:
        for i, sock in enumerate(socks):
            if i % 2:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
            sock.close()
    gauge_back_to(d, base)


def test_a_client_that_hangs_up_before_created_leaves_no_store_watch(d: Deployment) -> None:
    base = open_watches(d)
    for _ in range(30):
        open_watch(d, b"/early").close()
    gauge_back_to(d, base)
    assert post(d, "/v3/kv/range", {"key": b64(b"/early")})[0] == 200


def test_a_reader_that_takes_nothing_holds_no_memory_for_it(d: Deployment) -> None:
    """A watch whose client never reads, while 96 MiB of events for it are written: the proxy's RSS
    grows by far less than that; when the client goes, its store watch ends; others are served."""
    base = open_watches(d)
    stalled = open_watch(d, b"/slow", rcvbuf=4096)
    try:
        wait_for(lambda: open_watches(d) == base + 1, WAIT, "the stalled store watch")
        assert d.proxy.proc is not None
        before = rss(d.proxy.proc.pid)
        value = b64(b"x" * (1 << 20))
        for _ in range(96):
            assert post(d, "/v3/kv/put", {"key": b64(b"/slow"), "value": value})[0] == 200
        grown = rss(d.proxy.proc.pid) - before
        assert grown < 48 << 20, f"the proxy grew by {grown >> 20} MiB for a reader that takes nothing"
    finally:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stalled.close()
    gauge_back_to(d, base)
    fresh = open_watch(d, b"/slow")
    try:
        read_until(fresh, b'"created":true')
    finally:
        fresh.close()
