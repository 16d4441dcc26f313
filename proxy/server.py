"""Assembles the proxy: store client, token providers, bcrypt pool, pipeline, and the gRPC server
serving the etcd v3 services plus grpc.health.v1 and reflection on the client port."""

from __future__ import annotations

import logging

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from proxy.authenticate import Authenticator
from proxy.config import ProxyConfig
from proxy.identity import Resolver
from proxy.methods import ETCD_PACKAGE, SERVICES
from proxy.passwords import PasswordHasher
from proxy.pipeline import Pipeline
from proxy.services import etcd_handlers
from proxy.store_client import StoreClient
from proxy.tokens.options import SIMPLE
from proxy.tokens.simple import SimpleTokenCache

METADATA_LIMIT = 1 << 20

log = logging.getLogger(__name__)


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.store = StoreClient(config.store_target, secret=config.internal_secret, tls=config.internal_tls)
        self.hasher = PasswordHasher(config.bcrypt_cost, config.bcrypt_workers)
        simple = config.auth_token.kind == SIMPLE
        self.resolver = Resolver(
            self.store, jwt=config.jwt, simple=SimpleTokenCache(config.auth_token_ttl) if simple else None
        )
        self.authenticator = Authenticator(
            self.store, self.hasher, jwt=config.jwt, simple_ttl_seconds=config.auth_token_ttl if simple else None
        )
        self.pipeline = Pipeline(
            self.store, self.resolver, self.authenticator, self.hasher, max_request_bytes=config.max_request_bytes
        )
        self.health = HealthServicer()
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.grpc_max_receive_bytes),
                ("grpc.max_send_message_length", 2**31 - 1),
                # grpc-core refuses metadata between its soft limit (8 KiB) and hard limit at
                # random; etcd accepts large tokens, so both limits sit well above any real token.
                ("grpc.max_metadata_size", METADATA_LIMIT),
                ("grpc.absolute_max_metadata_size", METADATA_LIMIT),
            ]
        )
        self.server.add_generic_rpc_handlers(etcd_handlers(self.pipeline))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [f"{ETCD_PACKAGE}.{s}" for s in SERVICES]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], self.server
        )
        self._service_names = names
        self.addresses: list[str] = []

    async def start(self) -> list[str]:
        """Binds every listen address and starts serving; returns the bound addresses (real ports)."""
        for address in self.config.listen:
            try:
                port = self.server.add_insecure_port(address)
            except RuntimeError as e:  # grpc reports a failed bind this way
                raise OSError(f"cannot listen on {address}: {e}") from None
            if address.startswith("unix:"):
                self.addresses.append(address)
            else:
                if port == 0:
                    raise OSError(f"cannot listen on {address}")
                host = address.rsplit(":", 1)[0]
                self.addresses.append(f"{host}:{port}")
        await self.server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        for name in ["", *self._service_names]:
            await self.health.set(name, serving)
        return self.addresses

    async def stop(self, grace: float | None = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        await self.store.close()
        self.hasher.close()

    async def wait(self) -> None:
        await self.server.wait_for_termination()
