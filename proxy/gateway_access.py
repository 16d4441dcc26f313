"""Who may drive the JSON gateway, and how long a connection may hold a descriptor doing nothing.

A web page can send requests to a gateway it can reach (a developer's ``raftgate local`` on
127.0.0.1, a gateway on the office network): cross-origin requests, and with DNS rebinding
same-origin requests under the page's own name, which the browser then sends with ``Host: <that
name>``. With auth off every request is root's, so the gateway answers browsers only where told to:

- ``--cors`` (etcd's flag): the origins whose pages may call it, or ``*`` (etcd's default). Unlike
  etcd, a request that carries an ``Origin`` header not listed is refused (403): CORS only hides an
  answer from the page, and a simple cross-origin POST (``text/plain``) would still write.
- ``--host-whitelist`` (etcd's flag): the names a ``Host`` header may carry (any port), or ``*``
  (etcd's default). Not given, the proxy answers ``localhost`` and IP addresses only: a rebinding
  page needs a name it controls, and an address is none. ``raftgate local`` passes loopback only.

Both flags are parsed here; proxy/gateway.py enforces them with the limits below.
"""

from __future__ import annotations

import ipaddress
import resource
from dataclasses import dataclass
from urllib.parse import urlsplit

STAR = "*"
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0
#: an idle keep-alive connection between requests (aiohttp's keepalive_timeout)
IDLE_TIMEOUT = 120.0
DEFAULT_MAX_CONNECTIONS = 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


class AccessError(ValueError):
    """A bad --cors or --host-whitelist value (the message names no flag; the caller adds it)."""


@dataclass(frozen=True)
class Access:
    #: --cors: allowed origins, normalized (``origin_key``); ``*`` allows every origin; empty: none
    origins: frozenset[str] = frozenset()
    #: --host-whitelist: allowed host names, normalized (``hostname``); ``*`` every name; None:
    #: ``localhost``, any IP address and no Host at all (the proxy's default)
    hosts: frozenset[str] | None = None

    @property
    def any_origin(self) -> bool:
        return STAR in self.origins

    def origin_allowed(self, origin: str) -> bool:
        return self.any_origin or origin_key(origin) in self.origins

    def host_allowed(self, host_header: str) -> bool:
        """Whether a request's ``Host`` header names this gateway (its port is not compared)."""
        if self.hosts is not None and STAR in self.hosts:
            return True
        name = hostname(host_header)
        if self.hosts is not None:
            return name in self.hosts
        # no Host at all (an HTTP/1.0 client) is no browser's request either
        return name in ("", "localhost") or _is_address(name)


@dataclass(frozen=True)
class Limits:
    #: from a connection's start (or a request's first byte) until its header is complete
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    #: a unary request's whole body, and a stream's first request (the stream itself: none)
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    idle_timeout: float = IDLE_TIMEOUT
    #: open gateway connections; one more evicts the oldest that is not in a request, else is refused
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def default_max_connections() -> int:
    """At most half the process's descriptors: the rest stay for the gRPC port and the store."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


def hostname(host_header: str) -> str:
    """The name in a ``Host`` header, port and IPv6 brackets cut, lower case (as Go's
    net.SplitHostPort reads it, which etcd compares; a value it cannot split is kept whole)."""
    value = host_header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1:] if end > 0 else "x"
        if rest == "" or (rest.startswith(":") and rest[1:].isdigit()):
            return value[1:end]
        return value
    if value.count(":") == 1:
        name, _, port = value.partition(":")
        return name if port == "" or port.isdigit() else value
    return value


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def origin_key(origin: str) -> str:
    """An origin compared as browsers write it: scheme and host lower case, the default port
    left out (``https://a.example:443`` is ``https://a.example``). Not an origin: ""."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return ""
    scheme, host = parts.scheme.lower(), (parts.hostname or "")
    if not scheme or not host or parts.username is not None or parts.password is not None \
            or parts.path not in ("", "/") or parts.query or parts.fragment:
        return ""
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}" if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{scheme}://{host}:{port}"


def parse_origins(text: str) -> frozenset[str]:
    """--cors: ``*``, or a comma list of origins (``https://app.example[:port]``)."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise AccessError("is empty: leave it out for no cross-origin access, or give '*' for every origin "
                          "(what etcd's empty value means)")
    out: set[str] = set()
    for item in items:
        if item == STAR:
            out.add(STAR)
            continue
        key = origin_key(item)
        if not key or item.endswith("/"):
            raise AccessError(f"{item!r} is not an origin: scheme://host[:port], without a path (as a browser "
                              "sends it in its Origin header), or '*'")
        out.add(key)
    return frozenset(out)


def parse_hosts(text: str) -> frozenset[str]:
    """--host-whitelist: ``*``, or a comma list of host names or addresses (no port)."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise AccessError("is empty: give the names clients use, or '*' for every name (what etcd's empty "
                          "value means)")
    out: set[str] = set()
    for item in items:
        if item == STAR:
            out.add(STAR)
            continue
        name = item.lower()
        if name.startswith("[") and name.endswith("]"):
            name = name[1:-1]
        if not name or any(ch.isspace() or ch in "/@?#" for ch in name) or (":" in name and not _is_address(name)):
            raise AccessError(f"{item!r} is not a host name: a name or an address without a port (every port "
                              "is accepted), or '*'")
        out.add(name)
    return frozenset(out)
