"""One long-lived Store.DoStream to one store node, shared by every request the proxy sends there.

In gRPC-Python a unary call costs the proxy and the store several times the CPU of a stream
message, and it is paid per request. Here requests queue while answers are outstanding, and the
callers of answers that just came back are waited for a moment (``hold_until``), so they go out
together; answers come back batched the same way. A caller sees what a unary ``Store.Do`` would
have given it, including the ``grpc.aio.AioRpcError`` of a failed call, so the leader routing and
retry rules of ``store_client`` stay as they are. What the caller may do next is told by the
type of the error, decided here, where the facts are known, never by its text:

- a refusal from the store carries the store's code and message (a plain ``AioRpcError``);
- the store opens each stream with its initial metadata; a stream that fails before that took
  nothing, so its calls fail as ``NotSent`` (the caller may send them again);
- when an open stream breaks, the calls written on it fail as ``OutcomeUnknown`` (a write is never
  sent twice), and the calls still queued fail as ``NotSent``;
- an answer larger than one part arrives in parts, interleaved with other answers, and is put
  together for its caller alone, in a buffer bounded by ``max_answer``: the store refuses an
  answer over ``MAX_ANSWER_BYTES`` itself, and one announced larger than the bound fails that call
  alone, with grpc-go's RESOURCE_EXHAUSTED (etcd's server cannot send it either);
- the store's refusal of the stream itself (a wrong secret, no such method) reaches every caller;
  one over a stale challenge (raftgate/secret_proof.py) is answered by opening it again once with
  a new challenge (nothing was sent on it);
- a call whose deadline passes fails with DEADLINE_EXCEEDED, and if it was still queued it is
  never sent.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable

import grpc
import grpc.aio

from protos.internal import ANSWER_ENVELOPE_BYTES, MAX_ANSWER_BYTES, STREAM_BATCH_BYTES
from protos.storepb import store_pb2
from proxy import metrics
from proxy.audit import handlers as audit
from raftgate import stages
from raftgate.event_loop import clock_tick
from raftgate.secret_proof import STALE_METADATA, Prover

log = logging.getLogger(__name__)

_CODES = {code.value[0]: code for code in grpc.StatusCode}
#: Calls in one stream message at most (their bytes are bounded by STREAM_BATCH_BYTES).
MAX_BATCH = 512
#: With calls out and none answered since the last message: how long after that message a request
#: waits for an answer before it is sent anyway (as Nagle does; an answer ends the wait). Counted
#: from the last message, so calls behind a slow one (a large Range) are not held at all.
CORK_SECONDS = 0.002
#: After answers came back: how long, from the first of them, the writer waits for their callers'
#: next calls so that they go out together (a closed-loop client sends its next request within its
#: own round trip). A stream message costs both ends more than a call in it; this wait is what
#: makes batches grow under load (issue 22: 1.5 calls per message at 16 clients before, 3-4 after).
RETURN_SECONDS = 0.002
NOT_SENT = "raftgate: the stream to the store ended before the request was sent"
#: The store refused the stream itself: configuration, not a node going away; callers see it as is.
REFUSED_STREAM = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
                            grpc.StatusCode.UNIMPLEMENTED})


class NotSent(grpc.aio.AioRpcError):
    """The store never saw this call: sending it again, to any node, cannot apply it twice."""


class OutcomeUnknown(grpc.aio.AioRpcError):
    """The call was written on a stream that broke before its answer came: it may have been taken."""


def rpc_error(code: grpc.StatusCode, details: str,
              kind: type[grpc.aio.AioRpcError] = grpc.aio.AioRpcError) -> grpc.aio.AioRpcError:
    return kind(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def answered_error(code: int, message: str) -> grpc.aio.AioRpcError:
    """A status the store sent as data (its code's number and its message), as a call raises it."""
    return rpc_error(_CODES.get(code, grpc.StatusCode.UNKNOWN), message)


async def opened(call: grpc.aio.StreamStreamCall) -> bool:
    """Waits for the store's headers on a new stream (its DoStream and WatchShared send them at
    once): True if it opened the stream, False if it refused it (a trailers-only answer: its status
    is in by then). Nothing may be written before: grpc.aio replaces the status of a call a write
    meets ended with INTERNAL ("Internal error from Core"), and raises InvalidStateError for one
    just after, so the refusal's code (UNIMPLEMENTED, a stale challenge) would be lost."""
    await call.initial_metadata()
    return not call.done()


def too_large(size: int, limit: int) -> grpc.aio.AioRpcError:
    """grpc-go's refusal of a message over the server's send limit (etcd's: math.MaxInt32)."""
    return rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                     f"grpc: trying to send message larger than max ({size} vs. {limit})")


def _expire(fut: asyncio.Future[bytes]) -> None:
    if not fut.done():
        fut.set_exception(rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


#: deadlines of finished calls kept at most this many times the calls in flight (then dropped)
_DEADLINES_SLACK = 4
_DEADLINES_MIN = 256


def _uncork(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def now_at_the_latest(loop: asyncio.AbstractEventLoop) -> float:
    """The latest the time can be now on the loop's clock: its reading plus one tick. uvloop's
    clock counts whole milliseconds, so a wait counted from a plain reading ends up to a tick
    early (measured: 3.1-3.3 calls per stream message at 16 clients, 4.2-4.6 on asyncio's loop);
    counted from this one it lasts at least what it says, and ends on a tick (no timer shorter
    than the clock can count). On asyncio's loop the tick is a nanosecond."""
    return loop.time() + clock_tick(loop)


def holding(until: float, loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a wait until ``until`` (the loop's clock) is still on. Within half a tick of it,
    it is over: a time counted from ``now_at_the_latest`` plus a whole wait lands on a tick, but
    the sum can come out a float's last bit past that tick's reading (on a host up 11.6 days or
    more, a quarter to a half of them), and a wait that missed its tick by a bit ran timers of 0
    until the next one (a millisecond of busy loop on uvloop)."""
    return until - loop.time() > clock_tick(loop) / 2


def hold_until(queued: int, returning: int, returned_at: float, in_flight: int, written_at: float) -> float:
    """Until when (the loop's clock) the writer holds ``queued`` calls back; not after now: send.

    A full batch goes at once. ``returning`` callers were answered since the last message (the
    first answer at ``returned_at``): wait for as many calls, RETURN_SECONDS after that answer at
    most. None answered and ``in_flight`` calls out: wait for an answer, CORK_SECONDS after the
    last message (``written_at``) at most. Nothing out, nothing answered: a lone request, never
    held (one client's latency is not traded for batches)."""
    if queued >= MAX_BATCH:
        return 0.0
    if returning:
        return returned_at + RETURN_SECONDS if queued < returning else 0.0
    return written_at + CORK_SECONDS if in_flight else 0.0


class _Stream:
    """One DoStream call: a writer task, a reader task, and the calls queued and sent on it."""

    def __init__(self, open_call: Callable[[], Awaitable[grpc.aio.StreamStreamCall]], max_answer: int) -> None:
        #: the call, once ``open_call`` gave it (opened, or ended before it opened)
        self.call: grpc.aio.StreamStreamCall | None = None
        self._open_call = open_call
        self._opened = asyncio.Event()
        self.max_answer = max_answer
        self.queue: collections.deque[store_pb2.DoCall] = collections.deque()
        self.sent: dict[int, asyncio.Future[bytes]] = {}
        self.unsent: dict[int, asyncio.Future[bytes]] = {}
        #: Answers arriving in parts: the announced size, the parts so far and their length.
        self.partial: dict[int, tuple[int, list[bytes], int]] = {}
        #: call id -> the user the store verified a sidecar's call as (only calls still in ``sent``)
        self.users: dict[int, str] = {}
        #: call id -> the stage trace of a sampled request (RAFTGATE_TRACE_STAGES; else empty)
        self.traces: dict[int, stages.ProxyTrace] = {}
        self.wake = asyncio.Event()
        #: while the writer holds a batch back: the future an arriving answer (or the timer) settles
        self.corked: asyncio.Future[None] | None = None
        #: calls answered since the last message was written, and when the first of them was
        self.returning = 0
        self.returned_at = 0.0
        #: when the last message was written (the loop's clock)
        self.written_at = 0.0
        self.established = False
        self.broken = False
        #: (deadline, call id) of the calls on this stream, the earliest first; one timer for the
        #: earliest that is still waiting (a timer per call costs more than the call's own work).
        #: A finished call's entry stays until it comes first or the list is pruned.
        self.deadlines: list[tuple[float, int]] = []
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0.0
        loop = asyncio.get_running_loop()
        self.tasks = (loop.create_task(self._write()), loop.create_task(self._read()))

    async def _write(self) -> None:
        try:
            try:
                self.call = call = await self._open_call()
            except grpc.aio.AioRpcError as e:  # no challenge could be had: nothing was sent
                self.fail(e)
                return
            finally:
                self._opened.set()
            if call.done():
                return  # ended before it opened: the reader has its status
            self.established = True
            loop = asyncio.get_running_loop()
            while True:
                await self.wake.wait()
                # One turn of the loop first: requests already arriving join this batch.
                await asyncio.sleep(0)
                # Held while ``hold_until`` says so; an answer, a call queued or the timer ends each wait.
                while holding(until := self._hold_until(), loop):
                    await self._cork(until)
                self.wake.clear()
                # Only the calls the hold let go: one queued while they are written (the store may have
                # read a message before its write returns here) is held in turn (its wake brings us back).
                due = len(self.queue)
                while due and self.queue:
                    if call.done():
                        return  # what is still queued was never written; the reader fails it
                    batch, taken = self._next_batch(due)
                    due -= taken
                    if batch:
                        self.returning = 0
                        self.written_at = now_at_the_latest(loop)
                        metrics.LINK_CALLS_PER_MESSAGE.observe(len(batch))
                        if self.traces:  # before the write: the store may have it before the write returns
                            self._stamp_sent(batch)
                        await call.write(store_pb2.DoBatch(calls=batch).SerializeToString())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the call broke under the write; its reader has the status
            self.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, f"raftgate: the store stream failed ({e})"))

    def _waiting(self, call_id: int) -> asyncio.Future[bytes] | None:
        fut = self.unsent.get(call_id)
        return fut if fut is not None else self.sent.get(call_id)

    def expire_at(self, when: float, call_id: int) -> None:
        """``call_id`` fails with DEADLINE_EXCEEDED at ``when`` (the loop's clock) if still waiting."""
        deadlines = self.deadlines
        if len(deadlines) >= _DEADLINES_MIN and \
                len(deadlines) > _DEADLINES_SLACK * (len(self.sent) + len(self.unsent) + 1):
            deadlines[:] = [d for d in deadlines if d[1] in self.sent or d[1] in self.unsent]
            heapq.heapify(deadlines)
        heapq.heappush(deadlines, (when, call_id))
        if self._expiry is None or when < self._expiry_at:
            self._arm(when)

    def _arm(self, when: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = when
        # A tick later: uvloop rounds a delay to whole milliseconds, so a deadline less than half
        # of one ahead got a timer of 0, found not due, again and again until the clock ticked.
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_at(when + clock_tick(loop), self._expire_due)

    def _expire_due(self) -> None:
        """Fails the calls whose deadline passed; the timer again for the earliest still waiting."""
        self._expiry = None
        deadlines = self.deadlines
        now = asyncio.get_running_loop().time()
        while deadlines:
            when, call_id = deadlines[0]
            fut = self._waiting(call_id)
            if fut is not None and not fut.done():
                if when > now:
                    self._arm(when)
                    return
                _expire(fut)
            heapq.heappop(deadlines)

    def _stop_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.deadlines.clear()

    def _hold_until(self) -> float:
        return hold_until(len(self.queue), self.returning, self.returned_at, len(self.sent), self.written_at)

    def queued(self) -> None:
        """A call was queued: a writer holding calls back goes on if ``hold_until`` no longer holds
        them (a batch now full, or as many calls as returning callers)."""
        if self.corked is not None and not holding(self._hold_until(), asyncio.get_running_loop()):
            _uncork(self.corked)

    async def _cork(self, until: float) -> None:
        """Until an answer arrives, a call is queued that ends the wait, or the loop's clock
        reaches ``until`` (a future and a timer: this is on the path of every batch, where
        ``wait_for`` costs twice as much)."""
        loop = asyncio.get_running_loop()
        fut = self.corked = loop.create_future()
        timer = loop.call_at(until, _uncork, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self.corked = None

    def _stamp_sent(self, batch: list[store_pb2.DoCall]) -> None:
        sent = stages.now()
        for call in batch:
            trace = self.traces.get(call.id)
            if trace is not None:
                trace.sent = sent

    def _next_batch(self, due: int) -> tuple[list[store_pb2.DoCall], int]:
        """Of the first ``due`` queued calls, those whose callers still wait, within the batch
        bounds; they count as sent. With how many queued calls were taken (sent or dropped)."""
        batch: list[store_pb2.DoCall] = []
        size = 0
        taken = 0
        while taken < due and self.queue and len(batch) < MAX_BATCH:
            call = self.queue[0]
            if batch and size + len(call.request) > STREAM_BATCH_BYTES:
                break
            self.queue.popleft()
            taken += 1
            fut = self.unsent.pop(call.id, None)
            if fut is None or fut.done():
                continue  # its caller gave up (deadline or cancellation): never send it
            self.sent[call.id] = fut
            batch.append(call)
            size += len(call.request)
        return batch, taken

    async def _read(self) -> None:
        try:
            await self._opened.wait()
            if self.call is None:
                return  # it never opened: the writer failed the stream
            loop = asyncio.get_running_loop()
            async for raw in self.call:
                out = len(self.sent)
                for result in store_pb2.DoResultBatch.FromString(raw).results:
                    self._answer(result)
                if len(self.sent) < out:  # callers answered (not only parts of an answer)
                    if not self.returning:
                        self.returned_at = now_at_the_latest(loop)
                    self.returning += out - len(self.sent)
                if self.corked is not None:
                    _uncork(self.corked)
            self.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, "raftgate: the store ended the stream"))
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as e:
            self.fail(e)
        except Exception as e:  # noqa: BLE001 - a garbled answer: nothing on this stream can be trusted
            log.error("unexpected answer on the store stream: %s", e)
            self.fail(rpc_error(grpc.StatusCode.UNAVAILABLE, "raftgate: unexpected answer from the store"))

    def _answer(self, result: store_pb2.DoResult) -> None:
        """Settles the call ``result`` answers, or adds a part to its answer."""
        if result.user and (result.id in self.sent):
            self.users[result.id] = result.user  # taken by ``do`` when the call ends
        if self.traces and result.stages:  # a traced call's answer (its only or first part)
            trace = self.traces.get(result.id)
            if trace is not None and len(result.stages) == len(stages.STORE_STAGES) - 1:
                trace.received = stages.now()
                trace.store = list(result.stages)
        response = result.response
        if result.rest:
            partial = self.partial.pop(result.id, None)
            if partial is None:
                return  # its caller gave up, or the answer was refused at its first part
            size, parts, have = partial
            parts.append(response)
            have += len(response)
            if have > size:
                raise ValueError("an answer longer than announced")
            if have < size:
                self.partial[result.id] = (size, parts, have)
                return
            response = b"".join(parts)
        elif result.size:
            fut = self.sent.get(result.id)
            if fut is None or fut.done():
                return
            if result.size > self.max_answer:
                del self.sent[result.id]  # its later parts find no partial answer and are dropped
                fut.set_exception(too_large(result.size, self.max_answer))
                return
            if len(response) < result.size:
                self.partial[result.id] = (result.size, [response], len(response))
                return
        fut = self.sent.pop(result.id, None)
        if fut is None or fut.done():
            return
        if result.code:
            fut.set_exception(answered_error(result.code, result.message))
        else:
            fut.set_result(response)

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        """Ends the stream and answers every call on it (see the module docstring for which error)."""
        if self.broken:
            return
        self.broken = True
        not_sent = rpc_error(grpc.StatusCode.UNAVAILABLE, NOT_SENT, NotSent)
        lost: grpc.aio.AioRpcError
        if error.code() in REFUSED_STREAM:
            lost = not_sent = error
        elif not self.established:
            lost = not_sent
        else:
            # gRPC reports a stream cut under a write as INTERNAL or CANCELLED as often as
            # UNAVAILABLE; to the caller it is one thing, a node that went away.
            log.debug("store stream broke: %s %s", error.code(), error.details())
            lost = rpc_error(grpc.StatusCode.UNAVAILABLE, "raftgate: the stream to the store broke", OutcomeUnknown)
        for fut in self.sent.values():
            if not fut.done():
                fut.set_exception(lost)
        for fut in self.unsent.values():
            if not fut.done():
                fut.set_exception(not_sent)
        self.sent.clear()
        self.unsent.clear()
        self.partial.clear()
        self.queue.clear()
        self._stop_expiry()
        if self.call is not None:
            self.call.cancel()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class StorePipe:
    """Do over the node's stream; a broken stream is replaced by the next call."""

    def __init__(self, channel: grpc.aio.Channel, method: str, prover: Prover | None,
                 *, max_answer: int = MAX_ANSWER_BYTES + ANSWER_ENVELOPE_BYTES) -> None:
        self._open = channel.stream_stream(method)
        self._max_answer = max_answer
        self._prover = prover
        self._ids = itertools.count(1)
        self._stream: _Stream | None = None
        self._closed = False

    async def do(self, request: bytes, timeout: float, method: int = store_pb2.DoCall.DO, *,
                 token: str | None = None) -> bytes:
        """InternalRaftRequest bytes -> InternalResponse bytes, or the AioRpcError Do would raise
        (or, with ``method``, the bytes of that call's request and response)."""
        if self._closed:
            raise rpc_error(grpc.StatusCode.CANCELLED, "raftgate: the proxy is closing")
        stream = self._stream
        if stream is None or stream.broken:
            stream = self._stream = _Stream(self._open_call, self._max_answer)
        loop = asyncio.get_running_loop()
        call_id = next(self._ids)
        fut: asyncio.Future[bytes] = loop.create_future()
        stream.unsent[call_id] = fut
        call = store_pb2.DoCall(id=call_id, request=request, method=method)
        if token is not None:  # a sidecar's: the store verifies it (never logged, never in the log)
            call.token = token
        if stages.ON and method == store_pb2.DoCall.DO:
            trace = stages.CURRENT.get()
            if trace is not None and not trace.sent:
                call.trace = True
                stream.traces[call_id] = trace
        stream.queue.append(call)
        stream.wake.set()
        stream.queued()
        stream.expire_at(loop.time() + timeout, call_id)
        try:
            return await fut
        finally:
            if stream.traces:
                stream.traces.pop(call_id, None)
            user = stream.users.pop(call_id, None)
            if user is not None:  # a sidecar's call: who the store found the client to be
                audit.noted_identity(user, 0)
            stream.sent.pop(call_id, None)
            stream.unsent.pop(call_id, None)
            stream.partial.pop(call_id, None)

    async def _open_call(self) -> grpc.aio.StreamStreamCall:
        """A new DoStream call, open or ended before it opened; one refused over a stale challenge
        (the store restarted, the channel reconnected) is opened once more with a new one."""
        for attempt in range(2):
            metadata = await self._prover.metadata() if self._prover is not None else ()
            call = self._open(metadata=metadata)
            if await opened(call) or attempt or self._prover is None:
                return call
            if not any(key == STALE_METADATA for key, _ in await call.trailing_metadata() or ()):
                return call
            self._prover.forget(metadata)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed = True
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.fail(rpc_error(grpc.StatusCode.CANCELLED, "raftgate: the proxy is closing"))
            await asyncio.gather(*stream.tasks, return_exceptions=True)
