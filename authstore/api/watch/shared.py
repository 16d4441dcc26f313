"""Store.WatchShared: the client Watch streams of one proxy as sub-streams of one store stream.

Why: with a WatchBatches stream per client stream, a revision that 100 streams watch costs the
store 100 gRPC messages, and gRPC-Python's cost per message dominates; one stream carrying the
answers of all of them in shared messages costs one.

Each sub-stream is served by exactly the code that serves a WatchBatches stream (``serve``, given
by the server: the hub's serving, behind the caller class's token verification), fed the requests
the proxy sends for it and given a ``SubContext`` whose ``abort`` ends that sub-stream only: its
status goes to the proxy as an end part, the shared stream goes on. Every input is bounded: the
open sub-streams (``MAX_SUBS``), the requests one sub-stream has not read (``SUB_REQUEST_BYTES``:
past it no more is read until it has room, as HTTP/2 holds back a stream of its own; one that takes
none for ``SUB_STALL_SECONDS`` is ended), those of the whole stream (``REQUEST_BYTES``: no more is
read meanwhile), and the parts the proxy
has not read (``OUT_BYTES``: a sub-stream waits for room, so its hub stream fills and its watchers
fall back to history, exactly as a slow WatchBatches reader's; no more requests are read meanwhile,
as a hub stream reads none while its reader is behind: a refusal's end part is put without waiting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from protos import wire
from protos.internal import STREAM_BATCH_BYTES, WATCH_SHARED_MAX_SUBS
from protos.storepb import store_pb2 as spb
from raftgate.byte_queue import ByteBudget, ByteQueue
from raftgate.errors import STREAM_UNMARSHAL_ERROR_PREFIX, Err

log = logging.getLogger("raftgate.store.watch")

#: sub-streams open at once on one shared stream; one more is ended at once with `too many requests`
MAX_SUBS = WATCH_SHARED_MAX_SUBS
#: request bytes one sub-stream has not read (its hub stream waits for its reader, or takes one
#: create at a time: a proxy's resume sends every watch of a client stream at once, megabytes):
#: past it the shared stream is read no further until it has room again, as HTTP/2 holds back a
#: stream of its own
SUB_REQUEST_BYTES = 1 << 20
#: a sub-stream past SUB_REQUEST_BYTES that takes none of its requests meanwhile is ended with
#: `too many requests` (holding the shared stream back no longer: every sub-stream waits)
SUB_STALL_SECONDS = 5.0
#: request bytes of all sub-streams not read yet: over it the shared stream is read no further
REQUEST_BYTES = 8 << 20
#: parts the proxy has not read yet (as a hub stream's STREAM_BUFFER_BYTES)
OUT_BYTES = 4 << 20
_PARTS_FIELD = 1  # WatchSharedBatch.parts
_TOO_MANY_REQUESTS = Err.TOO_MANY_REQUESTS

#: Serves one sub-stream as a WatchBatches stream: its requests -> its WatchBatch messages.
SubServe = Callable[[AsyncIterator[bytes], "SubContext"], AsyncIterator[bytes]]


class _Status(Exception):
    """An end with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _SubEnded(_Status):
    """A sub-stream's serving aborted (raised inside it by ``SubContext.abort``)."""


class _StreamFailed(_Status):
    """The whole shared stream ends with this status (a request of the proxy's that is wrong)."""


class SubContext:
    """What the hub's serving uses of a ``grpc.aio.ServicerContext``, for one sub-stream: its
    ``abort`` ends the sub-stream, not the call."""

    __slots__ = ()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        raise _SubEnded(code, details)


class _Sub:
    """One open sub-stream: the requests it has not read, and the task serving it."""

    __slots__ = ("id", "requests", "task", "taken")

    def __init__(self, sub_id: int, request_bytes: int) -> None:
        self.id = sub_id
        self.requests: ByteQueue[bytes | None] = ByteQueue(request_bytes)  # None: the proxy sends no more
        self.task: asyncio.Task[None] | None = None
        self.taken = 0  # requests its serving took


def _batch_part(sub: int, batch: bytes) -> bytes:
    """A WatchSharedBatch.parts field carrying ``batch`` as it is (never decoded and encoded again)."""
    head = wire.varint_field(1, sub) + b"\x12" + wire.encode_varint(len(batch))
    return b"\x0a" + wire.encode_varint(len(head) + len(batch)) + head + batch


def _end_part(sub: int, code: int, message: str) -> bytes:
    part = spb.WatchSharedPart(sub=sub, end=True, code=code, message=message).SerializeToString()
    return wire.length_delimited(_PARTS_FIELD, part)


class SharedWatches:
    """One WatchShared stream: its requests demultiplexed to sub-streams, each served by ``serve``
    as a stream of its own, and their answers multiplexed into the stream's messages."""

    def __init__(self, serve: SubServe, *, max_subs: int = MAX_SUBS, sub_request_bytes: int = SUB_REQUEST_BYTES,
                 request_bytes: int = REQUEST_BYTES, out_bytes: int = OUT_BYTES,
                 sub_stall_seconds: float = SUB_STALL_SECONDS) -> None:
        self._serve = serve
        self._max_subs = max_subs
        self._sub_request_bytes = sub_request_bytes
        self._sub_stall_seconds = sub_stall_seconds
        self._full: _Sub | None = None  # a sub-stream past its bound: read no more until it has room
        self._requests = ByteBudget(request_bytes)  # requests read, not yet read by their sub-stream
        #: encoded parts the stream has not written, then what ends it (an exception)
        self._out: ByteQueue[bytes | BaseException] = ByteQueue(out_bytes)
        self._subs: dict[int, _Sub] = {}
        self._highest = 0  # the highest sub-stream id seen: one not above it is never opened again

    async def serve(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """The stream's messages (WatchSharedBatch bytes): every part ready when the stream can
        write, up to STREAM_BATCH_BYTES a message (or one larger part alone)."""
        reader = asyncio.get_running_loop().create_task(self._read(requests))
        out = self._out
        try:
            while True:
                item = await out.get()
                if isinstance(item, _StreamFailed):
                    await context.abort(item.code, item.message)
                if isinstance(item, BaseException):
                    raise item
                parts = [item]
                size = len(item)
                while isinstance(nxt := out.peek(), bytes) and size + len(nxt) <= STREAM_BATCH_BYTES:
                    parts.append(out.get_nowait())  # type: ignore[arg-type]
                    size += len(nxt)
                yield parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            reader.cancel()
            for sub in list(self._subs.values()):
                self._forget(sub)

    # ---- requests ----
    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for raw in requests:
                try:
                    msg = spb.WatchSharedRequest.FromString(raw)
                except DecodeError as exc:
                    raise _StreamFailed(grpc.StatusCode.INTERNAL, STREAM_UNMARSHAL_ERROR_PREFIX + str(exc)) from None
                if msg.sub == 0:
                    raise _StreamFailed(grpc.StatusCode.INTERNAL,
                                        STREAM_UNMARSHAL_ERROR_PREFIX + "WatchSharedRequest names sub-stream 0")
                self._take(msg)
                if self._full is not None:
                    await self._until_room(self._full)
                    self._full = None
                if not self._requests.room.is_set():
                    await self._requests.room.wait()
                while not self._out.room.is_set():  # a proxy that reads nothing sends no more (its
                    await self._out.room.wait()  # requests may add end parts, which never wait)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the stream broke, or a request names no sub-stream: its writer raises it
            self._out.put_nowait(exc)
            return
        # the proxy sends no more: every sub-stream's requests end (their answers go on, as a
        # WatchBatches stream's after its requests end)
        for sub in self._subs.values():
            sub.requests.put_nowait(None)

    def _take(self, msg: spb.WatchSharedRequest) -> None:
        sub = self._subs.get(msg.sub)
        if sub is None:
            if msg.sub <= self._highest:
                return  # ended or closed: nothing more for it is answered
            self._highest = msg.sub
            if msg.close:
                return
            if len(self._subs) >= self._max_subs:
                self._end(msg.sub, _TOO_MANY_REQUESTS.code, _TOO_MANY_REQUESTS.message)
                return
            sub = self._open(msg.sub)
        if msg.close:
            self._forget(sub)
            return
        data = msg.request
        if not data:
            return
        sub.requests.put_nowait(data)
        self._requests.charge(len(data))
        if not sub.requests.room.is_set():
            self._full = sub

    async def _until_room(self, sub: _Sub) -> None:
        """Reads no more until ``sub`` has room; one that takes none of its requests for
        SUB_STALL_SECONDS is ended instead (every other sub-stream waits meanwhile)."""
        while self._subs.get(sub.id) is sub and not sub.requests.room.is_set():
            taken = sub.taken
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._sub_stall_seconds):
                    await sub.requests.room.wait()
            if sub.taken == taken and self._subs.get(sub.id) is sub and not sub.requests.room.is_set():
                self._forget(sub)
                self._end(sub.id, _TOO_MANY_REQUESTS.code, _TOO_MANY_REQUESTS.message)

    def _open(self, sub_id: int) -> _Sub:
        sub = _Sub(sub_id, self._sub_request_bytes)
        self._subs[sub_id] = sub
        sub.task = asyncio.get_running_loop().create_task(self._run(sub))
        return sub

    async def _feed(self, sub: _Sub) -> AsyncIterator[bytes]:
        """The sub-stream's requests, as its own stream would deliver them."""
        while (data := await sub.requests.get()) is not None:
            self._requests.release(len(data))
            sub.taken += 1
            yield data

    def _forget(self, sub: _Sub) -> None:
        """The sub-stream is served no more (its serving, cancelled, removes its watches)."""
        if self._subs.get(sub.id) is not sub:
            return
        del self._subs[sub.id]
        self._requests.release(sub.requests.bytes)
        sub.requests.room.set()  # (the reader may wait for its room: it is gone)
        if sub.task is not None and sub.task is not asyncio.current_task():
            sub.task.cancel()

    # ---- answers ----
    async def _run(self, sub: _Sub) -> None:
        """Serves one sub-stream: each WatchBatch it answers becomes a part, once the stream has
        room; how its serving ended, an end part."""
        code, message = grpc.StatusCode.OK, ""
        serving = self._serve(self._feed(sub), SubContext())
        out = self._out
        try:
            async for batch in serving:
                while not out.room.is_set():  # every waiter wakes at once: the first may fill it again
                    await out.room.wait()
                out.put_nowait(_batch_part(sub.id, batch))
        except _SubEnded as exc:
            code, message = exc.code, exc.message
        except Exception:
            log.exception("watch sub-stream failed")
            code, message = grpc.StatusCode.UNKNOWN, "raftgate: internal error in the store"
        finally:
            await serving.aclose()  # type: ignore[attr-defined]
        if self._subs.get(sub.id) is sub:
            self._forget(sub)
            self._end(sub.id, code, message)

    def _end(self, sub_id: int, code: grpc.StatusCode, message: str) -> None:
        self._out.put_nowait(_end_part(sub_id, code.value[0], message))
