"""Adding a listen address to a gRPC server so that one in use is refused, never shared or taken.

``grpc.so_reuseport`` off is not enough on its own: gRPC binds every address a host name resolves
to and is content when one of them binds (``localhost:P`` with 127.0.0.1:P held by another server
serves on [::1] alone, and clients of 127.0.0.1:P reach the other server), and for a ``unix:``
address it unlinks whatever socket file is there and binds anew (the server already listening on
it loses its clients to this one, and the file when this one stops). So before gRPC binds, every
address the host resolves to is tried, and a socket file is connected to: in use is refused.
A socket file nobody listens on (left by a server that was killed) is taken over, as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

import grpc

UNIX_PREFIXES = ("unix://", "unix:")


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC takes it: an IPv6 literal in brackets (URLs give it without)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def in_use(address: str) -> bool:
    """Whether a server listens at ``address`` (a gRPC listen address) already."""
    for prefix in UNIX_PREFIXES:
        if address.startswith(prefix):
            return _socket_file_answers(address[len(prefix):])
    if address.startswith("unix-abstract:"):
        return False  # the kernel refuses a second bind of an abstract name itself
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return False  # not ours to judge: gRPC refuses it, or picks a free port
    name = host.strip("[]")
    try:
        infos = socket.getaddrinfo(name or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return False  # gRPC cannot resolve it either, and says so
    addresses = [(family, sockaddr) for family, _, _, _, sockaddr in infos]
    if name.lower() == "localhost":
        # gRPC's resolver gives both loopbacks for it (RFC 6761), whatever /etc/hosts says
        addresses += [(socket.AF_INET, ("127.0.0.1", int(port))), (socket.AF_INET6, ("::1", int(port)))]
    return any(_port_taken(family, sockaddr) for family, sockaddr in addresses)


def _port_taken(family: int, sockaddr: tuple[object, ...]) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: TIME_WAIT is free
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE  # another error (no IPv6 here) is gRPC's to skip
    return False


def _socket_file_answers(path: str) -> bool:
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False  # not a socket (or absent): gRPC's bind fails or creates it
    except OSError:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, contextlib.suppress(OSError):
        probe.connect(path)
        return True
    return False  # a socket file nobody listens on


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None = None, *,
         shared: bool = False) -> int:
    """Adds ``address`` to ``server``; the port bound, 0 when it is in use or cannot be bound (each
    caller says so in its own words, naming its flag). ``shared``: the server shares the port on
    purpose (``grpc.so_reuseport`` on, the workers of ``raftgate proxy --workers N``, whose
    supervisor checked it was free), so its siblings holding it is no refusal."""
    if not shared and in_use(address):
        return 0
    try:
        if credentials is not None:
            return server.add_secure_port(address, credentials)
        return server.add_insecure_port(address)
    except RuntimeError:  # grpc reports a failed bind this way
        return 0
