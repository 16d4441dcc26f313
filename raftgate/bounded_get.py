"""One HTTP GET bounded in bytes and in total time (key documents: a JWKS, OIDC discovery).

A socket timeout bounds each read, not the answer: a server that trickles its answer a byte at a
time, just inside the timeout, holds a urllib fetch (and its thread) as long as it likes. Here a
watchdog shuts the connection at the deadline, whatever phase the GET is in. No proxy from the
environment, no redirects (a 3xx is an answer like any other status: the caller refuses it).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
from urllib.parse import urlsplit


class GetError(OSError):
    """The GET failed or took too long; the message names the URL, never a body."""


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """The TLS context key documents are fetched with: the system CAs, or only ``ca_file``'s;
    raises OSError or ssl.SSLError for a CA file that cannot be used."""
    return ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()


def get(url: str, context: ssl.SSLContext | None, *, timeout: float, max_bytes: int,
        accept: str = "application/json") -> tuple[int, bytes]:
    """(status, body) of ``GET url`` within ``timeout`` seconds overall; the body of a 200 only,
    at most ``max_bytes + 1`` bytes of it (the caller refuses more); raises GetError."""
    parts = urlsplit(url)
    try:
        if parts.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=timeout,
                context=context if context is not None else tls_context())
        elif parts.scheme == "http":
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        else:
            raise GetError(f"GET {url}: not an http:// or https:// URL")
    except ValueError as e:  # a bad port
        raise GetError(f"GET {url}: {e}") from None
    expired = threading.Event()
    #: the connected socket: http.client lets go of ``conn.sock`` once a response that ends with
    #: the connection is under way (the response reads from it then)
    connected: list[socket.socket] = []

    def shut() -> None:
        expired.set()
        sock = conn.sock or (connected[0] if connected else None)
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # wakes a blocked read

    watchdog = threading.Timer(timeout, shut)
    watchdog.daemon = True
    watchdog.start()
    try:
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.connect()
        if conn.sock is not None:
            connected.append(conn.sock)
        if expired.is_set():  # the watchdog fired before the socket was kept
            raise TimeoutError
        conn.request("GET", path, headers={"Accept": accept})
        response = conn.getresponse()
        status = response.status
        data = response.read(max_bytes + 1) if status == 200 else b""
    except (OSError, http.client.HTTPException, ValueError) as e:
        if expired.is_set():
            raise GetError(f"GET {url}: no whole answer within {timeout} s") from None
        raise GetError(f"GET {url}: {e}") from None
    finally:
        watchdog.cancel()
        conn.close()
    if expired.is_set():
        raise GetError(f"GET {url}: no whole answer within {timeout} s")
    return status, data
