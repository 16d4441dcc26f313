"""Development shared secrets (``--internal-secret-file``, ``--sidecar-secret-file``,
``--peer-secret-file``) are proven, never sent.

A secret on the wire is handed to whoever listens, and to whatever endpoint a caller is told to
dial (a member root added with MemberAdd, a URL a member published). So a caller proves it knows
the secret over a fresh challenge instead:

1. It asks the port's ``Challenge`` method (open to everyone; answered without reading the
   request) for a nonce. The server keeps nothing: the nonce carries when it was issued and a
   MAC, under a key of this process, over that time and the caller's address (``context.peer()``,
   which names the connection; gRPC-Python has no per-connection hook). A nonce is good for
   CHALLENGE_TTL, from the address it was issued to, until the server restarts.
2. On each call it sends ``x-raftgate-proof: v1.<nonce>.<HMAC-SHA256(secret, label, role,
   member id, nonce)>``: ``role`` is the port (``internal``, ``peer``: a secret used on both is
   not reusable across them) and ``member id`` the member it means to reach, so a rogue endpoint
   that passes another member's challenge on (a relay) gets a proof that member refuses. A caller
   that does not know whom it dialed (a seed) binds its proof to the member the challenge names.
3. The server checks the nonce was issued to this very address and is fresh, then the proof, in
   constant time, before any message of the call is read (``ProofCheck``). A nonce it cannot vouch
   for (the caller reconnected from another port, the server restarted, it expired) is refused
   with the trailing metadata ``x-raftgate-challenge: stale``, before anything ran: the caller
   fetches a new challenge and sends again (``is_stale``).

What a listener or a rogue endpoint captures is good only on the connection the nonce was issued
to, for the member the proof names, for CHALLENGE_TTL: never the secret itself. Long-lived streams
prove once at open; a proof is one HMAC per challenge for the caller and a few per call for the
server. mTLS needs none of this (the handshake proves the key).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hmac
import inspect
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
import grpc.aio

from protos.storepb import store_pb2

#: the call metadata carrying a proof
PROOF_METADATA = "x-raftgate-proof"
#: trailing metadata of a refusal over a challenge the server cannot vouch for: ask a new one
STALE_METADATA = "x-raftgate-challenge"
STALE_MESSAGE = "raftgate: stale challenge; ask for a new one"
#: the roles a secret is proven for (one per port)
INTERNAL = "internal"
PEER = "peer"
CHALLENGE_METHODS = {INTERNAL: "/raftgate.storepb.Store/Challenge", PEER: "/raftgate.storepb.Peer/Challenge"}
#: how long a nonce is accepted after it was issued (seconds); callers ask again after half of it.
#: Short: an address is reused once its connection closed (someone on the same host, or behind the
#: same NAT, may get the port), and a nonce names the address, not the connection.
CHALLENGE_TTL = 30.0
REFRESH_AFTER = CHALLENGE_TTL / 2

#: verify()'s answers besides the index of the secret proven
STALE = -1
NONE = -2

Metadata = tuple[tuple[str, str], ...]
T = TypeVar("T")

_PROOF_LABEL = b"raftgate secret proof v1\x00"
_NONCE_LABEL = b"raftgate challenge v1\x00"
_ISSUED = 8
_RANDOM = 16
_TAG = 16
NONCE_BYTES = _ISSUED + _RANDOM + _TAG
#: a proof's metadata value is this long at most (anything longer is not one)
_MAX_VALUE = 200


def proof(secret: bytes, role: str, member_id: int, nonce: bytes) -> bytes:
    """The MAC a caller sends: it covers the port's role and the member meant, so a proof made for
    one member (or port) is refused by every other."""
    return hmac.digest(secret, _PROOF_LABEL + role.encode() + b"\x00" + member_id.to_bytes(8, "big") + nonce,
                       "sha256")


def proof_metadata(secret: bytes, role: str, member_id: int, nonce: bytes) -> Metadata:
    value = f"v1.{_b64(nonce)}.{_b64(proof(secret, role, member_id, nonce))}"
    return ((PROOF_METADATA, value),)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def is_stale(error: grpc.RpcError) -> bool:
    """Whether the server refused a call only because it cannot vouch for the challenge (the call
    was not handled: sending it again with a new challenge is safe)."""
    try:
        trailing = error.trailing_metadata() or ()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - an error that carries no metadata is not stale
        return False
    return any(key == STALE_METADATA for key, _ in trailing)


# ---- the server side ----

class Challenges:
    """Issues nonces bound to the caller's address and checks proofs over them. Stateless: what an
    unauthenticated caller makes it hold is nothing."""

    def __init__(self, role: str, secrets: Sequence[bytes], member_id: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.role = role
        self.secrets = tuple(secrets)
        #: the member this server is (proofs name it); set once the node knows its ID
        self.member_id = member_id
        self._clock = clock
        self._key = os.urandom(32)

    def _tag(self, issued: bytes, random: bytes, peer: str) -> bytes:
        msg = _NONCE_LABEL + self.role.encode() + b"\x00" + issued + random + peer.encode("utf-8", "replace")
        return hmac.digest(self._key, msg, "sha256")[:_TAG]

    def issue(self, peer: str) -> bytes:
        """A new ChallengeResponse (serialized) for the caller at ``peer``."""
        issued = int(self._clock() * 1000).to_bytes(_ISSUED, "big")
        random = os.urandom(_RANDOM)
        nonce = issued + random + self._tag(issued, random, peer)
        return store_pb2.ChallengeResponse(nonce=nonce, member_id=self.member_id).SerializeToString()

    def verify(self, metadata: Sequence[tuple[str, str | bytes]] | None, peer: str) -> int:
        """The index in ``secrets`` of the secret the call proves; STALE when its nonce was not
        issued to ``peer`` by this process or has expired; NONE when there is no valid proof."""
        value: str | bytes | None = None
        for key, v in metadata or ():
            if key == PROOF_METADATA:
                value = v
        if value is None or len(value) > _MAX_VALUE:
            return NONE
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        parts = text.split(".")
        if len(parts) != 3 or parts[0] != "v1":
            return NONE
        try:
            nonce, given = _unb64(parts[1]), _unb64(parts[2])
        except (binascii.Error, ValueError):
            return NONE
        if len(nonce) != NONCE_BYTES:
            return STALE
        issued, random, tag = nonce[:_ISSUED], nonce[_ISSUED:_ISSUED + _RANDOM], nonce[_ISSUED + _RANDOM:]
        if not hmac.compare_digest(tag, self._tag(issued, random, peer)):
            return STALE
        age = self._clock() - int.from_bytes(issued, "big") / 1000
        if not 0 <= age <= CHALLENGE_TTL:
            return STALE
        # every secret is tried (no early exit: the time taken says nothing about which matched)
        matches = [hmac.compare_digest(given, proof(s, self.role, self.member_id, nonce)) for s in self.secrets]
        return matches.index(True) if True in matches else NONE


async def _first(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
    """The one message of a unary call, read only once the call is authenticated."""
    async for request in requests:
        return request
    await context.abort(grpc.StatusCode.INTERNAL, "raftgate: the call carried no message")


class ProofCheck(grpc.aio.ServerInterceptor):
    """Every call on the port proves a secret before any of its messages is read; ``Challenge``
    and the methods under ``open`` need none.

    gRPC reads a unary call's message whole before its handler runs (up to the port's 64 MiB
    limit), so every handler is served as a request-streaming one: the check runs first and the
    message is read only after it passed. A refused caller never makes the server hold more than
    gRPC's flow-control windows. ``open`` methods are served by ``open_handler(handler)``, which
    must read nothing either.
    """

    def __init__(self, challenges: Challenges, refusal: str, *, open_prefixes: tuple[str, ...] = (),
                 open_handler: Callable[[grpc.RpcMethodHandler], grpc.RpcMethodHandler] | None = None) -> None:
        self.challenges = challenges
        self._refusal = refusal
        self._open_prefixes = open_prefixes
        self._open_handler = open_handler
        self._challenge_method = CHALLENGE_METHODS[challenges.role]

        async def challenge(_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
            return self.challenges.issue(context.peer())

        self._challenge = grpc.stream_unary_rpc_method_handler(challenge)

        async def unimplemented(_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")

        self._unimplemented = self.guard(grpc.stream_stream_rpc_method_handler(unimplemented))

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        method = details.method
        if method == self._challenge_method:
            return self._challenge
        handler = await continuation(details)
        if method.startswith(self._open_prefixes) and handler is not None and self._open_handler is not None:
            return self._open_handler(handler)
        if handler is None:
            return self._unimplemented
        return self.guard(handler)

    async def check(self, context: grpc.aio.ServicerContext) -> int:
        """Aborts the call unless it proves a secret; the index of the secret it proves."""
        verdict = self.challenges.verify(context.invocation_metadata(), context.peer())
        if verdict == STALE:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, STALE_MESSAGE,
                                trailing_metadata=((STALE_METADATA, "stale"),))
        if verdict < 0:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, self._refusal)
        return verdict

    def guard(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """``handler`` served as a request-streaming handler that checks the proof first."""
        check = self.check
        des, ser = handler.request_deserializer, handler.response_serializer
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(_streaming(check, handler.stream_stream, False), des, ser)
        if handler.request_streaming:
            inner_su = handler.stream_unary

            async def stream_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
                await check(context)
                return await inner_su(requests, context)
            return grpc.stream_unary_rpc_method_handler(stream_unary, des, ser)
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(_streaming(check, handler.unary_stream, True), des, ser)
        inner_uu = handler.unary_unary

        async def unary_unary(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            return await inner_uu(await _first(requests, context), context)
        return grpc.stream_unary_rpc_method_handler(unary_unary, des, ser)


def _streaming(check: Callable[[grpc.aio.ServicerContext], Awaitable[int]], inner: Callable[..., Any],
               unary_request: bool) -> Callable[..., Any]:
    """A response-streaming behaviour that checks first; an async generator if ``inner`` is one
    (answers are yielded), else a coroutine (it writes them itself)."""
    if inspect.isasyncgenfunction(inner):
        async def generator(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(context)
            arg = await _first(requests, context) if unary_request else requests
            async for answer in inner(arg, context):
                yield answer
        return generator

    async def coroutine(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        await check(context)
        arg = await _first(requests, context) if unary_request else requests
        return await inner(arg, context)
    return coroutine


# ---- the caller's side ----

class Prover:
    """One channel's proofs (asyncio): a challenge fetched when first needed, and again after
    REFRESH_AFTER or once the server called it stale (``forget``); concurrent callers share one
    fetch. ``member_id``: the member the caller means to reach (None: the one the challenge names,
    for a seed)."""

    def __init__(self, channel: grpc.aio.Channel, secret: bytes, role: str, member_id: int | None = None) -> None:
        self._ask = channel.unary_unary(CHALLENGE_METHODS[role], request_serializer=None,
                                        response_deserializer=store_pb2.ChallengeResponse.FromString)
        self._secret = secret
        self._role = role
        self.member_id = member_id
        self._current: tuple[float, Metadata] | None = None
        self._fetching: asyncio.Task[Metadata] | None = None

    async def metadata(self, timeout: float | None = None) -> Metadata:
        """The proof to send (raises the Challenge call's AioRpcError if the server cannot be asked)."""
        current = self._current
        if current is not None and time.monotonic() - current[0] < REFRESH_AFTER:
            return current[1]
        if self._fetching is None or self._fetching.done():
            self._fetching = asyncio.get_running_loop().create_task(self._fetch(timeout))
        return await asyncio.shield(self._fetching)

    async def _fetch(self, timeout: float | None) -> Metadata:
        fetched = time.monotonic()
        answer = await self._ask(b"", timeout=timeout or 5.0)
        member = self.member_id if self.member_id is not None else answer.member_id
        md = proof_metadata(self._secret, self._role, member, answer.nonce)
        self._current = (fetched, md)
        return md

    def forget(self, md: Metadata) -> None:
        """The server called ``md``'s challenge stale: the next call fetches another."""
        if self._current is not None and self._current[1] is md:
            self._current = None

    async def call(self, invoke: Callable[[Metadata], Awaitable[T]], timeout: float | None = None) -> T:
        """``invoke(metadata)``, sent once more with a new challenge if the first was stale (it
        was refused before anything ran)."""
        md = await self.metadata(timeout)
        try:
            return await invoke(md)
        except grpc.aio.AioRpcError as exc:
            if not is_stale(exc):
                raise
            self.forget(md)
        return await invoke(await self.metadata(timeout))


class SyncProver:
    """Prover for a blocking channel (tests, the bench, tools)."""

    def __init__(self, channel: grpc.Channel, secret: bytes | str, role: str = INTERNAL,
                 member_id: int | None = None) -> None:
        self._ask = channel.unary_unary(CHALLENGE_METHODS[role], request_serializer=None,
                                        response_deserializer=store_pb2.ChallengeResponse.FromString)
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._role = role
        self.member_id = member_id
        self._current: tuple[float, Metadata] | None = None
        self._lock = threading.Lock()

    def metadata(self, timeout: float = 5.0) -> Metadata:
        with self._lock:
            current = self._current
            if current is not None and time.monotonic() - current[0] < REFRESH_AFTER:
                return current[1]
            fetched = time.monotonic()
            answer = self._ask(b"", timeout=timeout)
            member = self.member_id if self.member_id is not None else answer.member_id
            md = proof_metadata(self._secret, self._role, member, answer.nonce)
            self._current = (fetched, md)
            return md

    def forget(self, md: Metadata) -> None:
        with self._lock:
            if self._current is not None and self._current[1] is md:
                self._current = None


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")),
               grpc.ClientCallDetails):
    pass


class _ProvingInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                          grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, prover: SyncProver) -> None:
        self._prover = prover

    def _details(self, details: grpc.ClientCallDetails, md: Metadata) -> _Details:
        given = tuple((k, v) for k, v in (details.metadata or ()) if k != PROOF_METADATA)
        return _Details(details.method, details.timeout, given + md, details.credentials,
                        details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        md = self._prover.metadata()
        outcome = continuation(self._details(details, md), request)
        if outcome.exception() is not None and is_stale(outcome):  # refused before it ran: once more
            self._prover.forget(md)
            outcome = continuation(self._details(details, self._prover.metadata()), request)
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details, self._prover.metadata()), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details, self._prover.metadata()), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details, self._prover.metadata()), requests)


def proving_channel(channel: grpc.Channel, secret: bytes | str, role: str = INTERNAL,
                    member_id: int | None = None) -> grpc.Channel:
    """``channel`` with every call carrying a proof of ``secret`` (a unary call refused over a
    stale challenge is sent once more with a new one)."""
    return grpc.intercept_channel(channel, _ProvingInterceptor(SyncProver(channel, secret, role, member_id)))
