"""One proxy's Store.WatchShared stream to one store node, carrying its client Watch streams.

gRPC-Python pays per message: with one store stream per client Watch stream, a revision that
many watchers see costs the store and the proxy one message per stream. A ``WatchLink`` carries
every client stream of the proxy on one stream to the node as *sub-streams*, the answers of all of
them sharing the store's messages. A ``SubStream`` looks to proxy/watch.py like the
Store.WatchBatches call it replaces (``write``, ``read``, ``cancel``), so resuming, token checks
and tracking stay as they are.

The shared reader never waits for one client: each sub-stream holds at most ``INBOX_BYTES`` of
batches not read yet (one always fits). A batch past that closes the sub-stream at the store and
ends it with etcd's retryable `too many requests` after what it holds: proxy/watch.py delivers
that, then, once its client has room again, resumes the watches on a new sub-stream from the
first revision the client has not seen (the store catches them up from its history).
When the stream itself ends (node gone, leader change, store restart), every open sub-stream ends
with its error after what it holds, and the link is done: the next sub-stream opens a new one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from protos.internal import WATCH_SHARED_MAX_SUBS
from protos.storepb.store_pb2 import WatchSharedBatch, WatchSharedRequest
from proxy import metrics
from proxy.store_pipe import answered_error, opened, rpc_error
from raftgate.errors import Err, EtcdError
from raftgate.secret_proof import Metadata

log = logging.getLogger(__name__)

WATCH_SHARED_METHOD = "/raftgate.storepb.Store/WatchShared"
#: sub-streams one link carries at once (the store's bound): a full link is joined by another
SUBS_PER_LINK = WATCH_SHARED_MAX_SUBS
#: batches one sub-stream may hold unread before it is closed (its client reads too slowly)
INBOX_BYTES = 1 << 20
#: how long a new link waits for the store's opening headers before it writes all the same
OPEN_WAIT_SECONDS = 2.0


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Marks a task's error seen: its waiters (if any are left) were told."""
    if not task.cancelled():
        task.exception()


def _again(error: grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    """A copy of ``error`` (its class, code, details and metadata) without its traceback, to
    raise: one stored error raised again and again gathers each raise's frames, and the requests
    they hold, on its traceback, kept as long as the error is (an awaited future's error does not:
    asyncio raises it with the traceback it was set with)."""
    return copy.copy(error)


class Overflowed(grpc.aio.AioRpcError):
    """A sub-stream's end when its client read too slowly: etcd's retryable `too many requests`.
    No outage: the watches resume at once (on the same stream), from the store's history."""

    def __init__(self) -> None:
        err = EtcdError(Err.TOO_MANY_REQUESTS)
        super().__init__(err.code, grpc.aio.Metadata(), grpc.aio.Metadata(), err.message)

    def __reduce__(self) -> tuple[type[Overflowed], tuple[()]]:
        return Overflowed, ()  # (copied by ``_again``)


class SubStream:
    """One client Watch stream's share of a link, used as a Store.WatchBatches call: ``write`` a
    WatchStreamRequest, ``read`` a WatchBatch (``grpc.aio.EOF`` once closed; raises the
    AioRpcError it ended with), ``cancel`` when done."""

    def __init__(self, link: WatchLink) -> None:
        self.link = link
        #: its number on the link, given at its first write (0 before): the store opens a sub-stream
        #: at the first request naming it and takes only rising numbers, so numbers go in that order
        self.sub = 0
        self._inbox: collections.deque[bytes] = collections.deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        #: what ends it after the inbox (EOF or an AioRpcError); None while open
        self._end: Any = None

    async def write(self, data: bytes) -> None:
        await self.link.send_request(self, data)

    async def read(self) -> Any:
        while not self._inbox:
            if self._end is not None:
                if self._end is grpc.aio.EOF:
                    return grpc.aio.EOF
                raise _again(self._end)
            self._ready.clear()
            await self._ready.wait()
        data = self._inbox.popleft()
        self._bytes -= len(data)
        return data

    def cancel(self) -> bool:
        """Done with it: the store is told (once) unless the sub-stream already ended."""
        if self._end is not None:
            return False
        self.finish(rpc_error(grpc.StatusCode.CANCELLED, "watch sub-stream canceled"))
        self.link.close_sub(self)
        return True

    def done(self) -> bool:
        return self._end is not None

    def check_open(self) -> None:
        """Raises what it ended with (a write to it would be dropped unanswered)."""
        if self._end is not None:
            raise _again(self._end) if isinstance(self._end, grpc.aio.AioRpcError) else rpc_error(
                grpc.StatusCode.CANCELLED, "watch sub-stream closed")

    # ---- the link's side ----
    def deliver(self, batch: bytes) -> bool:
        """A batch for it; False (nothing taken) when it would pass INBOX_BYTES."""
        if self._bytes and self._bytes + len(batch) > INBOX_BYTES:
            return False
        self._inbox.append(batch)
        self._bytes += len(batch)
        self._ready.set()
        return True

    def finish(self, end: Any) -> None:
        """Nothing more comes: ``end`` (EOF or an AioRpcError) after what the inbox holds."""
        if self._end is None:
            self._end = end
            self._ready.set()


class WatchLink:
    """One WatchShared stream to one node, opened at the first sub-stream (with ``metadata()``:
    the proof of the secret, kept in ``proof``); sub-stream ids rise from 1."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Callable[[], Awaitable[Metadata]]) -> None:
        self._channel = channel
        self._metadata = metadata
        self.proof: Metadata = ()
        self._call: grpc.aio.StreamStreamCall | None = None
        self._starting: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._subs: dict[int, SubStream] = {}  # by number: those that wrote
        self._fresh: set[SubStream] = set()  # opened, nothing written yet (no number)
        self._joining = 0  # openers waiting for the stream to start: each will be a sub-stream
        self._next_sub = 1
        self._lock = asyncio.Lock()  # one write at a time on the call
        self._writing: asyncio.Task[None] | None = None  # the last write (see ``_write``)
        self._closes: collections.deque[int] = collections.deque()  # sub-streams to tell the store of
        self._closer: asyncio.Task[None] | None = None
        self._error: grpc.aio.AioRpcError | None = None  # what ended the stream
        #: the stream ended: no new sub-stream on it
        self.dead = False
        #: the node answered WatchShared with UNIMPLEMENTED (a store older than the proxy)
        self.unimplemented = False
        self.ended_at = 0.0  # when the stream ended (time.monotonic)

    def _ended(self) -> grpc.aio.AioRpcError:
        """What a use of the stream after its end raises: what ended it, if it was an error."""
        return _again(self._error) if self._error else rpc_error(grpc.StatusCode.UNAVAILABLE, "watch link ended")

    @property
    def full(self) -> bool:
        """As many sub-streams open as the store serves on one stream: open the next elsewhere."""
        return len(self._subs) + len(self._fresh) + self._joining >= SUBS_PER_LINK

    async def open(self) -> SubStream:
        """A new sub-stream; raises the AioRpcError of the proof's Challenge call (or of the
        stream) when the stream could not be opened."""
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._start())
            self._starting.add_done_callback(_retrieved)
        self._joining += 1
        try:
            await asyncio.shield(self._starting)  # a waiter canceled leaves the start to the others
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not self._starting.cancelled() or (task is not None and task.cancelling()):
                raise  # the waiter's own cancel
            # else the link was closed while it started: an error to resume on, below
        finally:
            self._joining -= 1
        if self.dead:
            raise self._ended()
        sub = SubStream(self)
        self._fresh.add(sub)
        metrics.WATCH_SUBSTREAMS.inc()
        return sub

    async def _start(self) -> None:
        try:
            self.proof = await self._metadata()
        except BaseException:
            self.dead = True
            raise
        call = self._call = self._channel.stream_stream(WATCH_SHARED_METHOD)(metadata=self.proof)
        reader = self._reader = asyncio.get_running_loop().create_task(self._read(call))
        # Nothing is written before the store opened the stream (``opened``); a refused one ends
        # by itself. A store from before it sent its headers at once sends none until its first
        # answer: written to after OPEN_WAIT_SECONDS, as before.
        try:
            async with asyncio.timeout(OPEN_WAIT_SECONDS):
                if not await opened(call):
                    await asyncio.wait((reader,))
        except TimeoutError:
            log.info("watch link: the store sent no headers in %.0f s (a store older than the proxy, or a "
                     "slow one): writing all the same",
                     OPEN_WAIT_SECONDS)

    def _drop(self, sub: SubStream) -> bool:
        """The sub-stream leaves the link: nothing more is delivered to it. False: it had left."""
        if self._subs.get(sub.sub) is sub:
            del self._subs[sub.sub]
        elif sub in self._fresh:
            self._fresh.discard(sub)
        else:
            return False
        metrics.WATCH_SUBSTREAMS.dec()
        return True

    async def send_request(self, sub: SubStream, request: bytes) -> None:
        """Writes a request of ``sub``, numbering it first if this is its first."""
        async with self._lock:
            call = await self._writable()
            sub.check_open()  # (it may have ended while this waited for its turn)
            if sub.sub == 0:
                sub.sub = self._next_sub
                self._next_sub += 1
                self._fresh.discard(sub)
                self._subs[sub.sub] = sub
            await self._write(call, WatchSharedRequest(sub=sub.sub, request=request).SerializeToString())

    async def send(self, message: bytes) -> None:
        async with self._lock:
            await self._write(await self._writable(), message)

    async def _writable(self) -> grpc.aio.StreamStreamCall:
        """Under the lock: the call, once the last write is done (one its caller left may still
        be under way); raises what ended the stream."""
        if self._writing is not None and not self._writing.done():
            await asyncio.wait((self._writing,))
        if self.dead or self._call is None:
            raise self._ended()
        return self._call

    async def _write(self, call: grpc.aio.StreamStreamCall, message: bytes) -> None:
        """Under the lock: writes in a task of its own, which a caller canceled meanwhile (its
        client stream ended) leaves to finish: grpc.aio cancels the whole call when a write is
        canceled, which would end every sub-stream."""
        self._writing = asyncio.get_running_loop().create_task(call.write(message))
        self._writing.add_done_callback(_retrieved)
        try:
            await asyncio.shield(self._writing)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancel
            # the write was canceled under it (the link closed: its node stopped leading or
            # left): a write to an ended stream, not a cancel of the caller (the client stream's
            # reader, which a CancelledError ended)
            raise self._ended() from None
        except asyncio.InvalidStateError:
            # grpc.aio's "RPC already finished": the call's status came in before this write, and
            # the reader has not ended the link yet; what ended it is the reader's to tell
            if self._reader is not None:
                await asyncio.wait((self._reader,))
            raise self._ended() from None

    def close_sub(self, sub: SubStream) -> None:
        """Tells the store the sub-stream is done, without waiting (the reader calls it too); one
        that never wrote is unknown to the store: nothing to tell."""
        self._drop(sub)
        if self.dead or sub.sub == 0:
            return
        self._closes.append(sub.sub)
        if self._closer is None or self._closer.done():
            self._closer = asyncio.get_running_loop().create_task(self._send_closes())

    async def _send_closes(self) -> None:
        while self._closes:
            sub = self._closes.popleft()
            try:
                await self.send(WatchSharedRequest(sub=sub, close=True).SerializeToString())
            except Exception as exc:  # noqa: BLE001 - the stream is gone: the store dropped the sub too
                log.debug("watch link: close of sub-stream %d not sent: %s", sub, exc)
                self._closes.clear()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        end: Any = grpc.aio.EOF
        try:
            while True:
                data = await call.read()
                if data is grpc.aio.EOF:
                    break
                for part in WatchSharedBatch.FromString(data).parts:
                    sub = self._subs.get(part.sub)
                    if sub is None:
                        continue  # closed here: what was under way is dropped
                    if part.end:
                        self._drop(sub)
                        sub.finish(grpc.aio.EOF if part.code == 0 else answered_error(part.code, part.message))
                    elif not sub.deliver(part.batch):
                        log.debug("watch link: sub-stream %d holds too much unread: closed", part.sub)
                        metrics.WATCH_SLOW_CLOSES.inc()
                        sub.finish(Overflowed())
                        self.close_sub(sub)
        except grpc.aio.AioRpcError as exc:
            end = exc
            self.unimplemented = exc.code() == grpc.StatusCode.UNIMPLEMENTED
            self.ended_at = time.monotonic()
        except asyncio.CancelledError:
            end = rpc_error(grpc.StatusCode.CANCELLED, "watch link closed")
            raise
        except Exception as exc:  # noqa: BLE001 - an unparsable message: the stream is no use
            log.warning("watch link: stream to the store failed: %s", exc)
            end = rpc_error(grpc.StatusCode.INTERNAL, "watch link failed")
        finally:
            self._end(end)
            call.cancel()

    def _end(self, end: Any) -> None:
        self.dead = True
        if isinstance(end, grpc.aio.AioRpcError):
            self._error = end
        for sub in [*self._subs.values(), *self._fresh]:
            if self._drop(sub):
                sub.finish(end)

    async def close(self) -> None:
        """Ends the stream; its sub-streams end with CANCELLED."""
        self.dead = True
        for task in (self._starting, self._reader, self._closer, self._writing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._call is not None:
            self._call.cancel()
        self._end(rpc_error(grpc.StatusCode.CANCELLED, "watch link closed"))
