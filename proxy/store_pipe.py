"""One long-lived Store.DoStream to one store node, shared by every request the proxy sends there.

In gRPC-Python a unary call costs the proxy and the store several times the CPU of a stream
message, and it is paid per request. Here requests queue while the previous batch is being
written and go out together; answers come back batched the same way. A caller sees what a unary
``Store.Do`` would have given it, including the ``grpc.aio.AioRpcError`` of a failed call, so the
leader routing and retry rules of ``store_client`` stay as they are:

- a refusal from the store carries the store's code and message;
- when the stream breaks, every call sent on it fails with the stream's error (a connection that
  never came up reads "failed to connect", so the caller knows nothing was taken), and every call
  still queued fails as never sent;
- a call whose deadline passes fails with DEADLINE_EXCEEDED (the store may still apply it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging

import grpc
import grpc.aio

from protos.storepb import store_pb2

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Requests in one stream message at most; the rest go in the next write.
MAX_BATCH = 512
#: How long a request may wait for an answer to come back before it is sent anyway.
CORK_SECONDS = 0.0005
#: ``store_client`` retries an unreached call; this text says the store never saw it.
NOT_SENT = "failed to connect: the stream to the store ended before the request was sent"


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def _expire(fut: asyncio.Future[bytes]) -> None:
    if not fut.done():
        fut.set_exception(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


class _Stream:
    """One DoStream call: a writer task, a reader task, and the calls sent on it."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.queue: list[store_pb2.DoCall] = []
        self.sent: dict[int, asyncio.Future[bytes]] = {}
        self.unsent: dict[int, asyncio.Future[bytes]] = {}
        self.wake = asyncio.Event()
        self.answered = asyncio.Event()
        self.broken = False
        loop = asyncio.get_running_loop()
        self.tasks = (loop.create_task(self._write()), loop.create_task(self._read()))

    async def _write(self) -> None:
        try:
            while True:
                await self.wake.wait()
                # One turn of the loop first: requests already arriving join this batch.
                await asyncio.sleep(0)
                if self.sent and len(self.queue) < MAX_BATCH:
                    # Calls are in flight: hold this batch until an answer comes back (or
                    # CORK_SECONDS), as Nagle does; under load batches grow by themselves, and
                    # a lone request (nothing in flight) is never held.
                    self.answered.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.answered.wait(), CORK_SECONDS)
                self.wake.clear()
                while self.queue:
                    batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
                    for c in batch:
                        fut = self.unsent.pop(c.id, None)
                        if fut is not None:
                            self.sent[c.id] = fut
                    await self.call.write(store_pb2.DoBatch(calls=batch).SerializeToString())
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as e:
            self.fail(e)
        except Exception as e:  # noqa: BLE001 - a finished call refuses writes; its reader has the status
            self.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, f"raftgate: the store stream failed ({e})"))

    async def _read(self) -> None:
        try:
            async for raw in self.call:
                self.answered.set()
                for result in store_pb2.DoResultBatch.FromString(raw).results:
                    fut = self.sent.pop(result.id, None)
                    if fut is None or fut.done():
                        continue
                    if result.code:
                        fut.set_exception(rpc_error(_CODES.get(result.code, grpc.StatusCode.UNKNOWN),
                                                    result.message))
                    else:
                        fut.set_result(result.response)
            self.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, "raftgate: the store ended the stream"))
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as e:
            self.fail(e)
        except Exception as e:  # noqa: BLE001 - a garbled answer: nothing on this stream can be trusted
            log.error("unexpected answer on the store stream: %s", e)
            self.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, "raftgate: unexpected answer from the store"))

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        """Ends the stream: sent calls get its error, unsent calls the error of a call never made."""
        if self.broken:
            return
        self.broken = True
        for fut in self.sent.values():
            if not fut.done():
                fut.set_exception(error)
        not_sent = rpc_error(grpc.StatusCode.UNAVAILABLE, NOT_SENT)
        for fut in self.unsent.values():
            if not fut.done():
                fut.set_exception(not_sent)
        self.sent.clear()
        self.unsent.clear()
        self.queue.clear()
        self.call.cancel()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class StorePipe:
    """Do over the node's stream; a broken stream is replaced by the next call."""

    def __init__(self, channel: grpc.aio.Channel, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self._open = channel.stream_stream(method)
        self._metadata = metadata
        self._ids = itertools.count(1)
        self._stream: _Stream | None = None

    async def do(self, request: bytes, timeout: float) -> bytes:
        """InternalRaftRequest bytes -> InternalResponse bytes, or the AioRpcError Do would raise."""
        stream = self._stream
        if stream is None or stream.broken:
            stream = self._stream = _Stream(self._open(metadata=self._metadata))
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        fut: asyncio.Future[bytes] = loop.create_future()
        stream.unsent[call_id] = fut
        stream.queue.append(store_pb2.DoCall(id=call_id, request=request))
        stream.wake.set()
        timer = loop.call_later(timeout, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()
            stream.sent.pop(call_id, None)
            stream.unsent.pop(call_id, None)

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.fail(rpc_error(grpc.StatusCode.CANCELLED, "raftgate: the proxy is closing"))
            for task in stream.tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
