"""The request pipeline, top to bottom: extract the token -> resolve it -> stamp the header ->
forward to the store -> map the answer.

Each step is a small function. The proxy never decides a permission: it only refuses early where
the store would surely refuse too (an unusable token, a request over --max-request-bytes).
Store errors reach the client with the store's code and message unchanged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from protos import wire
from protos.etcdserverpb import rpc_pb2
from proxy import metrics
from proxy.audit import handlers as audit
from proxy.audit.writer import AuditLog
from proxy.authenticate import Authenticator
from proxy.identity import Identity, Resolver
from proxy.passwords import BCRYPT_MAX_BYTES, PasswordHasher, peer_host
from proxy.sidecar import REFRESH_ON, Sidecar, is_local_peer
from proxy.store_client import StoreClient
from proxy.tls import common_name
from proxy.tokens.extract import extract_token
from proxy.watch import WatchProxy
from raftgate.errors import STREAM_UNMARSHAL_ERROR_PREFIX, UNMARSHAL_ERROR_PREFIX, Err, EtcdError, from_message
from raftgate.methods import Method

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext
RANGE_STREAM_FIELD = 1  # RangeStreamResponse.range_response
#: metadata etcd's own gRPC gateway sets: etcd never takes such a request's identity from the
#: connection's certificate (the gateway's certificate is not the caller's)
GATEWAY_ACCEPT_KEY = "grpcgateway-accept"


class MalformedRequest(ValueError):
    """A request the proxy must parse (Authenticate, UserAdd, UserChangePassword, a streaming
    call's messages) does not decode.

    The message is protobuf's reason (it names the message type, never the client's bytes).
    ``streaming`` selects grpc-go's wording for a streaming call.
    """

    def __init__(self, reason: str, *, streaming: bool = False) -> None:
        super().__init__(reason)
        self.streaming = streaming


# --- the steps ----------------------------------------------------------------------------------


def check_size(data: bytes, limit: int) -> None:
    """etcd refuses an entry bigger than --max-request-bytes before it reaches consensus."""
    if len(data) > limit:
        raise EtcdError(Err.REQUEST_TOO_LARGE)


@functools.lru_cache(maxsize=4096)
def _header(username: str, revision: int, invalid_token: bool, simple_token: bool) -> bytes:
    """The stamped header field: the same bytes for every request of one identity at one auth
    revision, so encoded once (bounded: the least recently used goes first)."""
    return wire.encode_header(username, revision, invalid_token=invalid_token, simple_token=simple_token)


@functools.lru_cache(maxsize=256)
def _tag(field: int) -> bytes:
    """The key of a request's field in InternalRaftRequest (one per method)."""
    return wire.encode_varint((field << 3) | 2)


def unwrap(answer: bytes, field: int) -> bytes:
    """``wire.unwrap_field(answer, field)``, without walking the usual answer: exactly one field,
    the one asked for (anything else goes the reference way)."""
    tag = _tag(field)
    start = len(tag)
    if answer.startswith(tag) and len(answer) > start:
        size = answer[start]
        if size < 0x80:
            start += 1
        else:
            try:
                size, start = wire.decode_varint(answer, start)
            except wire.WireError:
                return wire.unwrap_field(answer, field)
        if start + size == len(answer):
            return answer[start:]
    return wire.unwrap_field(answer, field)


def stamp(identity: Identity, method: Method, request: bytes) -> bytes:
    """InternalRaftRequest bytes: the stamped header (cached per identity), then the client's
    bytes as they came."""
    header = _header(identity.username, identity.revision, identity.invalid_token, identity.reresolvable)
    return wire.build_internal_request(header, method.field, request)


def is_old_revision(error: grpc.aio.AioRpcError) -> bool:
    return error.code() == Err.AUTH_OLD_REVISION.code and from_message(error.details() or "") is Err.AUTH_OLD_REVISION


def refresh_reason(error: BaseException) -> metrics.RefreshReason | None:
    """Why a lent identity needs a new token after this refusal, or None if it does not."""
    if isinstance(error, EtcdError):
        return REFRESH_ON.get(error.err)
    if isinstance(error, grpc.aio.AioRpcError):
        err = from_message(error.details() or "")
        if err is not None and err.code == error.code():
            return REFRESH_ON.get(err)
    return None


def timeout_of(context: Context) -> float | None:
    """The client's remaining deadline, passed on to the store call."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e9 else None


async def abort_with(context: Context, error: BaseException) -> NoReturn:
    """Maps a failure to the client's status: etcd errors and store errors keep code and message."""
    if isinstance(error, EtcdError):
        await context.abort(error.code, error.message)
    if isinstance(error, grpc.aio.AioRpcError):
        await context.abort(error.code(), error.details() or "")
    if isinstance(error, wire.WireError):
        log.error("unexpected answer from the store: %s", error)
        await context.abort(grpc.StatusCode.INTERNAL, "raftgate: unexpected answer from the store")
    if isinstance(error, MalformedRequest):
        # grpc-go's wording for a request that does not unmarshal, with the decoder's reason
        prefix = STREAM_UNMARSHAL_ERROR_PREFIX if error.streaming else UNMARSHAL_ERROR_PREFIX
        await context.abort(grpc.StatusCode.INTERNAL, prefix + str(error))
    raise error


HANDLED = (EtcdError, grpc.aio.AioRpcError, wire.WireError, MalformedRequest)
#: store answers after which a keep-alive (idempotent) is sent again, and how many sends at most
KEEPALIVE_RETRY = frozenset({Err.TIMEOUT, Err.TIMEOUT_DUE_TO_LEADER_FAIL, Err.LEADER_CHANGED, Err.NOT_LEADER,
                             Err.NO_LEADER})
KEEPALIVE_ATTEMPTS = 3


# --- the pipeline -------------------------------------------------------------------------------


class Pipeline:
    def __init__(
        self,
        store: StoreClient,
        resolver: Resolver,
        authenticator: Authenticator,
        hasher: PasswordHasher,
        *,
        max_request_bytes: int,
        sidecar: Sidecar | None = None,
        audit_log: AuditLog | None = None,
        client_cert_auth: bool = False,
    ) -> None:
        """``sidecar`` set: token-less requests from local peers are sent as the sidecar identity
        (give it only to the pipeline behind local listeners). ``audit_log``: every call's
        handler records it there (proxy/services.py). ``client_cert_auth``: etcd's
        --client-cert-auth, a verified client certificate's CN is the user of token-less requests."""
        self.store = store
        self.resolver = resolver
        self.authenticator = authenticator
        self.hasher = hasher
        self.max_request_bytes = max_request_bytes
        self.sidecar = sidecar
        self.audit = audit_log
        self.client_cert_auth = client_cert_auth

    async def resolve(self, token: str | None, timeout: float | None, *, defer_invalid: bool = False,
                      fresh: bool = False) -> Identity:
        """Step 2, noted for the call's audit record: the token's fingerprint, then its identity."""
        audit.noted_token(token)
        identity = await self.resolver.resolve(token, timeout, defer_invalid=defer_invalid, fresh=fresh)
        audit.noted_identity(identity.username, identity.revision)
        return identity

    async def resolve_certificate(self, name: str, timeout: float | None) -> Identity:
        """Step 2 for a certificate's CN, noted for the call's audit record."""
        identity = await self.resolver.resolve_certificate(name, timeout)
        audit.noted_identity(identity.username, identity.revision)
        return identity

    def certificate_name(self, context: Context) -> str | None:
        """etcd's AuthInfoFromTLS: with --client-cert-auth, the verified client certificate's CN
        names the user of a request without a token (any token, even a bad one, wins)."""
        if not self.client_cert_auth:
            return None
        metadata = context.invocation_metadata() or ()
        if extract_token(metadata) is not None or any(item[0] == GATEWAY_ACCEPT_KEY for item in metadata):
            return None
        try:
            auth_context = context.auth_context()
        except AttributeError:  # the JSON gateway's context: no TLS peer
            return None
        return common_name(auth_context) or None

    async def token_of(self, context: Context) -> tuple[str | None, bool]:
        """The client's token, or the lent sidecar token; and whether it was lent (never to a
        caller its certificate names)."""
        token = extract_token(context.invocation_metadata())
        if token is None and self.sidecar is not None and is_local_peer(context.peer()) \
                and self.certificate_name(context) is None:
            return await self.sidecar.token(), True
        return token, False

    async def identity_of(self, context: Context, timeout: float | None, *, defer_invalid: bool = False) -> Identity:
        """The caller's identity: its token's, else its certificate's CN, else anonymous."""
        name = self.certificate_name(context)
        if name is not None:
            return await self.resolve_certificate(name, timeout)
        token, _lent = await self.token_of(context)
        return await self.resolve(token, timeout, defer_invalid=defer_invalid)

    async def forward(self, method: Method, request: bytes, context: Context) -> bytes:
        """One request through every step; returns the response message bytes for the client."""
        timeout = timeout_of(context)
        name = self.certificate_name(context)
        if name is not None:
            return await self.forward_as(None, method, request, timeout, certificate=name)
        token, lent = await self.token_of(context)
        try:
            return await self.forward_as(token, method, request, timeout)
        except HANDLED as e:
            reason = refresh_reason(e) if lent else None
            if reason is None:
                raise
            assert self.sidecar is not None
            # Refused without effect (before or instead of the state change): new token, retry once.
            token = await self.sidecar.refresh(token, reason)
            return await self.forward_as(token, method, request, timeout)

    async def forward_as(self, token: str | None, method: Method, request: bytes, timeout: float | None, *,
                         certificate: str | None = None) -> bytes:
        """Resolve -> stamp -> forward -> unwrap, for a given token (or a certificate's CN).

        An unusable token is not refused here: the request goes to the store marked, and the
        store validates it first, as etcd does (`key is not provided` before `invalid auth
        token`), without the proxy decoding every request.
        """
        identity = await self._identity(token, certificate, timeout)
        data = stamp(identity, method, request)
        check_size(data, self.max_request_bytes)
        try:
            answer = await self.store.do(data, timeout, token=identity.forward, field=method.field)
        except grpc.aio.AioRpcError as e:
            metrics.store_refusal(method.field, e.code(), e.details() or "")
            if not identity.reresolvable or not is_old_revision(e):
                raise
            # The store refused without effect: the revision it was resolved at is stale (a cached
            # one here, or the store's own between its check and apply). Re-resolve, retry once.
            self.resolver.invalidate(identity)
            identity = await self._identity(token, certificate, timeout)
            answer = await self.store.do(stamp(identity, method, request), timeout, token=identity.forward,
                                         field=method.field)
        return unwrap(answer, method.field)

    async def _identity(self, token: str | None, certificate: str | None, timeout: float | None) -> Identity:
        """A forwarded request's identity: the certificate's CN when it names one, else the token's
        (an unusable token is marked, for the store to refuse after validating the request)."""
        if certificate is not None:
            return await self.resolve_certificate(certificate, timeout)
        return await self.resolve(token, timeout, defer_invalid=True)

    # --- handlers (raw bytes in, raw bytes out) -------------------------------------------------

    async def unary(self, method: Method, request: bytes, context: Context) -> bytes:
        try:
            return await self.forward(method, request, context)
        except HANDLED as e:
            await abort_with(context, e)

    async def authenticate(self, method: Method, request: bytes, context: Context) -> bytes:
        try:
            check_size(request, self.max_request_bytes)
            parsed = _parse(rpc_pb2.AuthenticateRequest, request)
            return await self.authenticator.authenticate(parsed, timeout_of(context), peer=peer_host(context.peer()))
        except HANDLED as e:
            await abort_with(context, e)

    async def hash_password(self, method: Method, request: bytes, context: Context) -> bytes:
        """UserAdd / UserChangePassword: bcrypt here, so plaintext never reaches the store's log.

        etcd's order: the password length (bcrypt's own error), then the caller's token, then the
        hash. Callers the store would surely refuse never reach the bcrypt pool.
        """
        try:
            message: Any
            if method.name == "UserAdd":
                message = _parse(rpc_pb2.AuthUserAddRequest, request)
                hashed = not message.options.no_password
            else:
                message = _parse(rpc_pb2.AuthUserChangePasswordRequest, request)
                # etcd: an empty password is not hashed (the user can no longer log in).
                hashed = bool(message.password)
            if hashed:
                check_password_length(message.password)
            await self.check_caller(context)
            if hashed:
                message.hashedPassword = await self.hasher.hash(message.password, peer=peer_host(context.peer()))
            else:
                message.hashedPassword = ""
            message.password = ""
            return await self.forward(method, message.SerializeToString(), context)
        except HANDLED as e:
            await abort_with(context, e)

    async def check_caller(self, context: Context) -> None:
        """Refuses, before any bcrypt, callers every auth-admin request refuses: an unusable
        token (`invalid auth token`), and no identity while auth is on (`user name is empty`).
        A lent (sidecar) token is left to the usual refresh-and-retry of ``forward``."""
        if self.certificate_name(context) is not None:
            return  # a user name: the store decides (etcd: a CN is a user like a token's)
        token, lent = await self.token_of(context)
        if lent:
            return
        timeout = timeout_of(context)
        identity = await self.resolve(token, timeout)
        if identity.forward is None and not identity.username and await self.resolver.auth_enabled(timeout):
            raise EtcdError(Err.USER_EMPTY)

    async def range_stream(self, method: Method, request: bytes, context: Context) -> AsyncIterator[bytes]:
        """KV.RangeStream: the whole Range result as one RangeStreamResponse."""
        try:
            _parse(rpc_pb2.RangeRequest, request, streaming=True)
            answer = await self.forward(method, request, context)
        except HANDLED as e:
            await abort_with(context, e)
        yield wire.length_delimited(RANGE_STREAM_FIELD, answer)

    async def snapshot(self, method: Method, request: bytes, context: Context) -> AsyncIterator[bytes]:
        """Maintenance.Snapshot: Store.Snapshot's chunks, passed through as they arrive. A simple
        token's stale resolution (refused before the first chunk) is resolved again, once."""
        try:
            _parse(rpc_pb2.SnapshotRequest, request, streaming=True)
            timeout = timeout_of(context)
            identity = await self.identity_of(context, timeout)
            for attempt in range(2):
                data = stamp(identity, method, request)
                check_size(data, self.max_request_bytes)
                sent = False
                try:
                    async for chunk in self.store.snapshot(data, timeout, token=identity.forward):
                        sent = True
                        yield chunk
                    return
                except grpc.aio.AioRpcError as e:
                    if sent or attempt or not identity.reresolvable or not is_old_revision(e):
                        raise
                self.resolver.invalidate(identity)
                identity = await self.identity_of(context, timeout)
        except HANDLED as e:
            await abort_with(context, e)

    async def keepalive(self, method: Method, requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        """Lease.LeaseKeepAlive: each client message is one lease_keep_alive call to the store.

        An unknown lease comes back as TTL 0 in the stream (etcd); a refusal ends the stream with
        etcd's error. A renew is idempotent, so one whose outcome is unknown (the leader changed
        or timed out meanwhile) is sent again rather than ending the client's stream.
        """
        try:
            async for request in requests:
                _parse(rpc_pb2.LeaseKeepAliveRequest, request, streaming=True)
                for attempt in range(KEEPALIVE_ATTEMPTS):
                    try:
                        answer = await self.forward(method, request, context)
                        break
                    except grpc.aio.AioRpcError as e:
                        if attempt + 1 == KEEPALIVE_ATTEMPTS or from_message(e.details() or "") not in KEEPALIVE_RETRY:
                            raise
                yield answer
        except HANDLED as e:
            await abort_with(context, e)

    async def watch(self, method: Method, requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        """Watch.Watch: the token is resolved when the stream opens and again for every create
        and resume on it (etcd judges each create by the token); proxy/watch.py does the rest."""

        async def identify() -> Identity:
            return await self.identity_of(context, None, defer_invalid=True)

        try:
            identity = await identify()
        except HANDLED as e:
            await abort_with(context, e)
        async for message in WatchProxy(self.store, identify, self.resolver.auth_enabled,
                                        audit.watch_events(self.audit)).serve(identity, requests, context):
            yield message


def check_password_length(password: str) -> None:
    """bcrypt refuses passwords over 72 bytes; etcd answers with that error before anything else."""
    if len(password.encode("utf-8")) > BCRYPT_MAX_BYTES:
        raise EtcdError(Err.PASSWORD_TOO_LONG)


def _parse(message_type: Any, data: bytes, *, streaming: bool = False) -> Any:
    try:
        return message_type.FromString(data)
    except DecodeError as e:
        # protobuf's reason names the type and the fault, never the client's bytes (which may
        # hold a password); anything else is reduced to a fixed text for the same reason.
        raise MalformedRequest(str(e), streaming=streaming) from None
    except Exception:
        raise MalformedRequest(f"Error parsing message with type '{message_type.DESCRIPTOR.full_name}'",
                               streaming=streaming) from None


Handler = Callable[[Method, Any, Context], Awaitable[bytes] | AsyncIterator[bytes]]
