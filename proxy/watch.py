"""Watch.Watch: one client stream <-> one store stream, surviving leader changes.

The client's token is resolved once, when the stream opens (etcd checks every create on a stream
with the stream's token). Each client WatchRequest goes to the store leader's Store.WatchBatches stream
wrapped with the stamped header; the store's WatchResponse bytes come back to the client as they
are (the store batches the responses that queued together; the client still gets one message
each, as from etcd). The proxy reads a copy of each answer to know, per watch, its create request
and the next revision it has not delivered. When the store stream fails (the node died or stopped
leading), the proxy finds the leader again and re-creates every open watch there from that
revision (``resume``: no second `created` message), then re-sends what the old stream left
unanswered. The client sees no gap and no duplicate: an event older than what was delivered is
dropped as a last guard.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from authstore.errors import Err, EtcdError, from_message
from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb.store_pb2 import WatchBatch
from proxy.identity import Identity
from proxy.store_client import StoreClient

log = logging.getLogger(__name__)

WATCH_METHOD = "/raftgate.storepb.Store/WatchBatches"
RESUME_DEADLINE = 30.0  # how long a stream may go without a store leader before the client is told
_BACKOFF = 0.1
_HEADER, _REQUEST, _RESUME, _CURRENT = 1, 2, 3, 4  # WatchStreamRequest fields


@dataclass
class _Watch:
    create: pb.WatchCreateRequest
    next_rev: int


@dataclass
class _State:
    header: bytes
    current_revision: bool
    watches: dict[int, _Watch] = field(default_factory=dict)
    pending: collections.deque[pb.WatchCreateRequest] = field(default_factory=collections.deque)
    held: list[bytes] = field(default_factory=list)  # cancels / progress requests while reconnecting
    canceling: set[int] = field(default_factory=set)
    call: Any = None
    connected: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _header(identity: Identity) -> bytes:
    return ipb.RequestHeader(username=identity.username, auth_revision=identity.revision,
                             invalid_token=identity.invalid_token).SerializeToString()


def _envelope(state: _State, request: bytes, *, resume: bool = False) -> bytes:
    out = wire.length_delimited(_HEADER, state.header) + wire.length_delimited(_REQUEST, request)
    if resume:
        out += wire.varint_field(_RESUME, 1)
    if state.current_revision:
        out += wire.varint_field(_CURRENT, 1)
    return out


def track(state: _State, data: bytes) -> bytes | None:
    """Learns from one store answer; returns what the client gets (None: nothing)."""
    resp = pb.WatchResponse.FromString(data)
    rev = resp.header.revision
    if resp.created:
        create = state.pending.popleft() if state.pending else pb.WatchCreateRequest()
        if resp.watch_id != -1 and not resp.canceled:
            create.watch_id = resp.watch_id
            state.watches[resp.watch_id] = _Watch(create, create.start_revision or rev + 1)
        return data
    if resp.canceled:
        state.watches.pop(resp.watch_id, None)
        state.canceling.discard(resp.watch_id)
        return data
    if not resp.events:
        targets = state.watches.values() if resp.watch_id == -1 else [
            w for w in (state.watches.get(resp.watch_id),) if w is not None]
        for w in targets:
            w.next_rev = max(w.next_rev, rev + 1)
        return data
    w = state.watches.get(resp.watch_id)
    if w is None:
        return data
    fresh = [ev for ev in resp.events if ev.kv.mod_revision >= w.next_rev]
    if not resp.fragment:
        w.next_rev = max(w.next_rev, rev + 1, *(ev.kv.mod_revision + 1 for ev in fresh))
    if len(fresh) == len(resp.events):
        return data
    if not fresh:
        return None
    del resp.events[:]
    resp.events.extend(fresh)
    return resp.SerializeToString()


_RETRY_ERRS = frozenset({Err.NOT_LEADER, Err.NO_LEADER, Err.STOPPED, Err.LEADER_CHANGED, Err.TOO_MANY_REQUESTS,
                         Err.TIMEOUT, Err.TIMEOUT_DUE_TO_LEADER_FAIL, Err.NOT_CAPABLE})


def _retryable(error: grpc.aio.AioRpcError) -> bool:
    """The store node went away or stopped leading (resume elsewhere); not a refusal to pass on."""
    err = from_message(error.details() or "")
    if err is not None:
        return err in _RETRY_ERRS
    # A node killed mid-stream shows up as UNAVAILABLE, CANCELLED or even INTERNAL; only the
    # answers of a node that works but will not serve us (wrong secret, no such method) are final.
    return error.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)


class WatchProxy:
    def __init__(self, store: StoreClient) -> None:
        self.store = store

    def _open(self) -> Any:
        endpoint = self.store._leader  # noqa: SLF001 - the leader guess the store client keeps
        return endpoint.channel.stream_stream(WATCH_METHOD)(metadata=self.store._metadata)  # noqa: SLF001

    async def serve(self, identity: Identity, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                    refresh: Callable[[], Awaitable[Identity]] | None = None) -> AsyncIterator[bytes]:
        """``refresh``: resolves the stream's token again, before each create (simple tokens)."""
        state = _State(_header(identity), current_revision=identity.simple_token is not None)
        out: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._sessions(state, out)),
                 loop.create_task(self._client(state, requests, out, refresh))]
        try:
            while True:
                item = await out.get()
                if isinstance(item, EtcdError):
                    await context.abort(item.code, item.message)
                if isinstance(item, grpc.aio.AioRpcError):
                    await context.abort(item.code(), item.details() or "")
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            for task in tasks:
                task.cancel()
            if state.call is not None:
                state.call.cancel()

    async def _client(self, state: _State, requests: AsyncIterator[bytes], out: asyncio.Queue[Any],
                      refresh: Callable[[], Awaitable[Identity]] | None) -> None:
        try:
            async for data in requests:
                req = pb.WatchRequest.FromString(data)
                which = req.WhichOneof("request_union")
                if which == "create_request" and refresh is not None:
                    # The token's validity now: revoked since the stream opened -> the store
                    # refuses the create as for an unresolved token.
                    try:
                        header = _header(await refresh())
                    except Exception as exc:  # noqa: BLE001 - store unreachable: keep the last identity
                        log.debug("watch: could not resolve the stream's token again: %s", exc)
                    else:
                        async with state.lock:
                            state.header = header
                async with state.lock:
                    if which == "create_request":
                        state.pending.append(req.create_request)
                    elif which == "cancel_request":
                        state.canceling.add(req.cancel_request.watch_id)
                    if state.connected:
                        await self._write(state, _envelope(state, data))
                    elif which != "create_request":
                        state.held.append(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the client's stream broke; the handler ends
            log.debug("watch client stream ended: %s", exc)

    @staticmethod
    async def _write(state: _State, data: bytes) -> None:
        try:
            await state.call.write(data)
        except Exception as exc:  # noqa: BLE001 - the reading side notices and reconnects
            log.debug("watch: write to the store failed: %s", exc)

    async def _sessions(self, state: _State, out: asyncio.Queue[Any]) -> None:
        down_since: float | None = None
        first = True
        while True:
            call = self._open()
            async with state.lock:
                state.call = call
                # Re-create what the client has (from the first revision it has not seen), then
                # what the old stream left unanswered, in the order the client sent it.
                for watch_id in sorted(state.watches):
                    w = state.watches[watch_id]
                    create = pb.WatchCreateRequest()
                    create.CopyFrom(w.create)
                    create.watch_id = watch_id
                    create.start_revision = w.next_rev
                    await self._write(state, _envelope(
                        state, pb.WatchRequest(create_request=create).SerializeToString(), resume=True))
                for create in state.pending:
                    await self._write(state, _envelope(
                        state, pb.WatchRequest(create_request=create).SerializeToString()))
                for watch_id in sorted(state.canceling):
                    if not first:
                        await self._write(state, _envelope(state, pb.WatchRequest(
                            cancel_request=pb.WatchCancelRequest(watch_id=watch_id)).SerializeToString()))
                for data in state.held:
                    await self._write(state, _envelope(state, data))
                state.held.clear()
                state.connected = True
            first = False
            error: BaseException | None = None
            started = time.monotonic()
            try:
                while True:
                    data = await call.read()
                    if data is grpc.aio.EOF:
                        break
                    down_since = None
                    for response in WatchBatch.FromString(data).responses:
                        passed = track(state, response)
                        if passed is not None:
                            out.put_nowait(passed)
            except grpc.aio.AioRpcError as exc:
                error = exc
            async with state.lock:
                state.connected = False
                state.call = None
            call.cancel()
            if isinstance(error, grpc.aio.AioRpcError) and not _retryable(error):
                out.put_nowait(error)
                return
            now = time.monotonic()
            if now - started > 5 * _BACKOFF * 10:
                down_since = None  # the stream served for a while: a new outage starts now
            down_since = down_since or now
            if now - down_since > RESUME_DEADLINE:
                out.put_nowait(error or EtcdError(Err.NO_LEADER))
                return
            log.info("watch stream to the store ended (%s); resuming on the leader",
                     error.code() if isinstance(error, grpc.aio.AioRpcError) else "closed")
            with contextlib.suppress(Exception):
                await self.store._rediscover()  # noqa: SLF001
            await asyncio.sleep(_BACKOFF)
