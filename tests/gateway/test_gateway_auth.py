"""The gateway shares the gRPC pipeline's authorization: a sidecar identity is never lent to an
HTTP client (even on loopback), and a watch stream opened over HTTP keeps no right its token lost
(a deleted user, a revoked role): no event after the loss, the watch canceled as on gRPC.

Finding: a sidecar identity lent to HTTP clients on loopback, and gateway watches that outlive their
rights (attacks that held when written).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.processes import etcdctl, free_port, proxy_program, store_program, wait_serving

pytestmark = pytest.mark.slow

WAIT = 120.0  # upper bound on a loaded machine, never a timing assertion
ROOT = "root:rootpw"


@dataclass
class Pod:
    grpc: str  # loopback gRPC listener: lends the identity
    gateway: tuple[str, int]  # loopback gateway: must never lend it


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    tmp = tmp_path_factory.mktemp("gateway-auth")
    volume = tmp / "identity"
    volume.mkdir()
    (volume / "username").write_text("alice")
    (volume / "password").write_text("alicepw")
    store, internal = store_program(tmp)
    port, gateway = free_port(), free_port()
    proxy = proxy_program(tmp, internal, f"http://127.0.0.1:{port}", "--identity-file", str(volume),
                          "--listen-gateway-urls", f"http://127.0.0.1:{gateway}")
    with store, proxy:
        wait_serving(f"127.0.0.1:{port}")
        pod = Pod(f"127.0.0.1:{port}", ("127.0.0.1", gateway))
        for args in (("user", "add", ROOT), ("user", "add", "alice:alicepw"), ("user", "add", "bob:bobpw"),
                     ("role", "add", "app"), ("role", "grant-permission", "app", "readwrite", "/app/", "--prefix"),
                     ("user", "grant-role", "alice", "app"), ("user", "grant-role", "bob", "app"),
                     ("auth", "enable")):
            rc, _, err = etcdctl(pod.grpc, *args)
            assert rc == 0, (args, err)
        yield pod


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def post(pod: Pod, path: str, body: object, token: str | None = None) -> tuple[int, dict[str, object]]:
    cmd = ["curl", "-s", "-m", str(WAIT), "-w", "\n%{http_code}", f"http://{pod.gateway[0]}:{pod.gateway[1]}{path}",
           "-d", json.dumps(body)]
    if token is not None:
        cmd += ["-H", f"Authorization: {token}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT + 10, check=True).stdout
    text, _, status = out.rpartition("\n")
    return int(status), json.loads(text)


def token(pod: Pod, name: str, password: str) -> str:
    status, body = post(pod, "/v3/auth/authenticate", {"name": name, "password": password})
    assert status == 200, body
    return str(body["token"])


def as_root(pod: Pod, path: str, body: object) -> None:
    status, answer = post(pod, path, body, token(pod, "root", "rootpw"))
    assert status == 200, (path, answer)


def user_empty() -> tuple[int, dict[str, object]]:
    message = "etcdserver: user name is empty"
    return 400, {"error": message, "code": 3, "message": message}


def test_the_sidecar_identity_is_never_lent_over_http(pod: Pod) -> None:
    rc, out, err = etcdctl(pod.grpc, "put", "/app/lent", "v")  # gRPC on loopback: lent (alice)
    assert rc == 0, err
    assert post(pod, "/v3/kv/range", {"key": b64(b"/app/lent")}) == user_empty()
    assert post(pod, "/v3/kv/put", {"key": b64(b"/app/x"), "value": b64(b"y")}) == user_empty()
    # a watch without a token is refused as etcd refuses an anonymous watch: canceled, no events
    stream = Stream(pod, b"/app/lent", None)
    try:
        first = json.loads(stream.line())["result"]
        assert first.get("canceled") is True, first
    finally:
        stream.close()


class Stream:
    """A /v3/watch request as curl sends it; its answers read one JSON line at a time."""

    def __init__(self, pod: Pod, key: bytes, auth: str | None) -> None:
        self.sock = socket.create_connection(pod.gateway, timeout=WAIT)
        self.buf = b""
        body = json.dumps({"create_request": {"key": b64(key), "range_end": b64(key[:-1] + bytes([key[-1] + 1]))}})
        head = "POST /v3/watch HTTP/1.1\r\nHost: localhost\r\n" + (f"Authorization: {auth}\r\n" if auth else "")
        self.sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())

    def line(self) -> str:
        """The next JSON line (the HTTP head and chunk sizes skipped); '' when the stream ends."""
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                if line.strip().startswith(b"{"):
                    return line.strip().decode()
            chunk = self.sock.recv(65536)
            if not chunk:
                return ""
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("loss", ["user_delete", "role_revoke"])
def test_a_gateway_watch_gets_no_event_after_its_user_lost_the_right(pod: Pod, loss: str) -> None:
    name = "bob" if loss == "user_delete" else "alice"
    prefix = f"/app/{loss}/".encode()
    stream = Stream(pod, prefix, token(pod, name, f"{name}pw"))
    try:
        assert json.loads(stream.line())["result"]["created"] is True
        as_root(pod, "/v3/kv/put", {"key": b64(prefix + b"k"), "value": b64(b"before")})
        event = json.loads(stream.line())["result"]["events"][0]
        assert event["kv"]["value"] == b64(b"before")
        if loss == "user_delete":
            as_root(pod, "/v3/auth/user/delete", {"name": "bob"})
        else:
            as_root(pod, "/v3/auth/user/revoke", {"name": "alice", "role": "app"})
        as_root(pod, "/v3/kv/put", {"key": b64(prefix + b"k"), "value": b64(b"after")})
        # the stream ends or the watch is canceled; the value written after the loss never comes
        rest = []
        while (line := stream.line()) and not json.loads(line).get("result", {}).get("canceled"):
            rest.append(line)
        assert not any(b64(b"after") in line for line in rest + [line]), rest + [line]
        assert line, "the stream ended without a cancel"
    finally:
        stream.close()
