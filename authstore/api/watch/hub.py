"""The watch hub: every open watch of a store node, fed from the apply stage in log order.

Flow (etcd's ``watchableStore`` reshaped around the Raft apply stage):

* **Tap** (apply thread, inside the batch's LMDB transaction, after each applied entry): reads
  the records the entry wrote (its MVCC events) and notices a change of the auth state (enabled
  flag, auth revision). On an auth change every open watch is re-checked against the state *at
  that entry*; one no longer permitted is doomed at the entry's KV revision. Both go into a queue
  in log order. The tap only reads LMDB; it never waits for a watcher.
* **Drain** (event loop, after the batch commits): synced watchers get the events of each
  revision; a doomed watcher gets every event up to its revision, then its cancel. Never more.
* **Catch-up** (event loop + a reader thread): a watcher whose start revision lies in the past
  reads history from the MVCC store in chunks until it reaches the drained revision, then joins
  the synced set with no await in between, so no revision is missed or sent twice. A start
  revision below the compaction answers ``compact_revision`` and cancels, as etcd does.
* **Bound** (etcd's unsynced and victim watchers): a stream queues at most ``STREAM_BUFFER_BYTES``
  of responses for its reader. A synced watcher whose events would not fit leaves the synced set
  at that revision and is caught up from history once the stream has drained to half the bound;
  history is read in chunks of half the bound. While the stream is over the bound the hub also
  stops reading the stream's requests. Nothing for a slow reader piles up in memory; what it has
  not taken stays in the MVCC store until compaction (then it gets the compacted cancel).
* **Create** checks permission on the apply thread between batches (``RaftNode.between_batches``)
  and enters the watcher into the apply thread's re-check set there, so no auth change can slip
  between the check and the registration; the event loop then gives it its id and its place in
  the stream and the delivery set.

* **Vouched tokens** (sidecar-class streams): a JWT or workload token the store verified for a
  create is kept with the stream while a watch it created is open; one timer per stream judges
  each such token again every ``RECHECK_SECONDS`` and at its ``exp``, and a token that no longer
  verifies ends its watches with ``invalid auth token`` as an auth change would (simple tokens
  need no timer: every auth change and token drop re-checks their digest).

Each piece of state has one owner thread. The apply thread owns the re-check set and the tap's
position; the event loop owns streams, ids, the delivery set and the delivered revision. They
meet only through two hand-offs: the tap's queue (under a lock) and the queue of removed watchers
the apply thread prunes from its set (``collections.deque``, whose append and popleft are atomic).

Streams are served by the leader only; when it loses leadership every stream fails and the proxy
re-creates its watches on the new leader from the revision each one has not yet seen.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import grpc
import lmdb
from google.protobuf.message import DecodeError

from authstore import metrics
from authstore.api.watch.index import WatchIndex
from authstore.state.auth.authorize import authorize
from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.internal import STREAM_BATCH_BYTES
from protos.mvccpb import kv_pb2
from protos.storepb import store_pb2 as spb
from raftgate.byte_queue import ByteQueue
from raftgate.errors import Err, EtcdError

log = logging.getLogger("raftgate.store.watch")

INVALID_WATCH_ID = -1
EMPTY_RANGE = "mvcc: watcher range is empty"
DUPLICATE_ID = "mvcc: duplicate watch ID provided on the WatchStream"
CATCHUP_CHUNK = 1000  # records per history read (etcd: watchBatchMaxRevs)
#: Responses for one stream that travel to the proxy in one message at most.
MAX_BATCH = 512
_NOTHING_MORE = object()
STREAM_BACKLOG = 20_000  # responses queued for one stream before it is dropped (the proxy resumes)
STREAM_BUFFER_BYTES = 4 << 20  # response bytes one stream queues before its watchers fall back to history
DEFAULT_PROGRESS_INTERVAL = 600.0  # etcd's --watch-progress-notify-interval
DEFAULT_MAX_RESPONSE_BYTES = int(1.5 * 1024 * 1024)  # etcd's --max-request-bytes, for fragments
DEFAULT_MAX_WATCHES_PER_STREAM = 10_000  # --max-watches-per-stream
DEFAULT_MAX_WATCHES_PER_USER = 20_000  # --max-watches-per-user (anonymous watches count as one user)
#: bytes of keys and range ends the open watches of one stream / one user may hold (the count caps
#: alone let one user hold 20,000 creates of up to --max-request-bytes each)
DEFAULT_MAX_WATCH_KEY_BYTES_PER_STREAM = 16 << 20
DEFAULT_MAX_WATCH_KEY_BYTES_PER_USER = 64 << 20
_NOPUT = pb.WatchCreateRequest.NOPUT
_NODELETE = pb.WatchCreateRequest.NODELETE
_EVENTS_FIELD = 11  # WatchResponse.events
#: A token the store verified for a sidecar-class stream (a JWT, a workload token) is verified
#: again this often while watches it opened are open (the central proxy's interval): its key may
#: leave the key ring, or its user-map rule the map, long before its ``exp``.
RECHECK_SECONDS = 2.0
INVALID_TOKEN_REASON = EtcdError(Err.INVALID_AUTH_TOKEN).status_string()
#: Distinct vouched tokens the open watches of one stream may hold (a sidecar sends one client
#: stream's token, or its lent identity's, a few over time): each is judged every RECHECK_SECONDS.
#: A create with one more is refused with etcd's ``too many requests``.
MAX_TOKENS_PER_STREAM = 16

#: Judges a token again: (the user it names, its ``exp`` or None) while it verifies, else None.
TokenJudge = Callable[[str], Awaitable[tuple[str, float | None] | None]]


@dataclass(frozen=True, slots=True)
class Vouched:
    """A sidecar-class caller's watch request with the token the store verified for it (a JWT or
    a workload token: not a simple token, whose digest the auth state re-checks). The watches it
    creates are judged again with the stream's ``TokenJudge`` and end when the token dies."""

    data: bytes
    token: str
    username: str
    expires_at: float | None


@dataclass(slots=True)
class _Held:
    """A vouched token the open watches of one stream were created with."""

    username: str
    expires_at: float | None
    count: int = 0  # open watchers created with it


@dataclass(slots=True)
class Event:
    rev: int
    key: bytes
    record: bytes  # mvccpb.KeyValue bytes as stored (a delete: key and mod_revision only)
    delete: bool
    create: bool
    prev: bytes | None = None
    prev_known: bool = False
    #: the WatchResponse.events field of this event, without and with prev_kv: encoded once and
    #: shared by every watcher it goes to
    _field: bytes | None = None
    _field_prev: bytes | None = None

    def encode(self, with_prev: bool) -> bytes:
        out = (b"\x08\x01" if self.delete else b"") + wire.length_delimited(2, self.record)
        if with_prev and self.prev is not None:
            out += wire.length_delimited(3, self.prev)
        return out

    def field(self, with_prev: bool) -> bytes:
        """The event as a WatchResponse.events field (its prev, if asked for, must be known)."""
        if with_prev and self.prev is not None:
            if self._field_prev is None:
                self._field_prev = wire.length_delimited(_EVENTS_FIELD, self.encode(True))
            return self._field_prev
        if self._field is None:
            self._field = wire.length_delimited(_EVENTS_FIELD, self.encode(False))
        return self._field


def _event(rev: int, record: bytes) -> Event:
    kv = kv_pb2.KeyValue.FromString(record)
    delete = kv.version == 0
    return Event(rev, kv.key, record, delete, not delete and kv.create_revision == kv.mod_revision)


@dataclass(eq=False)
class Watcher:
    stream: Stream
    id: int
    key: bytes
    range_end: bytes  # as etcd's request: b"" one key, b"\x00" every key >= key
    next_rev: int  # the first revision this watcher has not been sent (or skipped)
    username: str
    auth_revision: int
    invalid_token: bool
    current_revision: bool
    no_put: bool = False
    no_delete: bool = False
    prev_kv: bool = False
    progress_notify: bool = False
    fragment: bool = False
    reg_rev: int = 0
    password: bytes = b""
    token_digest: bytes = b""  # the simple token the create came with (its key in the auth store)
    #: the user is a client certificate's CN (the proxy asks for the current revision and sends no
    #: token digest): no token to outlive, no password it was checked with
    certificate: bool = False
    synced: bool = False
    removed: bool = False
    doomed: bool = False  # set on the apply thread: an auth change took its permission
    stop_at: int | None = None  # deliver up to this revision, then cancel with stop_reason
    stop_reason: str = ""
    quiet: bool = True  # no events since the last progress tick
    gid: int = 0
    counted: bool = False  # holds one of its user's places (--max-watches-per-user) and its key bytes
    #: the vouched token it was created with (a key of its stream's ``tokens``), judged again
    token: str | None = None

    @property
    def key_bytes(self) -> int:
        """What this watch counts against the key byte bounds."""
        return len(self.key) + len(self.range_end)

    def matches(self, ev: Event) -> bool:
        if ev.delete and self.no_delete or not ev.delete and self.no_put:
            return False
        end = self.range_end
        if not end:
            return ev.key == self.key
        if end == b"\x00":
            return ev.key >= self.key
        return self.key <= ev.key < end


@dataclass(eq=False)
class Stream:
    watchers: dict[int, Watcher] = field(default_factory=dict)
    next_id: int = 0
    progress_pending: bool = False
    failed: bool = False
    limit: int = STREAM_BUFFER_BYTES
    key_bytes: int = 0  # keys and range ends of the watchers counted on this stream
    #: a sidecar-class stream: judges its vouched tokens again (None: a central caller's stream)
    judge: TokenJudge | None = None
    tokens: dict[str, _Held] = field(default_factory=dict)  # vouched tokens of open watchers
    token_added: asyncio.Event = field(default_factory=asyncio.Event)  # wakes the stream's judging

    #: responses the stream's writer has not taken, bounded in bytes: room while at most `limit`
    #: bytes wait, and again once half is taken (or the stream failed); errors and the end count nothing
    queue: ByteQueue[bytes | BaseException | None] = field(init=False)

    def __post_init__(self) -> None:
        self.queue = ByteQueue(self.limit + 1, resume_at=self.limit // 2)

    @property
    def room(self) -> asyncio.Event:
        return self.queue.room

    def fits(self, size: int) -> bool:
        """Whether `size` more bytes of events may queue (an empty stream takes any one response)."""
        return self.queue.fits(size)

    def send(self, data: bytes) -> None:
        if self.failed:
            return
        if self.queue.qsize() >= STREAM_BACKLOG:
            # A backstop for small control responses (events are bounded in bytes, see fits()):
            # the stream is dropped and the proxy re-creates its watches from what it delivered.
            self.fail(EtcdError(Err.TOO_MANY_REQUESTS))
            return
        self.queue.put_nowait(data)

    def fail(self, error: BaseException) -> None:
        if not self.failed:
            self.failed = True
            self.room.set()  # wakes whoever waits for room, to notice
            self.queue.put_nowait(error)


class WatchHub:
    def __init__(self, applier: Any, node: Any, *, progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
                 max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 max_watches_per_stream: int = DEFAULT_MAX_WATCHES_PER_STREAM,
                 max_watches_per_user: int = DEFAULT_MAX_WATCHES_PER_USER,
                 stream_buffer_bytes: int = STREAM_BUFFER_BYTES,
                 max_watch_key_bytes_per_stream: int = DEFAULT_MAX_WATCH_KEY_BYTES_PER_STREAM,
                 max_watch_key_bytes_per_user: int = DEFAULT_MAX_WATCH_KEY_BYTES_PER_USER) -> None:
        self.applier = applier
        self.node = node
        self.progress_interval = progress_interval
        self.max_response_bytes = max_response_bytes
        self.max_watches_per_stream = max_watches_per_stream
        self.max_watches_per_user = max_watches_per_user
        self.stream_buffer_bytes = stream_buffer_bytes
        self.max_watch_key_bytes_per_stream = max_watch_key_bytes_per_stream
        self.max_watch_key_bytes_per_user = max_watch_key_bytes_per_user
        self._lock = threading.Lock()  # guards the hand-off queue `_pending` only
        self._gids = itertools.count(1)
        # event-loop state: streams, the watchers events are delivered to, the delivered revision
        self._streams: set[Stream] = set()
        self._watchers = WatchIndex()
        self._per_user: dict[str, int] = {}
        self._per_user_key_bytes: dict[str, int] = {}
        # apply-thread state: the watchers an auth change re-checks, the tap's position
        self._live: dict[int, Watcher] = {}
        self._gone: collections.deque[int] = collections.deque()  # loop -> apply: removed gids
        self._stale = True
        self._tap_rev = 0
        self._tap_auth: tuple[bool, int] = (False, 0)
        self._tap_tokens = 0
        self._pending: list[tuple[Any, ...]] = []
        self.rev = 0  # the newest revision whose events synced watchers have been given
        self._head_key: tuple[int, int, int, int] | None = None
        self._head_field = b""
        self._reads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="watch-read")

    def attach(self) -> None:
        """Subscribes to the applier's entries (inside each batch's transaction) and to the node's
        applied batches (on the event loop)."""
        self.applier.subscribe_entries(self.tap)
        self.node.on_applied(self.applied)

    # ---- apply thread ---------------------------------------------------------------------------
    def _prune(self) -> None:
        gone = self._gone
        while gone:
            self._live.pop(gone.popleft(), None)

    def tap(self, txn: lmdb.Transaction) -> None:
        self._prune()
        if not self._live:
            self._stale = True
            return
        kv, auth = self.applier.kv, self.applier.auth
        rev = kv.current_revision(txn)
        out: list[tuple[Any, ...]] = []
        if rev > self._tap_rev:
            out.append(("ev", rev, kv.changes(txn, self._tap_rev + 1, rev)))
            self._tap_rev = rev
        state = (auth.is_enabled(txn), auth.revision(txn))
        tokens = auth.token_count(txn)
        dropped, self._tap_tokens = tokens < self._tap_tokens, tokens  # e.g. a simple token's TTL
        if state != self._tap_auth or dropped:
            self._tap_auth = state
            for gid, w in list(self._live.items()):
                if w.removed:  # a create canceled while it was being admitted
                    del self._live[gid]
                    continue
                if w.doomed:
                    continue
                err = self._check(txn, w, recheck=True)
                if err is not None:
                    w.doomed = True
                    out.append(("cancel", rev, w, err.status_string()))
        if out:
            with self._lock:
                self._pending.extend(out)

    def _check(self, txn: lmdb.Transaction, w: Watcher, *, recheck: bool) -> EtcdError | None:
        """etcd's isWatchPermitted (READ over the watched interval), or a re-check of it."""
        auth = self.applier.auth
        if not auth.is_enabled(txn):
            return None
        if w.invalid_token or (not w.certificate and not self._token_live(txn, w, recheck=recheck)):
            return EtcdError(Err.INVALID_AUTH_TOKEN)
        username = w.username
        revision = auth.revision(txn) if (recheck or w.current_revision) else w.auth_revision
        if recheck and username and not w.certificate:
            user = auth.get_user(txn, username)
            # The user was deleted or its password changed: etcd drops its tokens.
            if user is None or user.password != w.password:
                return EtcdError(Err.INVALID_AUTH_TOKEN)
        req = ipb.InternalRaftRequest(header=ipb.RequestHeader(username=username, auth_revision=revision),
                                      range=pb.RangeRequest(key=w.key, range_end=w.range_end))
        try:
            authorize(auth, txn, req.header, req, lambda _lease: [], read=False)
        except EtcdError as exc:
            return exc
        return None

    def _token_live(self, txn: lmdb.Transaction, w: Watcher, *, recheck: bool) -> bool:
        """The token the watch was created with is still good (etcd checks it at each create).

        A simple token: the store still holds it, for this user. A JWT (a user, no digest): on a
        re-check or a resume, its revision is not older than the user's last password set or the
        last AuthEnable; at a create its revision is checked as etcd does (`revision ... is old`).
        """
        auth = self.applier.auth
        if w.token_digest:
            return auth.token_user(txn, w.token_digest) == w.username
        if recheck and w.username:
            return w.auth_revision >= auth.credentials_revision(txn, w.username)
        return True

    def _admit(self, w: Watcher, resume: bool, refusal: str) -> tuple[str, int, bool]:
        """On the apply thread between batches: checks `w` and enters it into the re-check set;
        (refusal reason or "", current revision, stale). `refusal` is what the event loop found
        (a duplicate id), told after the permission check as etcd orders them."""
        self._prune()
        with self.applier.env.begin() as txn:
            rev = self.applier.kv.current_revision(txn)
            if w.username:
                # The password hash the identity was checked with: a later change cancels the watch.
                user = self.applier.auth.get_user(txn, w.username)
                w.password = user.password if user is not None else b""
            err = self._check(txn, w, recheck=resume)
            if err is not None:
                return err.status_string(), rev, False
            if w.range_end and w.range_end != b"\x00" and w.key >= w.range_end:
                return EMPTY_RANGE, rev, False
            if refusal:
                return refusal, rev, False
            stale = self._stale or not self._live
            if stale:
                self._tap_rev = rev
                self._tap_auth = (self.applier.auth.is_enabled(txn), self.applier.auth.revision(txn))
                self._tap_tokens = self.applier.auth.token_count(txn)
                self._stale = False
            w.reg_rev = rev
            if w.next_rev <= 0:
                w.next_rev = rev + 1
            if not w.removed:
                self._live[w.gid] = w
        return "", rev, stale

    # ---- event loop: create and remove ----------------------------------------------------------
    @staticmethod
    def _refusal(stream: Stream, requested_id: int, resume: bool) -> str:
        """What the loop alone can refuse (before the apply thread checks permission)."""
        if (requested_id != 0 or resume) and requested_id in stream.watchers:
            return DUPLICATE_ID
        return ""

    def _attach(self, w: Watcher, requested_id: int, resume: bool) -> None:
        """Gives an admitted watcher its id and its place in the stream and the delivery set."""
        stream = w.stream
        if requested_id == 0 and not resume:  # etcd's AutoWatchID
            while stream.next_id in stream.watchers:
                stream.next_id += 1
            w.id = stream.next_id
            stream.next_id += 1
        else:
            w.id = requested_id
            if resume:  # the old stream's auto ids went past this one: never hand it out again
                stream.next_id = max(stream.next_id, requested_id + 1)
        stream.watchers[w.id] = w
        self._watchers.add(w)
        metrics.observe_open_watches(len(self._watchers))

    # ---- event loop: drain --------------------------------------------------------------------
    def applied(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
        for item in items:
            if item[0] == "ev":
                self._publish(item[1], item[2])
            else:
                _, rev, w, reason = item
                self._end(w, rev, reason)

    def _end(self, w: Watcher, rev: int, reason: str) -> None:
        """`w` gets its events up to `rev` (the earliest end it was given), then its cancel."""
        if w.stop_at is None or rev < w.stop_at:
            w.stop_at = rev
        if not w.stop_reason:
            w.stop_reason = reason
        if w.synced and not w.removed:
            self._finish(w)

    def _publish(self, rev: int, records: list[tuple[int, bytes]]) -> None:
        """Each revision's events to the synced watchers the index finds for their keys (a synced
        watcher has been given everything up to ``self.rev``; ``next_rev`` moves on a send)."""
        by_rev: dict[int, list[Event]] = {}
        for main, rec in records:
            by_rev.setdefault(main, []).append(_event(main, rec))
        for main, events in by_rev.items():
            hits: dict[int, tuple[Watcher, list[Event]]] = {}
            for ev in events:
                for w in self._watchers.stab(ev.key):
                    if (not w.synced or w.removed or main < w.next_rev
                            or (w.stop_at is not None and main > w.stop_at) or not w.matches(ev)):
                        continue
                    hit = hits.get(w.gid)
                    if hit is None:
                        hits[w.gid] = (w, [ev])
                    else:
                        hit[1].append(ev)
            for gid in sorted(hits):  # in the order the watches were created, as before
                w, mine = hits[gid]
                parts = self._responses(w, mine, main)
                if not w.stream.fits(sum(len(p) for p in parts)):
                    self._fall_behind(w, main)
                    continue
                for part in parts:
                    w.stream.send(part)
                w.next_rev = main + 1
        self.rev = max(self.rev, rev)

    def _fall_behind(self, w: Watcher, rev: int) -> None:
        """etcd's victim: `w` leaves the synced set at `rev` (not sent) and is caught up from history
        once its stream has room, instead of its events piling up in memory."""
        w.synced = False
        w.next_rev = max(w.next_rev, rev)
        asyncio.get_running_loop().create_task(self._catch_up(w))

    # ---- responses -------------------------------------------------------------------------------
    def _header(self, rev: int) -> pb.ResponseHeader:
        return pb.ResponseHeader(cluster_id=self.applier.cluster_id, member_id=self.applier.member_id,
                                 revision=rev, raft_term=self.applier.term)

    def _head(self, rev: int, watch_id: int) -> bytes:
        """WatchResponse{header, watch_id} bytes; the header is encoded once per revision and
        shared by every watcher that revision goes to (the same bytes ``SerializeToString`` gives:
        fields in number order, a zero id omitted)."""
        key = (rev, self.applier.cluster_id, self.applier.member_id, self.applier.term)
        if self._head_key != key:
            self._head_key = key
            self._head_field = wire.length_delimited(1, self._header(rev).SerializeToString())
        return self._head_field + wire.varint_field(2, watch_id) if watch_id > 0 else self._head_field

    def _control(self, stream: Stream, rev: int, watch_id: int, **fields: Any) -> None:
        stream.send(pb.WatchResponse(header=self._header(rev), watch_id=watch_id, **fields).SerializeToString())

    def _fill_prev(self, events: list[Event]) -> None:
        missing = [ev for ev in events if not ev.prev_known and not ev.create]
        if missing:
            with self.applier.env.begin() as txn:
                for ev in missing:
                    ev.prev = self.applier.kv.previous(txn, ev.key, ev.rev)
                    ev.prev_known = True

    def _send_events(self, w: Watcher, events: list[Event], rev: int) -> None:
        for part in self._responses(w, events, rev):
            w.stream.send(part)

    def _responses(self, w: Watcher, events: list[Event], rev: int) -> list[bytes]:
        """The response(s) that carry `events` of revision(s) up to `rev` to `w`."""
        if w.prev_kv:
            self._fill_prev(events)
        head = self._head(rev, w.id)
        encoded = [ev.field(w.prev_kv) for ev in events]
        w.quiet = False
        total = len(head) + sum(len(e) for e in encoded)
        if not w.fragment or total < self.max_response_bytes or len(encoded) < 2:
            return [head + b"".join(encoded)]
        # etcd's sendFragments: fill each fragment up to the limit (at least one event each).
        frag_head = pb.WatchResponse(header=self._header(rev), watch_id=w.id, fragment=True).SerializeToString()
        out, i = [], 0
        while i < len(encoded):
            size, j = len(frag_head), i
            while j < len(encoded) and (j == i or size + len(encoded[j]) < self.max_response_bytes):
                size += len(encoded[j])
                j += 1
            last = j == len(encoded)
            out.append((head if last else frag_head) + b"".join(encoded[i:j]))
            i = j
        return out

    def _finish(self, w: Watcher) -> None:
        """A doomed watcher has everything up to its revision: cancel it with the reason."""
        self._remove(w)
        self._control(w.stream, max(self.rev, w.stop_at or 0), w.id, canceled=True, cancel_reason=w.stop_reason)

    def _remove(self, w: Watcher) -> None:
        if w.removed:
            return
        w.removed = True
        self._watchers.remove(w)
        metrics.observe_open_watches(len(self._watchers))
        if w.stream.watchers.get(w.id) is w:
            del w.stream.watchers[w.id]
        self._unhold(w)
        self._release(w)
        self._gone.append(w.gid)

    def _cap(self, stream: Stream, w: Watcher) -> Err | None:
        """Takes one of the user's places for `w`, or says which cap it would pass.

        Every create is capped, a resume too: any sidecar-class caller can mark a create `resume`,
        so a resume proves nothing about a place held before. The proxy's own resumes fit anyway:
        it re-opens on a fresh stream exactly the watches it held on one stream of the old leader
        (within the per-stream cap there), before anything else, and the old leader's watches are
        gone from this node's counts (a node drops a stream's watches when the stream ends)."""
        size = w.key_bytes
        user_bytes = self._per_user_key_bytes.get(w.username, 0)
        if len(stream.watchers) >= self.max_watches_per_stream or \
                stream.key_bytes + size > self.max_watch_key_bytes_per_stream:
            return Err.TOO_MANY_WATCHES_STREAM
        if self._per_user.get(w.username, 0) >= self.max_watches_per_user or \
                user_bytes + size > self.max_watch_key_bytes_per_user:
            return Err.TOO_MANY_WATCHES_USER
        self._per_user[w.username] = self._per_user.get(w.username, 0) + 1
        self._per_user_key_bytes[w.username] = user_bytes + size
        stream.key_bytes += size
        w.counted = True
        return None

    def _release(self, w: Watcher) -> None:
        if w.counted:
            w.counted = False
            w.stream.key_bytes -= w.key_bytes
            left = self._per_user[w.username] - 1
            if left:
                self._per_user[w.username] = left
                self._per_user_key_bytes[w.username] -= w.key_bytes
            else:
                del self._per_user[w.username]
                del self._per_user_key_bytes[w.username]

    # ---- vouched tokens (sidecar-class streams) ------------------------------------------------------
    @staticmethod
    def _hold(w: Watcher, vouch: Vouched | None) -> None:
        """An attached watcher created with a vouched token: the stream judges the token again."""
        stream = w.stream
        if vouch is None or stream.judge is None or vouch.username != w.username:
            return
        held = stream.tokens.get(vouch.token)
        if held is None:
            held = stream.tokens[vouch.token] = _Held(vouch.username, vouch.expires_at)
            stream.token_added.set()
        elif vouch.expires_at is not None and (held.expires_at is None or vouch.expires_at < held.expires_at):
            held.expires_at = vouch.expires_at
            stream.token_added.set()
        held.count += 1
        w.token = vouch.token

    @staticmethod
    def _unhold(w: Watcher) -> None:
        if w.token is None:
            return
        token, w.token = w.token, None
        held = w.stream.tokens.get(token)
        if held is not None:
            held.count -= 1
            if held.count <= 0:
                del w.stream.tokens[token]

    async def _judge_tokens(self, stream: Stream) -> None:
        """One timer per sidecar-class stream: every RECHECK_SECONDS each distinct vouched token its
        open watches were created with is judged again (a cache hit in the verifier: cheap), and at
        a token's ``exp`` it is dead without asking. A token that no longer verifies, or now names
        another user, ends its watches with etcd's ``invalid auth token`` cancel (auth on)."""
        try:
            await self._judging(stream)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("watch stream: judging its tokens failed")
            stream.fail(EtcdError(Err.NOT_CAPABLE))  # fails closed: the sidecar opens a new stream

    async def _judging(self, stream: Stream) -> None:
        judge = stream.judge
        if judge is None:
            return
        checked = time.monotonic()
        while True:
            if not stream.tokens:
                stream.token_added.clear()
                await stream.token_added.wait()
                checked = time.monotonic()  # the token was verified at its create, just now
                continue
            soonest = min((h.expires_at for h in stream.tokens.values() if h.expires_at is not None),
                          default=math.inf)
            wait = min(checked + RECHECK_SECONDS - time.monotonic(), soonest - time.time())
            if wait > 0:
                stream.token_added.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await stream.token_added.wait()
                continue
            recheck = time.monotonic() >= checked + RECHECK_SECONDS
            if recheck:
                checked = time.monotonic()
            dead: list[str] = []
            for token, held in list(stream.tokens.items()):
                if held.expires_at is not None and not time.time() < held.expires_at:
                    dead.append(token)
                    continue
                if not recheck or stream.tokens.get(token) is not held:
                    continue
                try:
                    verdict = await judge(token)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - an outage, not a verdict: judged again next time
                    log.debug("watch: could not judge a stream's token again: %s", type(exc).__name__)
                    continue
                if verdict is None or verdict[0] != held.username:
                    dead.append(token)
                elif verdict[1] is not None and (held.expires_at is None or verdict[1] < held.expires_at):
                    held.expires_at = verdict[1]
            if dead:
                self._tokens_died(stream, dead)

    def _tokens_died(self, stream: Stream, dead: list[str]) -> None:
        """The watches of `stream` created with a `dead` token end (auth on: etcd ignores tokens
        with auth off, and an AuthEnable re-checks every watch anyway); the tokens are forgotten."""
        gone = {token for token in dead if stream.tokens.pop(token, None) is not None}
        if not gone:
            return
        with self.applier.env.begin() as txn:
            enabled = self.applier.auth.is_enabled(txn)
        for w in list(stream.watchers.values()):
            if w.token is not None and w.token in gone:
                w.token = None
                if enabled and not w.removed:
                    self._end(w, self.rev, INVALID_TOKEN_REASON)

    # ---- catch-up ----------------------------------------------------------------------------------
    def _read_history(self, first: int, last: int, prev: bool, max_bytes: int) -> tuple[int, list[Event], int]:
        """(compaction revision if `first` is compacted else 0, events of first..upto, upto): at
        most CATCHUP_CHUNK records or about `max_bytes` of them, whole revisions."""
        with self.applier.env.begin() as txn:
            kv = self.applier.kv
            compacted = kv.compacted_revision(txn)
            if first < compacted:
                return compacted, [], last
            records = kv.changes(txn, first, last, CATCHUP_CHUNK, max_bytes)
            events = [_event(main, rec) for main, rec in records]
            upto = last
            if records and (len(records) >= CATCHUP_CHUNK or sum(len(r) for _, r in records) >= max_bytes):
                upto = records[-1][0]  # (perhaps) cut short: the next chunk starts after it
            if prev:
                for ev in events:
                    if not ev.create:
                        ev.prev = kv.previous(txn, ev.key, ev.rev)
                    ev.prev_known = True
            return 0, events, upto

    async def _catch_up(self, w: Watcher) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not w.removed:
                target = max(self.rev, w.reg_rev)
                if w.stop_at is not None:
                    target = min(target, w.stop_at)
                if w.next_rev <= target:
                    if not w.stream.room.is_set():
                        await w.stream.room.wait()  # the reader takes what is queued first
                        continue
                    # Half the bound per chunk (prev_kv may double it): the stream stays near it.
                    compacted, events, upto = await loop.run_in_executor(
                        self._reads, self._read_history, w.next_rev, target, w.prev_kv, w.stream.limit // 2)
                    if w.removed:
                        return
                    if compacted:
                        self._remove(w)
                        self._control(w.stream, target, w.id, compact_revision=compacted, canceled=True)
                        return
                    mine = [ev for ev in events if w.matches(ev)]
                    if mine:
                        self._send_events(w, mine, upto)
                    w.next_rev = upto + 1
                    continue
                if w.stop_at is not None:
                    self._finish(w)
                    return
                if w.next_rev > self.rev:
                    w.synced = True
                    self._maybe_progress_all(w.stream)
                    return
        except Exception:
            log.exception("watch %d: catch-up failed", w.id)
            w.stream.fail(EtcdError(Err.NOT_CAPABLE))

    # ---- progress ------------------------------------------------------------------------------------
    def _progress_ok(self, w: Watcher) -> bool:
        return w.synced and not w.removed and w.next_rev <= self.rev + 1

    def _maybe_progress_all(self, stream: Stream) -> None:
        if stream.progress_pending and stream.watchers and all(
                self._progress_ok(w) for w in stream.watchers.values()):
            stream.progress_pending = False
            self._control(stream, self.rev, INVALID_WATCH_ID)

    async def _ticker(self, stream: Stream) -> None:
        while True:
            await asyncio.sleep(self.progress_interval)
            for w in list(stream.watchers.values()):
                if w.progress_notify:
                    if w.quiet and self._progress_ok(w):
                        self._control(stream, self.rev, w.id)
                    w.quiet = True

    # ---- the stream ---------------------------------------------------------------------------------
    async def _handle(self, stream: Stream, data: bytes, vouch: Vouched | None = None) -> None:
        try:
            msg = spb.WatchStreamRequest.FromString(data)
        except DecodeError:
            return
        which = msg.request.WhichOneof("request_union")
        if which == "create_request":
            await self._create(stream, msg, vouch)
        elif which == "cancel_request":
            w = stream.watchers.get(msg.request.cancel_request.watch_id)
            if w is not None:
                self._remove(w)
                self._control(stream, self.rev, w.id, canceled=True)
        elif which == "progress_request":
            stream.progress_pending = True
            self._maybe_progress_all(stream)

    async def _create(self, stream: Stream, msg: spb.WatchStreamRequest, vouch: Vouched | None = None) -> None:
        creq = msg.request.create_request
        key = creq.key or b"\x00"
        if creq.start_revision < 0:
            self._control(stream, self.rev, INVALID_WATCH_ID, created=True, canceled=True,
                          cancel_reason=Err.COMPACTED.message)
            return
        filters = set(creq.filters)
        w = Watcher(stream=stream, id=creq.watch_id, key=key, range_end=creq.range_end,
                    next_rev=creq.start_revision, username=msg.header.username,
                    auth_revision=msg.header.auth_revision, invalid_token=msg.header.invalid_token,
                    current_revision=msg.current_revision or msg.resume, no_put=_NOPUT in filters,
                    no_delete=_NODELETE in filters, prev_kv=creq.prev_kv, progress_notify=creq.progress_notify,
                    fragment=creq.fragment, token_digest=msg.token_digest,
                    certificate=msg.current_revision and not msg.token_digest)
        w.gid = next(self._gids)
        capped = self._cap(stream, w)
        if capped is None and vouch is not None and stream.judge is not None and vouch.token not in stream.tokens \
                and len(stream.tokens) >= MAX_TOKENS_PER_STREAM:
            self._release(w)
            capped = Err.TOO_MANY_REQUESTS
        if capped is not None:  # refused before it costs the apply thread anything
            reason = EtcdError(capped).status_string()
            if msg.resume:  # the client knows this watch: cancel it under its own id
                self._control(stream, self.rev, creq.watch_id, canceled=True, cancel_reason=reason)
            else:
                self._control(stream, self.rev, INVALID_WATCH_ID, created=True, canceled=True, cancel_reason=reason)
            return
        refusal = self._refusal(stream, creq.watch_id, msg.resume)
        try:
            reason, rev, stale = await self.node.between_batches(self._admit, w, msg.resume, refusal)
        except asyncio.CancelledError:
            w.removed = True  # the stream ended meanwhile: the apply thread drops it from its set
            self._release(w)
            self._gone.append(w.gid)
            raise
        if stale:
            self.rev = max(self.rev, rev)
        if reason:
            self._release(w)
            if msg.resume:  # the client knows this watch: cancel it under its own id
                self._control(stream, max(self.rev, rev), creq.watch_id, canceled=True, cancel_reason=reason)
            else:
                self._control(stream, max(self.rev, rev), INVALID_WATCH_ID, created=True, canceled=True,
                              cancel_reason=reason)
            return
        if stream.failed:
            self._remove(w)
            return
        self._attach(w, creq.watch_id, msg.resume)
        self._hold(w, vouch)
        if not msg.resume:
            self._control(stream, rev, w.id, created=True)
        if w.next_rev > max(self.rev, w.reg_rev) and w.stop_at is None:
            w.synced = True
        else:
            asyncio.get_running_loop().create_task(self._catch_up(w))

    async def serve(self, requests: AsyncIterator[bytes | Vouched], context: grpc.aio.ServicerContext,
                    judge: TokenJudge | None = None) -> AsyncIterator[bytes]:
        """One WatchBatches stream, or one sub-stream of a WatchShared stream (whose ``context``
        ends that sub-stream only: authstore/api/watch/shared.py). ``judge``: a sidecar-class
        caller's stream, whose requests may come ``Vouched`` (the store verified their token): the
        watches a vouched token created end when the judge no longer accepts it (see
        ``_judge_tokens``)."""
        try:
            if not self.node.is_leader:
                raise EtcdError(Err.NOT_LEADER)
            await self.node.wait_applied(await self.node.read_index())
        except EtcdError as exc:
            await context.abort(exc.code, exc.message)
        stream = Stream(limit=self.stream_buffer_bytes, judge=judge)
        self._streams.add(stream)

        async def read() -> None:
            try:
                async for item in requests:
                    await stream.room.wait()  # a reader that takes nothing sends no more requests
                    if isinstance(item, Vouched):
                        await self._handle(stream, item.data, item)
                    else:
                        await self._handle(stream, item)
            except EtcdError as exc:
                stream.fail(exc)
            except (asyncio.CancelledError, grpc.RpcError):
                raise
            except Exception:
                log.exception("watch stream failed")
                stream.fail(EtcdError(Err.NOT_CAPABLE))

        tasks = [asyncio.get_running_loop().create_task(read())]
        if self.progress_interval > 0:
            tasks.append(asyncio.get_running_loop().create_task(self._ticker(stream)))
        if judge is not None:
            tasks.append(asyncio.get_running_loop().create_task(self._judge_tokens(stream)))
        try:
            while True:
                item = await stream.queue.get()
                batch: list[bytes] = []
                size = 0
                while isinstance(item, bytes):
                    batch.append(item)
                    size += len(item)
                    if len(batch) >= MAX_BATCH or size >= STREAM_BATCH_BYTES or stream.queue.empty():
                        item = _NOTHING_MORE
                        break
                    item = stream.queue.get_nowait()
                if batch:
                    yield spb.WatchBatch(responses=batch).SerializeToString()
                if item is _NOTHING_MORE:
                    continue
                if isinstance(item, EtcdError):
                    await context.abort(item.code, item.message)
                if isinstance(item, BaseException) or item is None:
                    return
        finally:
            for task in tasks:
                task.cancel()
            self._streams.discard(stream)
            stream.failed = True
            stream.room.set()
            for w in list(stream.watchers.values()):
                self._remove(w)

    def leadership_changed(self, is_leader: bool) -> None:
        """A node that is no longer the leader ends its streams: the proxy resumes them elsewhere."""
        if is_leader:
            return
        for stream in list(self._streams):
            stream.fail(EtcdError(Err.NOT_LEADER))

    def close(self) -> None:
        for stream in list(self._streams):
            stream.fail(EtcdError(Err.STOPPED))
        with contextlib.suppress(Exception):
            self._reads.shutdown(wait=False)


def progress_interval_from_env(environ: dict[str, str], default: float = DEFAULT_PROGRESS_INTERVAL) -> float:
    raw = environ.get("RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL")
    if not raw:
        return default
    try:
        value = float(raw.removesuffix("s"))
    except ValueError:
        value = -1.0
    if value <= 0:
        log.warning("RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL=%r is not a positive number of seconds; using %ss",
                    raw, default)
        return default
    return value

