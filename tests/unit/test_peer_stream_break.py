"""Trust item 16: a broken peer stream loses no message the sender took off its queue, and leaves
no task behind.

Two real transports on 127.0.0.1: the sender streams Raft messages to the receiver's gRPC server.
The server is stopped (the stream breaks), messages are sent while it is down, and it is started
again on the same port. Every message sent after the sender noticed the break must arrive once,
in order: Raft repairs a lost append, but not a lost forwarded read (``MsgReadIndex``), so the
transport must not take a message off the queue for a stream that is already gone.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest

from authstore.node.transport import PeerSecurity, Transport, _Peer
from authstore.raft.codec import encode_message
from authstore.raft.types import Message, MessageType
from protos.storepb import peer_pb2
from tests.support.processes import free_port

WAIT = 30.0  # bound of every condition wait (a loaded machine); no assertion on how long it took


async def _until(predicate: Callable[[], object], what: str | Callable[[], str]) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what if isinstance(what, str) else what()}")
        await asyncio.sleep(0.02)


def _others() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]


async def _no_snapshot(_msg: Message, _path: Path) -> None:
    raise AssertionError("no snapshot is sent in this test")


def _transport(me: int, security: PeerSecurity, on_message: Callable[[Message], None],
               on_unreachable: Callable[[int], None], snapshot_dir: Path) -> Transport:
    """A transport bound to callbacks instead of a node."""
    transport = Transport(me, security, snapshot_dir)
    transport.bind(SimpleNamespace(step=on_message, receive_snapshot=_no_snapshot,  # type: ignore[arg-type]
                                   report_unreachable=on_unreachable, is_removed=lambda _peer_id: False,
                                   removed_by_peers=lambda: None))
    return transport


def _msg(index: int) -> Message:
    return Message(MessageType.MsgApp, to=2, frm=1, term=1, index=index)


class _Receiver:
    """Node 2: a Peer server that can be stopped and started again on the same port."""

    def __init__(self, security: PeerSecurity, snapshot_dir: Path) -> None:
        self.port = free_port()
        self.got: list[int] = []
        self.transport = _transport(2, security, lambda m: self.got.append(m.index), lambda _peer: None,
                                    snapshot_dir)
        self.server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = grpc.aio.server(interceptors=self.transport.security.interceptors(2))
        self.server.add_generic_rpc_handlers((self.transport.handler(lambda: b""),))
        assert self.server.add_insecure_port(self.address)
        await self.server.start()

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(None)
        self.server = None


def test_a_broken_peer_stream_loses_no_message_taken_from_the_queue(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="asyncio")

    async def main() -> None:
        security = PeerSecurity(secret=b"s" * 32)
        receiver = _Receiver(security, tmp_path / "r")
        unreachable: list[int] = []
        sender = _transport(1, security, lambda _m: None, unreachable.append, tmp_path / "s")
        await receiver.start()
        try:
            sender.set_peers({2: receiver.address})
            sender.send(_msg(1))
            await _until(lambda: receiver.got == [1], "the first message over a working stream")

            await receiver.stop()  # the stream breaks
            await _until(lambda: unreachable, "the sender to notice the broken stream")
            for i in range(2, 12):  # sent while the peer is down: they wait in the queue
                sender.send(_msg(i))
            await receiver.start()
            await _until(lambda: len(receiver.got) >= 11, lambda: f"all 11 messages (got {receiver.got})")
            assert receiver.got == list(range(1, 12))
        finally:
            await sender.close()
            if receiver.server is not None:
                await receiver.stop()
        # Nothing of the transport outlives close(): no task still waits on a queue or a stream
        # (gRPC's own server tasks end within a few loop turns after the server stopped).
        await _until(lambda: not _others(), lambda: f"tasks left behind: {_others()}")

    asyncio.run(main())
    gc.collect()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors


def test_a_peer_that_never_comes_up_leaves_no_task_or_error_behind(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Streams to a peer that refuses the connection are retried; each attempt is cleaned up."""
    caplog.set_level(logging.ERROR, logger="asyncio")

    async def main() -> None:
        unreachable: list[int] = []
        sender = _transport(1, PeerSecurity(secret=b"s" * 32), lambda _m: None, unreachable.append, tmp_path)
        sender.set_peers({2: f"127.0.0.1:{free_port()}"})  # nothing listens there
        sender.send(_msg(1))
        await _until(lambda: len(unreachable) >= 3, "three failed attempts")
        await sender.close()
        gc.collect()
        await _until(lambda: not _others(), lambda: f"tasks left behind: {_others()}")

    asyncio.run(main())
    gc.collect()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], errors


class _FakeCall:
    """Just enough of a client stream for ``Transport._send_batches``: writes fail once ``broken``."""

    def __init__(self, broken: bool) -> None:
        self.broken = broken
        self.written: list[bytes] = []
        self._callbacks: list[Callable[[object], None]] = []

    def done(self) -> bool:
        return False

    def add_done_callback(self, cb: Callable[[object], None]) -> None:
        self._callbacks.append(cb)

    async def write(self, data: bytes) -> None:
        if self.broken:
            raise asyncio.InvalidStateError("RPC already finished.")
        self.written.append(data)

    def end(self) -> None:
        for cb in self._callbacks:
            cb(self)


def test_a_batch_whose_write_fails_goes_first_on_the_next_stream() -> None:
    """The write of a batch already taken off the queue fails (the stream broke between taking and
    writing): the batch is kept, and the next stream writes it before anything queued later."""

    async def main() -> None:
        peer = _Peer(2, "127.0.0.1:1")
        for i in (1, 2):
            peer.queue.put_nowait(encode_message(_msg(i)))
        await Transport._send_batches(peer, _FakeCall(broken=True))  # type: ignore[arg-type]
        assert peer.held is not None and peer.queue.empty()
        peer.queue.put_nowait(encode_message(_msg(3)))
        call = _FakeCall(broken=False)
        sending = asyncio.ensure_future(Transport._send_batches(peer, call))  # type: ignore[arg-type]
        await _until(lambda: len(call.written) == 2, "both batches on the new stream")
        call.end()
        await sending
        got = [[m.index for m in peer_pb2.MessageBatch.FromString(b).messages] for b in call.written]
        assert got == [[1, 2], [3]]
        assert peer.held is None

    asyncio.run(main())
