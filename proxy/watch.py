"""Watch.Watch: one client stream <-> one store stream, surviving leader changes.

The store stream is a sub-stream of the proxy's one Store.WatchShared stream to the leader
(proxy/watch_link.py: the messages of every client stream are shared), or, with a store that has
no WatchShared, a Store.WatchBatches stream of its own; both behave alike here. Each client
WatchRequest goes to it wrapped with the stamped header; the store's WatchResponse bytes come back to the client as they
are (the store batches the responses that queued together; the client still gets one message
each, as from etcd). The proxy reads a copy of each answer to know, per watch, its create request
and the next revision it has not delivered. When the store stream fails (the node died or stopped
leading), the proxy finds the leader again and re-creates every open watch there from that
revision (``resume``: no second `created` message), then re-sends what the old stream left
unanswered. The client sees no gap and no duplicate: an event older than what was delivered is
dropped as a last guard.

A client that reads slowly or not at all holds at most ``CLIENT_BUFFER_BYTES`` of answers in the
proxy: at that bound the proxy stops reading the store stream until the client has taken half of
it. On a WatchBatches stream HTTP/2 flow control then holds the store back; a sub-stream of the
shared stream is closed once it holds ``watch_link.INBOX_BYTES`` more, and the watches resume
on a new one when the client has taken what was held. Either way the store catches the stalled
watches up from its history later instead of buffering them (see the store's watch hub). The other way,
the proxy holds at most ``UNSENT_BYTES`` of a client's creates the store has not answered yet and
requests kept for the next store stream (a leader change): beyond that it reads no more of the
client until the store answers or a stream is back.

The token is resolved again for every create and every resume (etcd checks each create with the
stream's token), so each is judged by the token's validity now, with a freshly stamped header. A
simple token also travels as its digest: the store requires it to be live at the create and at
every re-check. A JWT's ``exp`` is known here only: when it passes (auth on), the stream's open
watches are canceled with etcd's ``invalid auth token`` reason.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb.store_pb2 import WatchBatch
from proxy.audit.handlers import WatchCreate, WatchEvents
from proxy.identity import Identity
from proxy.store_client import StoreClient
from proxy.watch_merge import EventsAnswer, answer_size, take_merged
from raftgate.byte_queue import ByteBudget, ByteQueue
from raftgate.errors import STREAM_UNMARSHAL_ERROR_PREFIX, Err, EtcdError

log = logging.getLogger(__name__)

_HEADER, _REQUEST, _RESUME, _CURRENT, _DIGEST, _TOKEN = 1, 2, 3, 4, 5, 6  # WatchStreamRequest fields
IDENTIFY_TIMEOUT = 5.0  # a create whose token cannot be resolved meanwhile keeps the last identity
#: A token the proxy verifies itself (JWT, workload) is verified again this often while its stream
#: is open: its key may have left the key ring (rotated out) long before its ``exp``.
RECHECK_SECONDS = 2.0
INVALID_TOKEN_REASON = EtcdError(Err.INVALID_AUTH_TOKEN).status_string()
_PROGRESS_REQUEST = pb.WatchRequest(progress_request=pb.WatchProgressRequest()).SerializeToString()
CLIENT_BUFFER_BYTES = 4 << 20  # memory of the answers one client stream may leave untaken in the proxy
UNSENT_BYTES = 4 << 20  # a client's unanswered creates, cancels kept of ids not open, and held requests
#: what a cancel of an id not open, kept while a create sent before it is unanswered, counts in
#: UNSENT_BYTES (about the memory of its id in a set and a dict)
_MAYBE_CANCEL_BYTES = 128


@dataclass
class _Watch:
    create: pb.WatchCreateRequest
    next_rev: int
    #: events of an answer cut into parts that the client holds, its last part not yet passed on:
    #: they are the first events from ``next_rev`` on, which a resumed stream sends again
    partial: int = 0
    #: of those, how many the resumed stream has yet to send again (dropped: the client has them)
    replayed: int = 0


@dataclass
class _State:
    header: bytes = b""
    current_revision: bool = False
    digest: bytes = b""  # sha256 of the simple token (the store's key for it), else empty
    token: str | None = None  # sidecar mode: the client's token, for the store to verify
    expires_at: float | None = None
    #: the token was verified here (JWT, workload): verified again every RECHECK_SECONDS
    recheck: bool = False
    dead: set[int] = field(default_factory=set)  # canceled because the token died: reason added
    token_dead: bool = False
    watches: dict[int, _Watch] = field(default_factory=dict)
    pending: collections.deque[pb.WatchCreateRequest] = field(default_factory=collections.deque)
    #: with an audit log: who sent each create in ``pending`` (in step with it)
    audited: collections.deque[WatchCreate] = field(default_factory=collections.deque)
    held: list[bytes] = field(default_factory=list)  # requests kept for the next store stream
    #: the client asked for progress and has no answer yet: asked again on the next store stream
    #: (an answer under way is lost with its stream, or with a sub-stream closed for a slow client)
    progress_asked: bool = False
    #: bytes in `pending`, `maybe_canceling` and `held`; its room is set while below UNSENT_BYTES
    unsent: ByteBudget = field(default_factory=lambda: ByteBudget(UNSENT_BYTES, UNSENT_BYTES - 1))
    #: watches the client asked to cancel, not yet answered (asked again on the next store
    #: stream): only ids the store may have (open, or a create not answered yet could make it),
    #: since etcd answers nothing to a cancel of an unknown id, and nothing else would take it off
    canceling: set[int] = field(default_factory=set)
    #: of those, the ids not open when asked (a create sent before and not answered yet may make
    #: them), each with the count of answered creates by which those creates are all answered:
    #: then it goes if none of them made it (a later create may make that id: never canceled).
    #: Each counts in `unsent` meanwhile.
    maybe_canceling: dict[int, int] = field(default_factory=dict)
    creates_done: int = 0  # creates the store has answered on this client stream
    call: Any = None
    connected: bool = False
    #: the client stream ended: no store stream is opened for it any more
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def keep(self, create: pb.WatchCreateRequest | None = None, held: bytes = b"") -> None:
        """A create sent (or to send) that the store has not answered, or a request held."""
        if create is not None:
            self.pending.append(create)
            self.unsent.charge(create.ByteSize())
        if held:
            self.held.append(held)
            self.unsent.charge(len(held))

    def answered(self) -> pb.WatchCreateRequest:
        """The oldest create the store had not answered: answered now."""
        if not self.pending:
            return pb.WatchCreateRequest()
        create = self.pending.popleft()
        self.unsent.release(create.ByteSize())
        self.creates_done += 1
        return create

    def cancel(self, watch_id: int) -> bool:
        """The client asked to cancel ``watch_id``: kept until answered (True) if the store may
        have the watch (open, or a create not answered yet may make it)."""
        if watch_id in self.watches:
            self.canceling.add(watch_id)
        elif self.pending and watch_id not in self.canceling:
            self.canceling.add(watch_id)
            self.maybe_canceling[watch_id] = self.creates_done + len(self.pending)
            self.unsent.charge(_MAYBE_CANCEL_BYTES)
        return watch_id in self.canceling

    def canceled(self, watch_id: int) -> bool:
        """The store answered the cancel of ``watch_id``: whether it had been asked."""
        if self.maybe_canceling.pop(watch_id, None) is not None:
            self.unsent.release(_MAYBE_CANCEL_BYTES)
        if watch_id in self.canceling:
            self.canceling.discard(watch_id)
            return True
        return False

    def settle_cancels(self) -> None:
        """After a create's answer: a cancel kept for an id not open whose earlier creates are
        all answered now cancels a watch one of them made, or nothing (never answered: it goes)."""
        maybe = self.maybe_canceling
        while maybe:
            watch_id, due = next(iter(maybe.items()))  # (in the order asked: dues never fall)
            if due > self.creates_done:
                return
            del maybe[watch_id]
            self.unsent.release(_MAYBE_CANCEL_BYTES)
            if watch_id not in self.watches:
                self.canceling.discard(watch_id)
        # all settled: new tables (a dict or set emptied in place keeps the size it grew to)
        self.maybe_canceling, self.canceling = {}, set(self.canceling)

    def release_held(self) -> None:
        self.unsent.release(sum(len(data) for data in self.held))
        self.held.clear()


def stamp(state: _State, identity: Identity) -> None:
    """The header the next creates (and resumes) go with: the identity resolved just before."""
    state.header = ipb.RequestHeader(username=identity.username, auth_revision=identity.revision,
                                     invalid_token=identity.invalid_token).SerializeToString()
    state.current_revision = identity.simple_token is not None or identity.certificate
    state.digest = hashlib.sha256(identity.simple_token.encode()).digest() if identity.simple_token else b""
    state.expires_at = identity.expires_at
    state.token = identity.forward
    state.recheck = (bool(identity.username) and identity.forward is None and identity.simple_token is None
                     and not identity.certificate and not identity.invalid_token)


def _envelope(state: _State, request: bytes, *, resume: bool = False) -> bytes:
    out = wire.length_delimited(_HEADER, state.header) + wire.length_delimited(_REQUEST, request)
    if resume:
        out += wire.varint_field(_RESUME, 1)
    if state.current_revision:
        out += wire.varint_field(_CURRENT, 1)
    if state.digest:
        out += wire.length_delimited(_DIGEST, state.digest)
    if state.token is not None:
        out += wire.length_delimited(_TOKEN, state.token.encode())
    return out


def _cancel_request(state: _State, watch_id: int) -> bytes:
    request = pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id))
    return _envelope(state, request.SerializeToString())


def track(state: _State, data: bytes, events: WatchEvents | None = None) -> bytes | EventsAnswer | None:
    """Learns from one store answer; returns what the client gets (None: nothing; an ``EventsAnswer``:
    events that may merge with the next answers of their watch). ``events`` records creates and
    cancels in the audit log."""
    resp = pb.WatchResponse.FromString(data)
    rev = resp.header.revision
    if resp.created:
        create = state.answered()
        ok = resp.watch_id != -1 and not resp.canceled
        if ok:
            create.watch_id = resp.watch_id
            state.watches[resp.watch_id] = _Watch(create, create.start_revision or rev + 1)
        if state.maybe_canceling:
            state.settle_cancels()
        if events is not None:
            events.created(state.audited.popleft() if state.audited else None, create, resp.watch_id,
                           "ok" if ok else resp.cancel_reason or "canceled")
        return data
    if resp.canceled:
        gone = state.watches.pop(resp.watch_id, None)
        asked = state.canceled(resp.watch_id)
        if events is not None and gone is not None:
            dead = resp.watch_id in state.dead and not resp.cancel_reason
            why = INVALID_TOKEN_REASON if dead else resp.cancel_reason or ("ok" if asked else "canceled")
            events.canceled(gone.create, resp.watch_id, why)
        if resp.watch_id in state.dead:
            state.dead.discard(resp.watch_id)
            if not resp.cancel_reason:
                resp.cancel_reason = INVALID_TOKEN_REASON
                return resp.SerializeToString()
        return data
    if resp.watch_id in state.dead:
        return None  # nothing more for a watch whose token died
    if not resp.events:
        if resp.watch_id == -1:  # the answer to a progress request (the stream's, not a watch's)
            state.progress_asked = False
        targets = state.watches.values() if resp.watch_id == -1 else [
            w for w in (state.watches.get(resp.watch_id),) if w is not None]
        for w in targets:
            w.next_rev = max(w.next_rev, rev + 1)
        return data
    w = state.watches.get(resp.watch_id)
    if w is None:
        return data
    if resp.events[0].kv.mod_revision >= w.next_rev and not w.replayed:
        fresh: Sequence[Any] = resp.events  # every event new (an answer's events are in revision order)
    else:
        fresh = [ev for ev in resp.events if ev.kv.mod_revision >= w.next_rev]
        if w.replayed:  # a resumed stream sends again the parts the client already gathers
            dropped = min(w.replayed, len(fresh))
            w.replayed -= dropped
            del fresh[:dropped]
    ends_parts = not resp.fragment and w.partial > 0
    if resp.fragment:
        w.partial += len(fresh)
    else:
        w.partial = 0
        w.next_rev = max(w.next_rev, rev + 1, fresh[-1].kv.mod_revision + 1 if fresh else 0)
    if len(fresh) != len(resp.events):
        if not fresh and not ends_parts:  # (the last part ends what the client gathers, even empty)
            return None
        del resp.events[:]
        resp.events.extend(fresh)
        data = resp.SerializeToString()
    if resp.fragment or w.create.fragment or not fresh:
        # A fragment is part of one revision's events; a watch that asked for fragments gets
        # answers no larger than the store's limit, as etcd sends them: neither is merged.
        return data
    first, last = fresh[0].kv.mod_revision, fresh[-1].kv.mod_revision
    revisions = 1 if first == last else len({ev.kv.mod_revision for ev in fresh})
    return EventsAnswer.of(data, resp.watch_id, revisions) or data


class _Unparsable(Exception):
    """A client message that does not decode: the stream ends as grpc-go ends it."""


Identify = Callable[[], Awaitable[Identity]]


class WatchProxy:
    def __init__(self, store: StoreClient, identify: Identify | None = None,
                 auth_enabled: Callable[[], Awaitable[bool]] | None = None, events: WatchEvents | None = None) -> None:
        """``identify`` resolves the stream's token now (for each create and resume);
        ``auth_enabled`` asks the store, before a JWT's expiry cancels watches; ``events`` records
        each create and cancel in the audit log."""
        self.store = store
        self.identify = identify
        self.auth_enabled = auth_enabled
        self.events = events

    async def serve(self, identity: Identity, requests: AsyncIterator[bytes],
                    context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        state = _State()
        stamp(state, identity)
        out: ByteQueue[Any] = ByteQueue(CLIENT_BUFFER_BYTES, size=answer_size)  # what the client has not taken yet
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(self._sessions(state, out)), loop.create_task(self._client(state, requests, out)),
                 loop.create_task(self._expiry(state))]
        try:
            while True:
                item = await out.get()
                if isinstance(item, EtcdError):
                    await context.abort(item.code, item.message)
                if isinstance(item, grpc.aio.AioRpcError):
                    await context.abort(item.code(), item.details() or "")
                if isinstance(item, _Unparsable):
                    await context.abort(grpc.StatusCode.INTERNAL, STREAM_UNMARSHAL_ERROR_PREFIX + str(item))
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, EventsAnswer):
                    item = take_merged(item, out)
                yield item
        finally:
            state.closed = True
            for task in tasks:
                task.cancel()
            if state.call is not None:
                state.call.cancel()
            if self.events is not None:
                self.events.abandoned(state.audited)
                state.audited.clear()

    async def _client(self, state: _State, requests: AsyncIterator[bytes], out: ByteQueue[Any]) -> None:
        try:
            async for data in requests:
                await state.unsent.room.wait()  # read no more of the client while it has that much unsent
                try:
                    req = pb.WatchRequest.FromString(data)
                except DecodeError as exc:  # its reason names the type, never the client's bytes
                    await out.put(_Unparsable(str(exc)))
                    return
                which = req.WhichOneof("request_union")
                identity = await self._identify() if which == "create_request" else None
                async with state.lock:
                    audited = None
                    if which == "create_request" and self.events is not None:
                        # admitted under the lock: nothing is awaited between the room reserved and
                        # its place in state.audited, which a stream that ends gives back (abandoned)
                        audited = self.events.creating()
                        if audited is None:  # --audit-fail-closed: the stream ends
                            out.put_nowait(EtcdError(Err.AUDIT_UNAVAILABLE))
                            return
                    if identity is not None:
                        stamp(state, identity)
                    # What each new store stream sends again until the store answers it (a
                    # create pending, a cancel kept by ``state.cancel``, progress asked) is not
                    # held as bytes too; a cancel of no watch is passed on once.
                    resent = which in ("create_request", "progress_request")
                    if which == "create_request":
                        state.keep(req.create_request)
                        if audited is not None:
                            state.audited.append(audited)
                    elif which == "cancel_request":
                        resent = state.cancel(req.cancel_request.watch_id)
                    elif which == "progress_request":
                        state.progress_asked = True
                    sent = state.connected and await self._write(state, _envelope(state, data))
                    # Not sent (no store stream, or it is gone: a sub-stream closed because this
                    # client read too slowly is, until the resume): the next stream gets it.
                    if not sent and not resent:
                        state.keep(held=data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the client's stream broke; the handler ends
            log.debug("watch client stream ended: %s", exc)

    async def _identify(self) -> Identity | None:
        """The token's identity now; None (keep the last one) if the store cannot say meanwhile:
        for a simple token the store checks its digest at the create anyway."""
        if self.identify is None:
            return None
        try:
            async with asyncio.timeout(IDENTIFY_TIMEOUT):
                return await self.identify()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a store outage, not a verdict on the token
            log.debug("watch: could not resolve the token again (%s); keeping the last identity", exc)
            return None

    async def _expiry(self, state: _State) -> None:
        """When a JWT's ``exp`` passes, or a token verified here stops verifying (its key rotated
        out: checked every RECHECK_SECONDS), the stream's open watches end with ``invalid auth token``."""
        while True:
            exp = state.expires_at
            if exp is None and not state.recheck:
                return
            now = time.time()
            if exp is None or now < exp:
                wait = RECHECK_SECONDS if state.recheck else math.inf
                await asyncio.sleep(min(wait, exp - now) if exp is not None else wait)
                if not state.recheck or (exp is not None and not time.time() < exp):
                    continue
                identity = await self._identify()  # None: the store could not say; keep going
                if identity is None or not identity.invalid_token:
                    continue
            if self.auth_enabled is not None:
                try:
                    if not await self.auth_enabled():
                        return  # auth off: etcd ignores tokens
                except Exception as exc:  # noqa: BLE001 - cancel rather than keep a dead token's watches
                    log.debug("watch: auth status unknown at token expiry: %s", exc)
            async with state.lock:
                state.token_dead = True
                await self._cancel_dead(state)
            return

    async def _cancel_dead(self, state: _State) -> None:
        """Under the lock: cancels every open watch the dead token made, reason added in track()."""
        for watch_id in sorted(set(state.watches) - state.dead):
            state.dead.add(watch_id)
            state.canceling.add(watch_id)
            if state.connected:  # (else the next stream sends it, as every cancel not answered)
                await self._write(state, _cancel_request(state, watch_id))

    @staticmethod
    async def _write(state: _State, data: bytes) -> bool:
        """False when it could not be sent (the reading side notices and reconnects)."""
        try:
            await state.call.write(data)
        except Exception as exc:  # noqa: BLE001 - the reading side notices and reconnects
            log.debug("watch: write to the store failed: %s", exc)
            return False
        return True

    async def _resend_unanswered(self, state: _State) -> None:
        """Under the lock, on a new store stream: the creates not answered, each cancel of an id
        not open after the creates sent before it (a later one may take that id), then the
        cancels of watches open."""
        maybe = list(state.maybe_canceling.items())  # (dues never fall; each after a create pending)
        done, at = state.creates_done, 0
        for create in state.pending:
            done += 1
            await self._write(state, _envelope(state, pb.WatchRequest(create_request=create).SerializeToString()))
            while at < len(maybe) and maybe[at][1] <= done:
                await self._write(state, _cancel_request(state, maybe[at][0]))
                at += 1
        for watch_id in sorted(state.canceling.difference(state.maybe_canceling)):
            await self._write(state, _cancel_request(state, watch_id))

    async def _sessions(self, state: _State, out: ByteQueue[Any]) -> None:
        streams = self.store.watch_streams()
        first = True
        while not state.closed:  # (a cancel lost on the way, as wait_for lost one, ends it here)
            try:
                call = await streams.open()
            except grpc.aio.AioRpcError as exc:  # no challenge could be had from the node
                final = await streams.ended(exc, time.monotonic())
                if final is not None:
                    out.put_nowait(final)
                    return
                continue
            # held at once (the writers wait for `connected`): a client stream that ends while the
            # resume awaits the token or the lock cancels it too (serve's end)
            state.call = call
            identity = None if first else await self._identify()  # resumes are judged by the token now
            async with state.lock:
                if identity is not None:
                    stamp(state, identity)
                # Re-create what the client has (from the first revision it has not seen), then
                # what the old stream left unanswered, in the order the client sent it where a
                # later create may take the id a cancel names: the requests held (cancels of no
                # watch, all sent before any create still unanswered), the creates with each
                # cancel of an id not open after the creates sent before it, then the other
                # cancels (of watches open) and progress.
                for watch_id in sorted(state.watches):
                    w = state.watches[watch_id]
                    w.replayed = w.partial
                    create = pb.WatchCreateRequest()
                    create.CopyFrom(w.create)
                    create.watch_id = watch_id
                    create.start_revision = w.next_rev
                    await self._write(state, _envelope(
                        state, pb.WatchRequest(create_request=create).SerializeToString(), resume=True))
                for data in state.held:
                    await self._write(state, _envelope(state, data))
                state.release_held()
                await self._resend_unanswered(state)
                if state.progress_asked:
                    await self._write(state, _envelope(state, _PROGRESS_REQUEST))
                state.connected = True
            first = False
            error: BaseException | None = None
            started = time.monotonic()
            try:
                while True:
                    data = await call.read()
                    if data is grpc.aio.EOF:
                        break
                    streams.served()
                    for response in WatchBatch.FromString(data).responses:
                        passed = track(state, response, self.events)
                        if passed is not None:
                            out.put_nowait(passed)
                    if state.token_dead and set(state.watches) - state.dead:
                        async with state.lock:  # created after the token died
                            await self._cancel_dead(state)
                    await out.room.wait()  # the client has not taken enough: read no more
            except grpc.aio.AioRpcError as exc:
                error = exc
            async with state.lock:
                state.connected = False
                state.call = None
            call.cancel()
            final = await streams.ended(error, started)
            if final is not None:
                out.put_nowait(final)
                return
