"""A listen address in use is refused (raftgate/grpc_listen.py), and every gRPC server of the
programs is built by the same rules: bound through ``grpc_listen.bind``, ``grpc.so_reuseport`` set,
and a graceful stop no client can hold past ``STOP_PING_TIMEOUT``."""

from __future__ import annotations

import ast
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from raftgate import grpc_listen
from tests.support.processes import REPO_ROOT, free_port


@pytest.mark.parametrize(("host", "port", "expected"), [
    ("127.0.0.1", 80, "127.0.0.1:80"),
    ("localhost", 2379, "localhost:2379"),
    ("::1", 2380, "[::1]:2380"),
    ("[::1]", 2380, "[::1]:2380"),
    ("::", 0, "[::]:0"),
])
def test_host_port_brackets_an_ipv6_literal(host: str, port: int, expected: str) -> None:
    assert grpc_listen.host_port(host, port) == expected


@pytest.fixture
def held() -> Iterator[int]:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        yield port


def test_a_port_held_on_any_address_of_the_name_is_in_use(held: int) -> None:
    assert grpc_listen.in_use(f"127.0.0.1:{held}")
    assert grpc_listen.in_use(f"localhost:{held}")  # gRPC alone would be content with [::1]
    assert grpc_listen.in_use(f"0.0.0.0:{held}")


def test_localhost_is_both_loopbacks_as_grpc_resolves_it() -> None:
    """/etc/hosts may name only 127.0.0.1; gRPC binds [::1] for ``localhost`` too."""
    port = free_port()
    try:
        held = socket.create_server(("::1", port), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with held:
        assert grpc_listen.in_use(f"localhost:{port}")
        assert not grpc_listen.in_use(f"127.0.0.1:{port}")


def test_free_zero_and_unresolvable_ports_are_left_to_grpc() -> None:
    assert not grpc_listen.in_use(f"127.0.0.1:{free_port()}")
    assert not grpc_listen.in_use("127.0.0.1:0")
    assert not grpc_listen.in_use("no-such-host.invalid:2379")
    assert not grpc_listen.in_use("127.0.0.1:not-a-port")


@pytest.mark.parametrize("prefix", ["unix:", "unix://"])
def test_a_socket_file_is_in_use_only_while_something_listens(tmp_path: Path, prefix: str) -> None:
    path = tmp_path / "s.sock"
    address = f"{prefix}{path}"
    assert not grpc_listen.in_use(address)  # absent
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        listening.listen()
        assert grpc_listen.in_use(address)
    assert path.exists() and not grpc_listen.in_use(address)  # left behind, nobody answers
    path.unlink()
    path.write_text("not a socket")
    assert not grpc_listen.in_use(address)  # gRPC's own bind refuses it


PRODUCT = ("proxy", "authstore", "raftgate")
#: gRPC servers that need no STOP_PING_TIMEOUT: file -> why (a probe's call is over in milliseconds)
NO_STOP_PING = {"raftgate/observe.py": "the --health-addr server: kubelet's and Prometheus' probes"}


def _servers_and_ports() -> Iterator[tuple[str, ast.Call]]:
    for package in PRODUCT:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    yield str(path.relative_to(REPO_ROOT)), node


def test_every_listen_address_goes_through_grpc_listen() -> None:
    direct = [f"{where}:{call.lineno}" for where, call in _servers_and_ports()
              if call.func.attr in ("add_insecure_port", "add_secure_port")  # type: ignore[attr-defined]
              and where != "raftgate/grpc_listen.py"]
    assert not direct, f"a listen address added without grpc_listen.bind (in use is not refused): {direct}"


def test_every_grpc_server_sets_reuseport_and_bounds_its_graceful_stop() -> None:
    servers = [(where, call) for where, call in _servers_and_ports()
               if call.func.attr == "server" and ast.unparse(call.func) == "grpc.aio.server"]  # type: ignore[attr-defined]
    assert len(servers) >= 4, servers  # the proxy's, the store's internal and peer servers, health
    for where, call in servers:
        options = next((ast.unparse(k.value) for k in call.keywords if k.arg == "options"), "")
        assert "grpc.so_reuseport" in options, f"{where}:{call.lineno}: no grpc.so_reuseport"
        if where not in NO_STOP_PING:
            assert "STOP_PING_TIMEOUT" in options, f"{where}:{call.lineno}: a client can hold its stop 20 s"
