"""Raft messages between store nodes over gRPC streams.

Each peer gets one long-lived outbound stream fed from a bounded queue; what queued while the
previous write was under way goes as one batch, framed from the encoded messages without
re-encoding them. Raft tolerates lost messages, so when a peer is slow or down its queue drops
rather than growing, and the core is told the peer is unreachable so it probes instead of
streaming. One task per peer owns its stream: it takes a batch off the queue only while the
stream is up and keeps it until gRPC accepted the write, so a batch whose write fails goes first
on the next stream. What a broken stream can still lose is a batch already written (in flight);
the break is reported as unreachable, so the leader probes and resends what the peer lacks, and
the proxy retries a forwarded read that timed out. Snapshots travel separately, as chunks of a
consistent store copy, so a large transfer never delays heartbeats.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import grpc

from authstore.node.ports import Receiver
from authstore.raft.codec import decode_message, encode_message, message_from_pb
from authstore.raft.types import Message
from protos import wire
from protos.internal import STORE_MESSAGE_BYTES, STREAM_BATCH_BYTES
from protos.raftpb import raft_pb2
from protos.storepb import peer_pb2
from raftgate import secret_proof
from raftgate.private_files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

log = logging.getLogger("raftgate.store.transport")

#: the answer to a member this node saw removed (the sender then stops: Receiver.removed_by_peers)
REMOVED = "raftgate: the sending member was removed from the cluster"

SERVICE = "raftgate.storepb.Peer"
QUEUE_LIMIT = 4096
CHUNK = 256 << 10
MAX_MESSAGE = STORE_MESSAGE_BYTES
#: Longest wait between attempts to reach a peer: a quarter of the default election timeout, so
#: a restarted node hears the leader soon after it listens again (a refused connection costs
#: next to nothing). gRPC's own connection back-off (1 s at first, then up to 120 s) is bounded
#: the same way, or it would hold a new channel to a peer that was down for a while.
RECONNECT_FIRST = 0.05
RECONNECT_MAX = 0.25
BATCH_FIELD = peer_pb2.MessageBatch.DESCRIPTOR.fields_by_name["messages"].number

OnMessage = Callable[[Message], None]
OnSnapshot = Callable[[Message, Path], Awaitable[None]]
OnUnreachable = Callable[[int], None]


def reconnect_delays() -> Iterator[float]:
    """The waits between attempts to open a peer's stream: doubling from RECONNECT_FIRST, then
    RECONNECT_MAX for as long as the peer stays away."""
    delay = RECONNECT_FIRST
    while True:
        yield delay
        delay = min(delay * 2, RECONNECT_MAX)


def channel_options() -> list[tuple[str, int]]:
    """Options of every channel to a peer: message bounds, and gRPC's reconnect back-off."""
    bound_ms = int(RECONNECT_MAX * 1000)
    return [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.initial_reconnect_backoff_ms", int(RECONNECT_FIRST * 1000)),
            ("grpc.min_reconnect_backoff_ms", int(RECONNECT_FIRST * 1000)),
            ("grpc.max_reconnect_backoff_ms", bound_ms)]


class PeerSecurity:
    """How peers prove who they are: mTLS credentials, or an explicit development secret (proven
    over a challenge, never sent: raftgate/secret_proof.py)."""

    def __init__(self, *, secret: bytes | None = None, cert: bytes | None = None, key: bytes | None = None,
                 ca: bytes | None = None) -> None:
        if secret is None and not (cert and key and ca):
            raise ValueError("peer traffic must be authenticated (mTLS or a development secret)")
        self.secret = secret
        self.cert, self.key, self.ca = cert, key, ca

    @property
    def tls(self) -> bool:
        return self.cert is not None

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if not self.tls:
            return None
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True)

    def channel(self, address: str) -> grpc.aio.Channel:
        options = channel_options()
        if self.tls:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                                 certificate_chain=self.cert)
            return grpc.aio.secure_channel(address, creds, options=options)
        return grpc.aio.insecure_channel(address, options=options)

    def interceptors(self, member_id: int) -> list[grpc.aio.ServerInterceptor]:
        """The peer server's: with a secret, every call proves it (as member ``member_id``'s peer)
        before any message is read; Challenge alone is open."""
        if self.secret is None:
            return []  # mTLS already verified the peer's certificate
        challenges = secret_proof.Challenges(secret_proof.PEER, (self.secret,), member_id)
        return [secret_proof.ProofCheck(challenges, "raftgate: peer port requires peer credentials")]

    def prover(self, channel: grpc.aio.Channel, member_id: int | None) -> secret_proof.Prover | None:
        """Proofs for calls on ``channel`` to member ``member_id`` (None: whichever answers)."""
        if self.secret is None:
            return None
        return secret_proof.Prover(channel, self.secret, secret_proof.PEER, member_id)


async def proof_metadata(prover: secret_proof.Prover | None) -> tuple[tuple[str, str], ...]:
    return () if prover is None else await prover.metadata()


class _Peer:
    def __init__(self, peer_id: int, address: str) -> None:
        self.id = peer_id
        self.address = address
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_LIMIT)
        #: a batch taken off the queue whose write has not succeeded yet (sent first on the next stream)
        self.held: bytes | None = None
        self.task: asyncio.Task[None] | None = None
        #: the stream is open (the peer answered it), until it breaks: etcd's peer status "active"
        self.active = False


def _unbound(*_args: object) -> None:
    raise RuntimeError("the transport received a message before a node was bound to it")


class Transport:
    """The real peer transport (authstore/node/ports.py: Peers)."""

    def __init__(self, self_id: int, security: PeerSecurity, snapshot_dir: Path) -> None:
        self.id = self_id
        self.security = security
        self.on_message: OnMessage = _unbound
        self.on_snapshot: OnSnapshot = _unbound  # type: ignore[assignment]
        self.on_unreachable: OnUnreachable = _unbound
        self.is_removed: Callable[[int], bool] = lambda _peer_id: False
        self.on_removed: Callable[[], None] = lambda: None
        self.snapshot_dir = snapshot_dir
        self._peers: dict[int, _Peer] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # stream tasks, until they have finished

    def bind(self, receiver: Receiver) -> None:
        """Names the node that incoming messages, snapshots and unreachable peers are reported to."""
        self.on_message = receiver.step
        self.on_snapshot = receiver.receive_snapshot
        self.on_unreachable = receiver.report_unreachable
        self.is_removed = receiver.is_removed
        self.on_removed = receiver.removed_by_peers

    # ---- peers ----
    def set_peers(self, peers: dict[int, str]) -> None:
        """Starts streams to new peers and stops those no longer in the cluster."""
        for peer_id in list(self._peers):
            if peer_id not in peers:
                self._remove(peer_id)
        for peer_id, address in peers.items():
            if peer_id == self.id:
                continue
            current = self._peers.get(peer_id)
            if current is not None and current.address == address:
                continue
            if current is not None:
                self._remove(peer_id)
            peer = _Peer(peer_id, address)
            peer.task = asyncio.get_running_loop().create_task(self._stream(peer), name=f"peer-{peer_id:x}")
            self._tasks.add(peer.task)
            peer.task.add_done_callback(self._tasks.discard)
            self._peers[peer_id] = peer

    def _remove(self, peer_id: int) -> None:
        peer = self._peers.pop(peer_id)
        if peer.task:
            peer.task.cancel()

    async def close(self) -> None:
        """Stops every stream and returns once their tasks (and channels) are gone."""
        for peer_id in list(self._peers):
            self._remove(peer_id)
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def active_peers(self) -> int:
        """Peers whose stream is open now (etcd's ActivePeers: this member is not counted)."""
        return sum(1 for peer in self._peers.values() if peer.active)

    # ---- sending ----
    def send(self, msg: Message) -> None:
        peer = self._peers.get(msg.to)
        if peer is None:
            return
        try:
            peer.queue.put_nowait(encode_message(msg))
        except asyncio.QueueFull:
            self.on_unreachable(msg.to)

    async def _stream(self, peer: _Peer) -> None:
        delays = reconnect_delays()
        while True:
            channel = self.security.channel(peer.address)
            try:
                open_stream = channel.stream_unary(f"/{SERVICE}/MessageBatches", request_serializer=None,
                                                   response_deserializer=None)
                # a fresh challenge on each new channel: a stale one fails like any broken stream
                metadata = await proof_metadata(self.security.prover(channel, peer.id))
                call = open_stream(metadata=metadata)
                # Nothing leaves the queue until the peer has opened the stream: messages taken
                # for a connection that never came up would be lost (Raft repairs most losses,
                # but not a forwarded read).
                await call.initial_metadata()
                if not call.done():
                    delays = reconnect_delays()
                    peer.active = True
                    await self._send_batches(peer, call)
                await call
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.FAILED_PRECONDITION and exc.details() == REMOVED:
                    self.on_removed()
                log.debug("stream to %x broke: %s", peer.id, exc.code())
            finally:
                peer.active = False
                # This task is the only one that touches the call: nothing of a broken stream
                # outlives it, and closing the channel ends the call if it still runs.
                await channel.close()
            self.on_unreachable(peer.id)
            await asyncio.sleep(next(delays))

    @staticmethod
    async def _send_batches(peer: _Peer, call: grpc.aio.StreamUnaryCall) -> None:
        """Writes batches until the stream ends. A batch is taken off the queue only while the
        stream is up, and it stays in ``peer.held`` until gRPC accepted its write: a batch whose
        write failed goes first on the next stream instead of being lost."""
        ended = asyncio.get_running_loop().create_future()
        call.add_done_callback(lambda _call: ended.done() or ended.set_result(None))
        while True:
            if peer.held is None:
                if peer.queue.empty():
                    getter = asyncio.ensure_future(peer.queue.get())
                    try:
                        await asyncio.wait((getter, ended), return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        if not getter.done():
                            getter.cancel()  # a cancelled get takes nothing off the queue
                            await asyncio.wait((getter,))
                    if getter.cancelled():
                        return
                    first = getter.result()
                else:
                    first = peer.queue.get_nowait()
                batch = bytearray(wire.length_delimited(BATCH_FIELD, first))
                while len(batch) < STREAM_BATCH_BYTES and not peer.queue.empty():
                    batch += wire.length_delimited(BATCH_FIELD, peer.queue.get_nowait())
                peer.held = bytes(batch)
            if call.done():
                return
            try:
                await call.write(peer.held)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return
            peer.held = None

    async def send_snapshot(self, msg: Message, path: Path) -> bool:
        """Streams the store copy at ``path`` to ``msg.to``; True when the peer took it."""
        peer = self._peers.get(msg.to)
        if peer is None:
            return False

        async def chunks() -> AsyncIterator[bytes]:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while data := f.read(CHUNK):
                    digest.update(data)
                    yield peer_pb2.SnapshotChunk(data=data).SerializeToString()
            last = peer_pb2.SnapshotChunk(message=raft_pb2.Message.FromString(encode_message(msg)),
                                          sha256=digest.digest())
            yield last.SerializeToString()

        channel = self.security.channel(peer.address)
        try:
            call = channel.stream_unary(f"/{SERVICE}/Snapshot", request_serializer=None, response_deserializer=None)
            metadata = await proof_metadata(self.security.prover(channel, msg.to))
            await call(chunks(), metadata=metadata)
            return True
        except grpc.aio.AioRpcError as exc:
            log.warning("snapshot to %x failed: %s", msg.to, exc.code())
            return False
        finally:
            await channel.close()

    # ---- receiving ----
    # The peer server's interceptors (PeerSecurity.interceptors) checked the caller before this.
    async def _receive_messages(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        await context.send_initial_metadata(())  # the sender starts taking from its queue now
        warned = False
        async for data in requests:
            for message in peer_pb2.MessageBatch.FromString(data).messages:
                if self.is_removed(getattr(message, "from")):
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, REMOVED)
                if message.to != self.id:
                    # For another member at this address: a node of an older cluster that still
                    # sends to the member this address had (a member restored into a new cluster
                    # has another ID). Taken, it would make this node follow that cluster's leader.
                    if not warned:
                        log.warning("peer messages for member %x dropped: this is member %x (a node of "
                                    "another cluster sends here?)", message.to, self.id)
                        warned = True
                    continue
                self.on_message(message_from_pb(message))
        return b""

    async def _receive_snapshot(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        self.snapshot_dir.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        path = self.snapshot_dir / f"incoming-{id(context):x}.mdb"
        digest = hashlib.sha256()
        last: peer_pb2.SnapshotChunk | None = None
        try:
            path.unlink(missing_ok=True)  # made here, owner-only: never an older file's mode
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                async for data in requests:
                    chunk = peer_pb2.SnapshotChunk.FromString(data)
                    if chunk.HasField("message"):
                        last = chunk
                        break
                    digest.update(chunk.data)
                    f.write(chunk.data)
            if last is None or not hmac.compare_digest(digest.digest(), last.sha256):
                await context.abort(grpc.StatusCode.DATA_LOSS, "raftgate: snapshot incomplete or corrupt")
            assert last is not None
            if last.message.to != self.id:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"raftgate: snapshot for member {last.message.to:x}, this is member {self.id:x}")
            await self.on_snapshot(decode_message(last.message.SerializeToString()), path)
        finally:
            path.unlink(missing_ok=True)
        return b""

    def handler(self, members: Callable[[], bytes]) -> grpc.GenericRpcHandler:
        """The Peer service; ``members`` answers a joining node's question about the member list."""

        async def member_list(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
            return members()

        return grpc.method_handlers_generic_handler(SERVICE, {
            "MessageBatches": grpc.stream_unary_rpc_method_handler(self._receive_messages),
            "Snapshot": grpc.stream_unary_rpc_method_handler(self._receive_snapshot),
            "Members": grpc.unary_unary_rpc_method_handler(member_list),
        })


def peer_address(url: str) -> str:
    """host:port of a peer URL (http://host:port or https://host:port)."""
    rest = url.split("://", 1)[-1]
    return rest.rstrip("/")


