"""Assembles the proxy: store client, token providers, bcrypt pool, pipeline, and the gRPC servers
serving the etcd v3 services plus grpc.health.v1 and reflection on the client ports; and the
optional side servers (``--metrics-addr``, ``--health-addr``).

In sidecar identity mode the local listeners (loopback, unix://) get their own gRPC server whose
pipeline lends the identity; every other listener is served without it, so the identity never
reaches the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from protos.internal import MAX_ANSWER_BYTES
from proxy.audit.writer import AuditLog
from proxy.authenticate import Authenticator
from proxy.config import ProxyConfig
from proxy.identity import Resolver
from proxy.identity_file import IdentityFiles
from proxy.passwords import PasswordHasher
from proxy.pipeline import Pipeline
from proxy.services import etcd_handlers
from proxy.sidecar import Sidecar, is_local_listener
from proxy.store_client import StoreClient
from proxy.tls import ServerTLS, revocation_list
from proxy.tokens.simple import SimpleTokenCache
from raftgate import grpc_listen
from raftgate.auth_token import SIMPLE
from raftgate.crl import RevocationCheck
from raftgate.jwt_keys import JWKS_PATH
from raftgate.methods import ETCD_PACKAGE, SERVICES
from raftgate.observe import Observability, start_observability
from raftgate.stop_signals import STOP_PING_TIMEOUT

if TYPE_CHECKING:
    from proxy.gateway import Gateway

METADATA_LIMIT = 1 << 20

log = logging.getLogger(__name__)


class ProxyServer:
    def __init__(self, config: ProxyConfig, *, reuse_port: bool = False) -> None:
        """``reuse_port``: only for a worker of ``--workers N`` (proxy/workers.py), whose client port is
        shared on purpose with its siblings; everywhere else a port in use is an error."""
        self.config = config
        self.reuse_port = reuse_port
        self.store = StoreClient(config.store_endpoints, secret=config.internal_secret, tls=config.internal_tls,
                                 member=config.member_store_endpoint, spread_reads=config.spread_reads)
        self.hasher = PasswordHasher(config.bcrypt_cost, config.bcrypt_workers, config.bcrypt_queue_limit)
        simple = config.auth_token.kind == SIMPLE
        self.resolver = Resolver(
            self.store, jwt=config.jwt, simple=SimpleTokenCache(config.auth_token_ttl) if simple else None,
            workload=config.workload,
            sidecar=config.sidecar,
        )
        self.authenticator = Authenticator(
            self.store, self.hasher, jwt=config.jwt, simple_ttl_seconds=config.auth_token_ttl if simple else None,
            rate_limit=config.auth_rate_limit,
            sidecar=config.sidecar,
        )
        self.audit = AuditLog(config.audit_log, config.audit_level, fail_closed=config.audit_fail_closed) \
            if config.audit_log is not None else None
        cert_auth = config.client_tls is not None and config.client_tls.client_cert_auth
        self.pipeline = Pipeline(
            self.store, self.resolver, self.authenticator, self.hasher, max_request_bytes=config.max_request_bytes,
            audit_log=self.audit, client_cert_auth=cert_auth,
        )
        #: the https:// client URLs' credentials, re-reading the files when they change
        self.tls = ServerTLS(config.client_tls) if config.client_tls is not None and config.tls_listen else None
        #: --client-crl-file: every call of a listed client certificate refused (raftgate/crl.py)
        self.crl = revocation_list(config.client_tls) if self.tls is not None and config.client_tls else None
        self.sidecar: Sidecar | None = None
        if config.identity is not None:
            files = IdentityFiles(config.identity.kind, config.identity.path)
            self.sidecar = Sidecar(files, self.authenticator, None if config.sidecar else config.jwt)
        self.health = HealthServicer()
        self._service_names = [f"{ETCD_PACKAGE}.{s}" for s in SERVICES]
        # (server, its listen addresses); the lending one first when there is one.
        self._servers: list[tuple[grpc.aio.Server, list[str]]] = []
        local = [a for a in config.listen if is_local_listener(a)] if self.sidecar else []
        others = [a for a in config.listen if a not in local]
        if local:
            lending = Pipeline(
                self.store, self.resolver, self.authenticator, self.hasher,
                max_request_bytes=config.max_request_bytes, sidecar=self.sidecar, audit_log=self.audit,
                client_cert_auth=cert_auth,
            )
            self._servers.append((self._grpc_server(lending), local))
        if others:
            self._servers.append((self._grpc_server(self.pipeline), others))
        self.observability: Observability | None = None
        self._jwks_task: asyncio.Task[None] | None = None
        self.addresses: list[str] = []
        # The JSON gateway calls the same handlers (never the lending pipeline: no identity over HTTP).
        self.gateway: Gateway | None = _gateway(self.pipeline, self.store, config) if config.listen_gateway else None

    def _grpc_server(self, pipeline: Pipeline) -> grpc.aio.Server:
        server = grpc.aio.server(
            interceptors=[RevocationCheck(self.crl)] if self.crl is not None else None,
            options=[
                # Above etcd's limit, so that the handlers refuse up to twice it with grpc-go's words
                # (services._bounded); grpc-core's own (differently worded) refusal only beyond.
                ("grpc.max_receive_message_length", 2 * self.config.grpc_max_receive_bytes),
                ("grpc.max_send_message_length", MAX_ANSWER_BYTES),  # etcd's (math.MaxInt32)
                # grpc-core refuses metadata between its soft limit (8 KiB) and hard limit at
                # random; etcd accepts large tokens, so both limits sit well above any real token.
                ("grpc.max_metadata_size", METADATA_LIMIT),
                ("grpc.absolute_max_metadata_size", METADATA_LIMIT),
                # gRPC-Python shares a port in use (SO_REUSEPORT); a second server there must fail instead,
                # except among the workers of one --workers N proxy (the supervisor checked it was free).
                ("grpc.so_reuseport", 1 if self.reuse_port else 0),
                STOP_PING_TIMEOUT,  # a client that stopped reading cannot hold a graceful stop
            ]
        )
        server.add_generic_rpc_handlers(etcd_handlers(pipeline, self.config.grpc_max_receive_bytes))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [*self._service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            server,
        )
        return server

    async def start(self) -> list[str]:
        """Binds every listen address and starts serving; returns the bound addresses (real ports).
        An audit log that cannot be opened stops it first (an OSError naming the flag)."""
        if self.audit is not None:
            self.audit.start()
        self.store.start()
        for server, listen in self._servers:
            for address in listen:
                tls = self.tls if address in self.config.tls_listen else None
                self.addresses.append(_bind(server, address, tls, shared=self.reuse_port))
        for server, _ in self._servers:
            await server.start()
        if self.gateway is not None:
            await self.gateway.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ["", *self._service_names]:
            await self.health.set(name, serving)
        jwt = self.config.jwt
        if jwt is not None and jwt.follower is not None:
            await jwt.follower.refresh()  # bounded: a signer that is not up yet is retried periodically
            self._jwks_task = asyncio.get_running_loop().create_task(jwt.follower.run())
        self.observability = await start_observability(self.config.observe, self.health,
                                                       documents={JWKS_PATH: self._jwks_document})
        if self.sidecar is not None and self._servers:
            lent_on = ", ".join(self._servers[0][1])
            log.info("sidecar identity mode: token-less local requests on %s are sent as the configured identity",
                     lent_on)
        return self.addresses

    async def stop(self, grace: float | None = 5.0) -> None:
        """NOT_SERVING first (probes see the proxy going), then the client ports, then the side servers."""
        await self.health.enter_graceful_shutdown()
        if self.gateway is not None:
            await self.gateway.stop()
        for server, _ in self._servers:
            await server.stop(grace)
        if self._jwks_task is not None:
            self._jwks_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._jwks_task
            self._jwks_task = None
        if self.observability is not None:
            await self.observability.close()
        await self.store.close()
        self.hasher.close()
        if self.audit is not None:  # after the servers: the last calls' records are written too
            await asyncio.to_thread(self.audit.close)

    def _jwks_document(self) -> bytes | None:
        """The JWT public keys for verify-only proxies (``jwks-url``); 404 without JWT or with HMAC."""
        return None if self.config.jwt is None else self.config.jwt.jwks_document()

    async def wait(self) -> None:
        for server, _ in self._servers:
            await server.wait_for_termination()


def _bind(server: grpc.aio.Server, address: str, tls: ServerTLS | None = None, *, shared: bool = False) -> str:
    """Adds one listen address (TLS with ``tls``); returns it with the real port. ``shared``: a
    worker of ``--workers N``, whose siblings listen there too."""
    port = grpc_listen.bind(server, address, tls.credentials() if tls else None, shared=shared)
    if address.startswith("unix:"):
        if not port:
            raise OSError(f"cannot listen on {address}: the socket is in use or cannot be created")
        return address
    if port == 0:
        raise OSError(f"cannot listen on {address}: the port is in use or the address is not available here")
    host = address.rsplit(":", 1)[0]
    return f"{host}:{port}"


def _gateway(pipeline: Pipeline, store: StoreClient, config: ProxyConfig) -> Gateway:
    """The JSON gateway, imported only when it is served: its HTTP stack (aiohttp) is most of a
    proxy's import time, paid at every start of a sidecar otherwise."""
    from proxy.gateway import Gateway
    from proxy.gateway_health import PipelineStore

    return Gateway(pipeline, config.listen_gateway, max_message_bytes=config.grpc_max_receive_bytes,
                   access=config.gateway_access, limits=config.gateway_limits,
                   members=store, health=PipelineStore(pipeline))

