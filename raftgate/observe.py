"""The side servers both programs run for Kubernetes: Prometheus ``/metrics`` and a plaintext health port.

Why a separate health port: the main ports use mTLS (store) or may be Unix sockets (proxy), and
kubelet's gRPC probe speaks neither. ``--health-addr`` serves only ``grpc.health.v1`` (plus
reflection) in plaintext, sharing the main server's HealthServicer, so both report the same status:
SERVING once the program serves, NOT_SERVING from the moment it starts shutting down.

``--metrics-addr`` serves the process's Prometheus registry over HTTP from prometheus_client's
own daemon thread, so a scrape never touches the event loop. Both are off unless given, and bind
only the address given. Shared by store and proxy, so it lives in neither.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.registry import CollectorRegistry

from raftgate import grpc_listen

log = logging.getLogger("raftgate.observe")

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
_ADDR = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.\-]+)):(?P<port>[0-9]{1,5})")


@dataclass(frozen=True)
class ListenAddr:
    host: str
    port: int

    def __str__(self) -> str:
        return grpc_listen.host_port(self.host, self.port)


@dataclass(frozen=True)
class ObserveConfig:
    metrics_addr: ListenAddr | None = None
    health_addr: ListenAddr | None = None


def parse_listen_addr(flag: str, text: str | None) -> ListenAddr | None:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> ListenAddr; empty -> None (off); raises ValueError."""
    text = (text or "").strip()
    if not text:
        return None
    match = _ADDR.fullmatch(text)
    if not match or int(match["port"]) > 65535:
        raise ValueError(f"{flag}: {text!r} is not HOST:PORT (IPv6 as [ADDR]:PORT)")
    host = match["v6"] or match["host"]
    if match["v6"]:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{flag}: {host!r} is not an IPv6 address") from None
    return ListenAddr(host, int(match["port"]))


def add_observe_flags(parser: argparse.ArgumentParser) -> None:
    """Adds ``--metrics-addr`` and ``--health-addr`` (both off by default)."""
    parser.add_argument("--metrics-addr", default=None,
                        help="HOST:PORT to serve Prometheus metrics on at /metrics over HTTP (default: off)")
    parser.add_argument("--health-addr", default=None,
                        help="HOST:PORT for a plaintext gRPC server with only grpc.health.v1 and reflection, "
                             "for kubelet probes (default: off)")


def observe_config(args: argparse.Namespace, error: Callable[[str], Exception] = ValueError,
                   sources: Mapping[str, str] | None = None) -> ObserveConfig:
    """The two flags of ``add_observe_flags`` -> ObserveConfig; a bad value raises ``error(message)``
    naming the flag, or what ``sources`` says it came from (dest -> e.g. an environment variable)."""
    names = {"metrics_addr": "--metrics-addr", "health_addr": "--health-addr", **(sources or {})}
    try:
        metrics = parse_listen_addr(names["metrics_addr"], args.metrics_addr)
        health_addr = parse_listen_addr(names["health_addr"], args.health_addr)
    except ValueError as exc:
        raise error(str(exc)) from None
    if metrics and health_addr and metrics == health_addr and metrics.port != 0:
        raise error(f"{names['metrics_addr']} and {names['health_addr']} must differ")
    return ObserveConfig(metrics, health_addr)


class Observability:
    """The running side servers; ``begin_shutdown`` flips health to NOT_SERVING, ``close`` stops them."""

    def __init__(self, health_servicer: health.aio.HealthServicer) -> None:
        self.health = health_servicer
        self.metrics_address: str | None = None
        self.health_address: str | None = None
        self._httpd: WSGIServer | None = None
        self._thread: Thread | None = None
        self._grpc: grpc.aio.Server | None = None

    async def begin_shutdown(self) -> None:
        """Every service NOT_SERVING (and stays so): probes see the program going before it is gone."""
        await self.health.enter_graceful_shutdown()

    async def close(self, grace: float = 1.0) -> None:
        await self.begin_shutdown()
        if self._grpc is not None:
            await self._grpc.stop(grace)
            self._grpc = None
        if self._httpd is not None:
            httpd, self._httpd = self._httpd, None
            # shutdown() waits for serve_forever's poll loop (up to 0.5 s): not on the event loop.
            await asyncio.get_running_loop().run_in_executor(None, httpd.shutdown)
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


async def start_observability(
    config: ObserveConfig,
    health_servicer: health.aio.HealthServicer | None = None,
    *,
    registry: CollectorRegistry = REGISTRY,
    documents: Mapping[str, Callable[[], bytes | None]] | None = None,
) -> Observability:
    """Starts what ``config`` asks for; raises OSError naming the flag if an address cannot be bound.

    Pass the main server's HealthServicer so the health port reports the main port's status.
    ``documents``: more paths on the metrics port, each a JSON document made on request (None: 404),
    e.g. the proxy's ``/.well-known/jwks.json``.
    """
    obs = Observability(health_servicer or health.aio.HealthServicer())
    try:
        if config.metrics_addr is not None:
            obs.metrics_address = _start_metrics(obs, config.metrics_addr, registry)
            if documents:
                assert obs._httpd is not None
                obs._httpd.set_app(_with_documents(obs._httpd.get_app(), dict(documents)))
            log.info("serving Prometheus metrics on http://%s/metrics", obs.metrics_address)
        if config.health_addr is not None:
            obs.health_address = await _start_health(obs, config.health_addr)
            log.info("serving grpc.health.v1 (plaintext) on %s", obs.health_address)
    except BaseException:
        await obs.close(0)
        raise
    return obs


def _start_metrics(obs: Observability, addr: ListenAddr, registry: CollectorRegistry) -> str:
    try:
        obs._httpd, obs._thread = start_http_server(addr.port, addr=addr.host, registry=registry)
    except OSError as exc:
        raise OSError(f"--metrics-addr: cannot listen on {addr}: {exc.strerror or exc}") from None
    port = obs._httpd.server_address[1]
    return str(ListenAddr(addr.host, int(port)))


def _with_documents(app: Callable[..., Iterable[bytes]], documents: dict[str, Callable[[], bytes | None]]
                    ) -> Callable[..., Iterable[bytes]]:
    """prometheus_client's WSGI app, with ``documents`` answered first (GET/HEAD, JSON)."""

    def dispatch(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        make = documents.get(environ.get("PATH_INFO", ""))
        if make is None:
            return app(environ, start_response)
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Length", "0")])
            return [b""]
        try:
            body = make()
        except Exception:  # a bug in one document must not take the metrics server down
            log.exception("cannot make %s", environ.get("PATH_INFO"))
            start_response("500 Internal Server Error", [("Content-Length", "0")])
            return [b""]
        if body is None:
            start_response("404 Not Found", [("Content-Type", "text/plain"), ("Content-Length", "10")])
            return [b"not found\n"]
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    return dispatch


async def _start_health(obs: Observability, addr: ListenAddr) -> str:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])  # a port in use fails, never is shared
    health_pb2_grpc.add_HealthServicer_to_server(obs.health, server)
    reflection.enable_server_reflection((HEALTH_SERVICE, reflection.SERVICE_NAME), server)
    port = grpc_listen.bind(server, str(addr))
    if not port:
        raise OSError(f"--health-addr: cannot listen on {addr}: the port is in use or the address is not available "
                      "here")
    obs._grpc = server
    await server.start()
    return str(ListenAddr(addr.host, port))

