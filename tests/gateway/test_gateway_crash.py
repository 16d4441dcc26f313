"""kill -9 of the store (the leader: one node) under the gateway: an open watch stream stays open
and resumes when the store is back (no event lost), a put while it is down gets etcd's error JSON
(never a dropped connection or a 500), and the proxy stays up throughout.

Finding: a store crash under the gateway dropping connections, answering 500 or losing watch events
(an attack that held when written).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import free_port, proxy_program, store_program, wait_serving

pytestmark = pytest.mark.slow

WAIT = 120.0  # upper bound on a loaded machine, never a timing assertion


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_store_killed_under_a_gateway_watch_and_put(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path)
    port, gateway = free_port(), free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}",
                          "--listen-gateway-urls", f"http://127.0.0.1:{gateway}")

    def put(value: bytes) -> tuple[int, dict[str, object]]:
        out = subprocess.run(["curl", "-s", "-m", str(WAIT), "-w", "\n%{http_code}",
                              f"http://127.0.0.1:{gateway}/v3/kv/put", "-d",
                              json.dumps({"key": b64(b"/crash"), "value": b64(value)})],
                             capture_output=True, text=True, timeout=WAIT + 10, check=True).stdout
        text, _, status = out.rpartition("\n")
        return int(status), json.loads(text)

    with store, proxy:
        wait_serving(f"127.0.0.1:{port}")
        sock = socket.create_connection(("127.0.0.1", gateway), timeout=WAIT)
        try:
            body = json.dumps({"create_request": {"key": b64(b"/crash")}}).encode()
            sock.sendall(b"POST /v3/watch HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            seen = b""
            while b'"created":true' not in seen:
                chunk = sock.recv(65536)
                assert chunk, seen
                seen += chunk
            store.kill9()
            status, answer = put(b"while-down")
            assert status in (503, 504), (status, answer)
            assert answer["code"] in (4, 14) and answer["error"] == answer["message"], answer
            assert str(answer["message"]).startswith("etcdserver: "), answer
            assert proxy.proc is not None and proxy.proc.poll() is None
            store.start()
            wait_serving(f"127.0.0.1:{port}")
            assert put(b"after")[0] == 200
            seen = b""
            while b64(b"after").encode() not in seen:
                chunk = sock.recv(65536)
                assert chunk, f"the watch stream ended: {seen[-300:]!r}"
                seen += chunk
        finally:
            sock.close()
        assert proxy.proc is not None and proxy.proc.poll() is None
