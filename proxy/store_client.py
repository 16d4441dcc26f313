"""The proxy's connection to the store's internal service (raftgate.storepb.Store).

Do and Snapshot move raw bytes (no (de)serialization: the proxy builds and unwraps them by
slicing); Credentials and ResolveToken are small typed calls. Every call carries the internal
credential: mTLS on the channel and/or the shared-secret metadata.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import grpc.aio

from protos.storepb import store_pb2

SECRET_METADATA_KEY = "x-raftgate-internal-secret"
_SERVICE = "/raftgate.storepb.Store/"
# The store is trusted; its answers (ranges, snapshots) may be large.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.max_send_message_length", 2**31 - 1),
]


@dataclass(frozen=True)
class InternalTLS:
    ca: bytes
    cert: bytes
    key: bytes


class StoreClient:
    def __init__(self, target: str, *, secret: str | None = None, tls: InternalTLS | None = None) -> None:
        if tls is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
            )
            self._channel = grpc.aio.secure_channel(target, creds, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._metadata: tuple[tuple[str, str], ...] = ((SECRET_METADATA_KEY, secret),) if secret else ()
        ch = self._channel
        self._do = ch.unary_unary(_SERVICE + "Do")
        self._snapshot = ch.unary_stream(_SERVICE + "Snapshot")
        self._credentials = ch.unary_unary(
            _SERVICE + "Credentials",
            request_serializer=store_pb2.CredentialsRequest.SerializeToString,
            response_deserializer=store_pb2.CredentialsResponse.FromString,
        )
        self._resolve = ch.unary_unary(
            _SERVICE + "ResolveToken",
            request_serializer=store_pb2.ResolveTokenRequest.SerializeToString,
            response_deserializer=store_pb2.ResolveTokenResponse.FromString,
        )

    async def do(self, internal_request: bytes, timeout: float | None = None) -> bytes:
        """InternalRaftRequest bytes -> InternalResponse bytes; store errors raise AioRpcError."""
        return await self._do(internal_request, timeout=timeout, metadata=self._metadata)

    def snapshot(self, internal_request: bytes, timeout: float | None = None) -> AsyncIterator[bytes]:
        """The raw SnapshotResponse messages of Store.Snapshot."""
        return self._snapshot(internal_request, timeout=timeout, metadata=self._metadata)

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        return await self._credentials(
            store_pb2.CredentialsRequest(name=name), timeout=timeout, metadata=self._metadata
        )

    async def resolve_token(self, token: str, timeout: float | None = None) -> store_pb2.ResolveTokenResponse:
        req = store_pb2.ResolveTokenRequest(token=token)
        return await self._resolve(req, timeout=timeout, metadata=self._metadata)

    async def close(self) -> None:
        await self._channel.close()
