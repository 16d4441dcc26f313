"""The proxy's connection to the store cluster's internal service (raftgate.storepb.Store).

The proxy sends each request to the leader (with ``--store-reads spread``, Range is spread over
the nodes, below), which it learns by asking the nodes (``Store.Leader``).
It knows the nodes from the cluster itself, as etcd's clients auto-sync their endpoints from
MemberList: each Leader answer lists the members with the internal URL each one published, and
the proxy follows that list (from the leader's answer, or the newest term's), so adds, removes
and leader moves need no restart. ``--store-endpoints`` are only seeds, always asked too (a pod
that comes back under its old name is found again). It connects only to addresses it learned over
an authenticated store connection, with the seeds' credentials.

When the leader changes or a node is down it finds the new leader and retries what is safe to
retry: any request the store surely never took (``store_pipe`` says so by the error's type,
``NotSent``, or the store answered that it has no leader), and reads whatever happened
(``OutcomeUnknown`` included). A write whose outcome is unknown is never sent twice; its client
gets etcd's error (`request timed out`, `leader changed`) and decides, as with etcd.

A proxy may stand for one member (``member``, ``--member-store-endpoint``): the member's advertised
client URL, as each etcd member serves its own. Then the requests whose answer is that member's
own (Maintenance.Status, Hash, HashKV) and reads (Range) go to that node and no other, so
``etcdctl endpoint status --cluster`` shows each member's own ID, term and indexes, and
``endpoint health --cluster`` that member's own health (an error for a member that cannot
answer). Everything else (writes included) goes to the leader as usual.
With ``spread_reads``, linearizable and serializable reads (Range) are spread over the voters
(``pick_reader``: the least busy, in turn), as etcd's clients spread over its members: any
voter serves a linearizable read by ReadIndex (it asks the leader for its commit index, which
the leader confirms with a heartbeat round, and answers once it has applied that far), and
checks permissions there against its own auth state at that point, never older than the auth
revision the request is stamped with. A node whose read fails (unreachable, cut off from the
leader: `leader changed`, `request timed out`) gets none for a while and the read is retried on
another. Off by default (``--store-reads leader``): on one small machine, where the nodes share
the cores, the proxy's batching over one stream is worth more than the store CPU spread over
three.
Watch streams are retried here too (``WatchStreams``): proxy/watch.py only resumes its
watches on each new stream.

Do, Credentials and ResolveToken travel on each node's DoStream (``store_pipe``); Do and Snapshot
move raw bytes (the proxy builds and unwraps them by slicing); Leader is a small typed call. Every
call carries the internal credential: mTLS on the channel and/or a proof of the shared secret
(never the secret itself: raftgate/secret_proof.py), over a challenge of the node's own, bound to
the member the proxy means to reach (a learned node: the member the list says it is; a seed: the
one that answers). A refusal over a stale challenge was refused before anything ran: it is asked
again with a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import grpc
import grpc.aio

from protos import wire
from protos.internal import INTERNAL_TOKEN_METADATA
from protos.storepb import store_pb2
from proxy.store_pipe import NotSent, OutcomeUnknown, StorePipe
from proxy.watch_link import Overflowed, SubStream, WatchLink
from raftgate.errors import UNMARSHAL_ERROR_PREFIX, Err, EtcdError, from_message
from raftgate.flow_windows import FIXED_RECEIVE_WINDOW
from raftgate.methods import METHODS, RETRY_FIELDS
from raftgate.secret_proof import INTERNAL, Metadata, Prover, is_stale

log = logging.getLogger(__name__)

_SERVICE = "/raftgate.storepb.Store/"
# The store is trusted; its answers (ranges, snapshots) may be large.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.max_send_message_length", 2**31 - 1),
    # A watch stream the proxy stops reading (its client takes nothing) would otherwise fill a
    # BDP-grown window from the store, about 20 MiB per stalled stream instead of the proxy's 4 MiB
    # bound (proxy/watch.py).
    *FIXED_RECEIVE_WINDOW,
]
# Requests a member proxy sends to its own node: Status, Hash, HashKV (answered from its own
# state), and Range (served by that member as by an etcd member: a follower asks the leader for a
# read index), so a member whose node is down fails `endpoint health` (its probe is a Get).
MEMBER_FIELDS = frozenset(m.field for m in METHODS
                          if (m.service == "Maintenance" and m.name in ("Status", "Hash", "HashKV"))
                          or (m.service == "KV" and m.name == "Range"))
# Answers proving the request never entered the log.
NOT_TAKEN = frozenset({Err.NO_LEADER, Err.NOT_LEADER, Err.STOPPED})
# Answers after which a read may be retried (the write's outcome is unknown).
READ_RETRY = frozenset({Err.TIMEOUT, Err.TIMEOUT_DUE_TO_LEADER_FAIL, Err.LEADER_CHANGED})
DEFAULT_DEADLINE = 10.0
# etcd answers a request it cannot serve after about its request timeout (7 s by default).
RETRY_WINDOW = 7.0
ANSWER_MARGIN = 0.2
#: A live store answers at its own request timeout (it started the clock a little after the
#: proxy did); only a node silent past that is answered for.
SILENCE_GRACE = 0.25
PROBE_TIMEOUT = 1.0
REFRESH_SECONDS = 2.0
BACKOFF = 0.05
#: how long a node whose read failed gets no spread reads (the next discoveries judge it again)
SUSPECT_SECONDS = 2 * REFRESH_SECONDS
#: KV.Range: the reads a proxy spreads over the nodes with ``--store-reads spread``
SPREAD_FIELDS = frozenset(m.field for m in METHODS if m.service == "KV" and m.name == "Range")
#: at most this many store nodes are followed (etcd's clusters are a handful of members)
MAX_MEMBERS = 64
#: a node no longer in the member list is closed this long after it left (calls under way end first)
RETIRE_SECONDS = DEFAULT_DEADLINE + RETRY_WINDOW

T = TypeVar("T")


@dataclass(frozen=True)
class InternalTLS:
    ca: bytes
    cert: bytes
    key: bytes


class _Endpoint:
    def __init__(self, target: str, channel: grpc.aio.Channel, secret: bytes | None,
                 member_id: int | None = None) -> None:
        self.target = target
        self.channel = channel
        #: the proofs of the shared secret on this channel (None: mTLS)
        self.prover = Prover(channel, secret, INTERNAL, member_id) if secret else None
        self.pipe = StorePipe(channel, _SERVICE + "DoStream", self.prover)
        self.snapshot = channel.unary_stream(_SERVICE + "Snapshot")
        self.leader = channel.unary_unary(
            _SERVICE + "Leader",
            request_serializer=store_pb2.LeaderRequest.SerializeToString,
            response_deserializer=store_pb2.LeaderResponse.FromString,
        )
        #: calls under way on this node (the spreading choice takes the least busy)
        self.outstanding = 0
        #: the last discovery found it a voter that follows a leader (or leads): it may serve reads
        self.serves_reads = False
        #: a read on it failed (unreachable, cut off from the leader): no spread reads until then
        self.suspect_until = 0.0
        #: the proxy's client Watch streams on this node, as sub-streams of one stream (WatchShared),
        #: or of a few once one is full (kept once opened, at most the peak's worth: closed with the node)
        self.watch_links: list[WatchLink] = []

    async def metadata(self, timeout: float | None = None) -> Metadata:
        """What each call carries: a proof of the secret (raises the Challenge call's error)."""
        return await self.prover.metadata(timeout) if self.prover is not None else ()

    async def proven(self, invoke: Callable[[Metadata], Awaitable[T]], timeout: float | None = None) -> T:
        """``invoke(metadata)``, once more with a new challenge if the store called it stale."""
        if self.prover is None:
            return await invoke(())
        return await self.prover.call(invoke, timeout)


def pick_reader(endpoints: Sequence[_Endpoint], leader: _Endpoint, now: float, turn: int) -> _Endpoint:
    """The node for the next spread read: of the nodes that may serve reads and are not suspect,
    one with the fewest reads outstanding, ties taken in turn (``turn``: a counter); the leader
    when there is none. Any voter serves a linearizable read (ReadIndex: it asks the leader for
    its commit index and answers once it has applied that far), so reads grow with the cluster."""
    best: list[_Endpoint] = []
    least = 0
    for ep in endpoints:
        if not ep.serves_reads or ep.suspect_until > now:
            continue
        if not best or ep.outstanding < least:
            best, least = [ep], ep.outstanding
        elif ep.outstanding == least:
            best.append(ep)
    return best[turn % len(best)] if best else leader


def _target(url: str) -> str | None:
    """host:port of a published internal URL (its scheme is ignored: the proxy dials every node
    with the seeds' credentials); None if it is not one."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not u.hostname or not port:
        return None
    return f"[{u.hostname}]:{port}" if ":" in u.hostname else f"{u.hostname}:{port}"


def request_field(internal_request: bytes) -> int:
    """The field number of the request inside InternalRaftRequest bytes (after the header)."""
    pos = 0
    while pos < len(internal_request):
        key, pos = wire.decode_varint(internal_request, pos)
        if key & 7 != 2:
            return 0
        length, pos = wire.decode_varint(internal_request, pos)
        if key >> 3 != wire.HEADER_FIELD:
            return key >> 3
        pos += length
    return 0


#: a Snapshot stream's own ends: the client's deadline passed, or the client went away
_SNAPSHOT_PASS_THROUGH = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


def _etcd_error(error: grpc.aio.AioRpcError) -> Err | None:
    err = from_message(error.details() or "")
    return err if err is not None and err.code == error.code() else None


class StoreClient:
    def __init__(self, targets: str | list[str] | tuple[str, ...], *, secret: str | None = None,
                 tls: InternalTLS | None = None, member: str | None = None, spread_reads: bool = False) -> None:
        if isinstance(targets, str):
            targets = [targets]
        self._secret = secret.encode() if secret else None
        self._tls = tls
        self._seeds = tuple(dict.fromkeys(targets))
        self._endpoints = [_Endpoint(t, self._channel(t, tls), self._secret) for t in self._seeds]
        self._leader = self._endpoints[0]
        #: the leader discovery last named, as (member ID, Raft term); None before the first
        self._leadership: tuple[int, int] | None = None
        #: endpoints that left the member list, with when they left: closed after RETIRE_SECONDS
        self._retired: list[tuple[float, _Endpoint]] = []
        self._closing: set[asyncio.Task[None]] = set()  # retired endpoints being closed (kept referenced)
        #: the node this proxy stands for (a member proxy), else None
        self._member = _Endpoint(member, self._channel(member, tls), self._secret) if member else None
        self._spread_reads = spread_reads
        self._turns = itertools.count()
        self._discovery: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        #: member ID -> where its proxy serves the JSON gateway, from the newest member list heard
        self._gateways: dict[int, tuple[str, ...]] = {}

    @staticmethod
    def _channel(target: str, tls: InternalTLS | None) -> grpc.aio.Channel:
        if tls is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                                 certificate_chain=tls.cert)
            return grpc.aio.secure_channel(target, creds, options=_CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)

    # ---- leader discovery ----
    def start(self) -> None:
        """Keeps the leader guess and the member list fresh in the background (every
        REFRESH_SECONDS), so requests rarely meet a stale one."""
        if self._refresher is None:
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    @property
    def targets(self) -> list[str]:
        """The store nodes this proxy follows now (seeds and learned members)."""
        return [ep.target for ep in self._endpoints]

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            with contextlib.suppress(Exception):
                await self._discover()

    async def _discover(self) -> None:
        """Asks every node whom it follows and whom the cluster has; the answer with the highest
        term names the leader, and the member list is followed (then the nodes just learned are
        asked too: the leader may be one of them)."""

        async def ask(ep: _Endpoint) -> store_pb2.LeaderResponse | None:
            try:
                return await ep.proven(lambda md: ep.leader(store_pb2.LeaderRequest(), timeout=PROBE_TIMEOUT,
                                                            metadata=md), PROBE_TIMEOUT)
            except grpc.aio.AioRpcError:
                return None

        asked: dict[str, store_pb2.LeaderResponse | None] = {}
        for _ in range(2):
            todo = [ep for ep in self._endpoints if ep.target not in asked]
            for ep, answer in zip(todo, await asyncio.gather(*(ask(ep) for ep in todo)), strict=True):
                asked[ep.target] = answer
            got = [(ep, a) for ep in self._endpoints if (a := asked.get(ep.target)) is not None]
            by_id = {a.member_id: ep for ep, a in got}
            best = max((a for _, a in got if a.leader_id), key=lambda a: a.raft_term, default=None)
            if best is None:
                for ep in todo:
                    ep.serves_reads = False
                self._learn_gateways(a for _, a in got)
                return
            # The leader's own list is the newest; else the list of the answer naming it.
            source = next((a for _, a in got if a.member_id == best.leader_id), best)
            self._gateways = {m.id: tuple(m.gateway_urls) for m in source.members}
            learners = {m.id for m in source.members if m.is_learner}
            for ep in todo:
                a = asked[ep.target]
                # a voter that follows the newest leader; a learner is not asked (etcd refuses it)
                ep.serves_reads = (a is not None and a.leader_id == best.leader_id
                                   and a.raft_term == best.raft_term and a.member_id not in learners)
            changed = self._follow(source.members)
            if best.leader_id in by_id:
                if by_id[best.leader_id] is not self._leader:
                    log.info("store leader is %s (term %d)", by_id[best.leader_id].target, best.raft_term)
                    # Another node leads in a newer term: the old one's shared watch streams end.
                    # Not for the same node under another of its addresses (a seed's and the one
                    # it publishes), nor for an answer older than the leadership already known.
                    old = asked.get(self._leader.target)  # the old endpoint's own answer names its node
                    if old is not None:
                        old_id: int | None = old.member_id
                    else:
                        old_id = self._leadership[0] if self._leadership is not None else None
                    if old_id != best.leader_id and (self._leadership is None
                                                     or best.raft_term > self._leadership[1]):
                        self._end_watch_links(self._leader)
                self._leader = by_id[best.leader_id]
                # (even older than the last: the leader taken, as Raft terms start again in a
                # cluster restored at the same addresses; kept, the next change would end nothing)
                self._leadership = (best.leader_id, best.raft_term)
                return
            if not changed:
                return

    def _learn_gateways(self, answers: Iterable[store_pb2.LeaderResponse]) -> None:
        """No node names a leader: the gateway URLs of members not heard of yet, from the newest
        list a node holds (etcd answers its member list without a leader too); what a leader's
        list said is kept."""
        newest = max(answers, key=lambda a: a.raft_term, default=None)
        if newest is not None:
            self._gateways = {m.id: tuple(m.gateway_urls) for m in newest.members} | self._gateways

    def _follow(self, members: list[store_pb2.StoreMember]) -> bool:
        """Makes the endpoints the seeds plus the members' published internal addresses (every URL
        of each; at most MAX_MEMBERS in all); True if
        any was added. A list without addresses (a store that does not publish them) changes
        nothing."""
        learned: list[str] = []
        #: the member each learned address belongs to (the proofs sent there name it)
        owner: dict[str, int] = {}
        depth = 0  # every member's first URL, then every second one, ... (the first may be unreachable)
        while len(learned) < MAX_MEMBERS:
            row = [(m.id, m.internal_urls[depth]) for m in members if len(m.internal_urls) > depth]
            if not row:
                break
            for mid, url in row:
                target = _target(url)
                if target is not None and target not in learned and len(learned) < MAX_MEMBERS:
                    learned.append(target)
                    owner[target] = mid
            depth += 1
        if not learned:
            return False
        wanted = list(dict.fromkeys([*learned, *self._seeds]))
        now = time.monotonic()
        have = {ep.target: ep for ep in self._endpoints}
        added = [t for t in wanted if t not in have]
        for ep in self._endpoints:
            if ep.target not in wanted and ep is not self._leader:
                log.info("store node %s left the member list", ep.target)
                self._retired.append((now, ep))
        # Closed once their calls had time to end; and never more than MAX_MEMBERS waiting (the
        # oldest first), so a list that keeps changing cannot pile up open channels.
        while self._retired and (now - self._retired[0][0] > RETIRE_SECONDS or len(self._retired) > MAX_MEMBERS):
            _, ep = self._retired.pop(0)
            task = asyncio.get_running_loop().create_task(self._close_endpoint(ep))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        for t in added:
            log.info("store node %s joined the member list", t)
        kept = [ep for ep in self._endpoints if ep.target in wanted or ep is self._leader]
        self._endpoints = kept + [_Endpoint(t, self._channel(t, self._tls), self._secret,
                                            None if t in self._seeds else owner.get(t)) for t in added]
        return bool(added)

    def _end_watch_links(self, ep: _Endpoint) -> None:
        """The node no longer leads: its shared watch streams end, so their sub-streams resume on
        the new leader. A node that stopped leading ends them itself; one paused, or cut off with
        its connections open, never would, and its watches would wait for it for good."""
        links = [link for link in ep.watch_links if not link.dead]
        ep.watch_links = [link for link in ep.watch_links if link.dead]  # (those refused: remembered)
        for link in links:
            task = asyncio.get_running_loop().create_task(link.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close_endpoint(ep: _Endpoint) -> None:
        for link in ep.watch_links:
            await link.close()
        await ep.pipe.close()
        await ep.channel.close()

    def gateway_urls(self) -> dict[int, tuple[str, ...]]:
        """Member ID -> the gateway URLs it published (``--advertise-gateway-urls``), as of the
        newest member list heard (refreshed every REFRESH_SECONDS, or by ``refresh_members``)."""
        return dict(self._gateways)

    async def refresh_members(self) -> None:
        """Asks the nodes for the member list now (one discovery, shared with concurrent callers)."""
        await self._rediscover()

    async def node_state(self, timeout: float) -> store_pb2.LeaderResponse | None:
        """What the node this proxy stands for (a member proxy: its own node, as an etcd member
        answers /health for itself; else the leader as the cluster names it) says of itself: the
        leader it follows (0: none) and the alarms it has applied; None when no node answers
        within ``timeout``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                for attempt in range(2):
                    ep = self._member or self._leader
                    try:
                        return await ep.proven(lambda md, ep=ep: ep.leader(store_pb2.LeaderRequest(alarms=True),
                                                                           timeout=timeout, metadata=md), timeout)
                    except grpc.aio.AioRpcError:
                        if self._member is not None or attempt:
                            return None
                        await self._rediscover()  # the leader guessed may be gone: ask the others
        return None

    async def _rediscover(self) -> None:
        """One discovery at a time, shared by every request that noticed the leader is gone."""
        if self._discovery is None or self._discovery.done():
            self._discovery = asyncio.get_running_loop().create_task(self._discover())
        await asyncio.shield(self._discovery)

    def _reader(self) -> _Endpoint:
        return pick_reader(self._endpoints, self._leader, time.monotonic(), next(self._turns))

    async def _call(self, invoke: Callable[[_Endpoint, float | None], Awaitable[T]], timeout: float | None,
                    *, read: bool, spread: bool = False) -> T:
        """Sends to the leader (``spread``: a read, to the node ``pick_reader`` chooses); on failure
        finds the leader again and retries what is safe (a spread read: on another node, the one
        that failed is suspect for SUSPECT_SECONDS).

        Retries stop early enough to answer with etcd's own error before the client's deadline:
        `no leader` when no node leads (or none can be reached), and, for a write cut off by a
        broken connection, `request timed out, possibly due to connection lost` (it may or may
        not have been applied, so it is never sent twice). A node silent for etcd's whole request
        timeout (a paused leader keeps its connections open) is answered for as etcd would:
        `request timed out` (`…, possibly due to previous leader failure` once another node leads).
        """
        now = time.monotonic()
        client_deadline = now + (timeout if timeout is not None else DEFAULT_DEADLINE)
        retry_deadline = min(client_deadline - ANSWER_MARGIN, now + RETRY_WINDOW)
        # etcd answers by its request timeout whatever became of its leader. A node that stops
        # answering without closing its connections (paused, frozen) would otherwise hold the
        # call until the client's own deadline.
        answer_deadline = now + RETRY_WINDOW + SILENCE_GRACE
        while True:
            endpoint = self._reader() if spread else self._leader
            answer: grpc.aio.AioRpcError | None = None  # the store's answer, raised if time runs out
            endpoint.outstanding += 1
            try:
                return await invoke(endpoint, max(min(client_deadline, answer_deadline) - time.monotonic(), 0.001))
            except NotSent:
                pass  # the store never saw it: send it again
            except OutcomeUnknown:
                if not read:
                    raise EtcdError(Err.TIMEOUT_DUE_TO_CONNECTION_LOST) from None
                # a read: asking again changes nothing
            except grpc.aio.AioRpcError as error:
                # The store's answer (or the client's deadline): retried only when it is etcd's
                # proof that the request never entered the log, or, for a read, leader trouble.
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and answer_deadline < client_deadline:
                    endpoint.suspect_until = time.monotonic() + SUSPECT_SECONDS
                    if endpoint is not self._leader and spread:
                        raise EtcdError(Err.TIMEOUT) from None  # a silent follower: etcd's own answer
                    raise EtcdError(await self._silent(endpoint, client_deadline, read=read)) from None
                err = _etcd_error(error)
                if err is None or (err not in NOT_TAKEN and not (read and err in READ_RETRY)):
                    raise
                answer = error
            finally:
                endpoint.outstanding -= 1
            endpoint.suspect_until = time.monotonic() + SUSPECT_SECONDS
            if time.monotonic() + BACKOFF >= retry_deadline:
                if answer is not None and _etcd_error(answer) not in NOT_TAKEN:
                    raise answer
                # not leader / stopped are the store's internal proofs (never etcd's answers)
                raise EtcdError(Err.NO_LEADER)
            await self._rediscover()
            if self._leader is endpoint:
                await asyncio.sleep(BACKOFF)

    async def _silent(self, endpoint: _Endpoint, client_deadline: float, *, read: bool) -> Err:
        """etcd's answer to a request its node held for the whole request timeout: the leader
        changed meanwhile (the silent node was a paused leader) or it did not."""
        if self._leader is endpoint:
            left = min(PROBE_TIMEOUT, client_deadline - ANSWER_MARGIN - time.monotonic())
            if left > 0:  # (no time left: no probe)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await self._rediscover()
        if self._leader is endpoint:
            return Err.TIMEOUT
        return Err.LEADER_CHANGED if read else Err.TIMEOUT_DUE_TO_LEADER_FAIL

    # ---- the calls ----
    async def do(self, internal_request: bytes, timeout: float | None = None, *, token: str | None = None,
                 field: int | None = None) -> bytes:
        """InternalRaftRequest bytes -> InternalResponse bytes; store errors raise AioRpcError.
        ``token``: a sidecar's client token, for the store to verify (its header is then ignored).
        ``field``: the request's field number when the caller knows it (else read from the bytes)."""
        if field is None:
            field = request_field(internal_request)
        if self._member is not None and field in MEMBER_FIELDS:
            return await self._on_member(self._member, internal_request, timeout, token)
        read = field in RETRY_FIELDS  # only reads: retrying one never applies anything twice
        spread = self._spread_reads and field in SPREAD_FIELDS
        return await self._call(lambda ep, t: ep.pipe.do(internal_request, t, token=token), timeout, read=read,
                                spread=spread)

    @staticmethod
    async def _on_member(member: _Endpoint, internal_request: bytes, timeout: float | None,
                         token: str | None = None) -> bytes:
        """A read answered by this proxy's own member and no other; retried there (all are reads)
        while the member is unreachable. As with an etcd member that is down or cut off, a client
        whose deadline comes before etcd's request timeout meets its own deadline (etcdctl:
        `context deadline exceeded`); any other gets etcd's `request timed out`."""
        now = time.monotonic()
        client_deadline = now + (timeout if timeout is not None else DEFAULT_DEADLINE)
        # a client that gives up first is never answered for
        retry_deadline = min(client_deadline, now + RETRY_WINDOW)
        while True:
            answer: grpc.aio.AioRpcError | None = None
            try:
                return await member.pipe.do(internal_request, max(client_deadline - time.monotonic(), 0.001),
                                            token=token)
            except (NotSent, OutcomeUnknown):
                pass
            except grpc.aio.AioRpcError as error:
                err = _etcd_error(error)
                if err is None or (err not in NOT_TAKEN and err not in READ_RETRY):
                    raise
                answer = error
            if time.monotonic() + BACKOFF >= retry_deadline:
                if retry_deadline == client_deadline:
                    # past the client's deadline: what it sees is its own `deadline exceeded`
                    await asyncio.sleep(max(client_deadline - time.monotonic(), 0) + SILENCE_GRACE)
                if answer is not None:
                    raise answer
                raise EtcdError(Err.TIMEOUT)
            await asyncio.sleep(BACKOFF)

    async def snapshot(self, internal_request: bytes, timeout: float | None = None, *,
                       token: str | None = None) -> AsyncIterator[bytes]:
        """The raw SnapshotResponse messages of Store.Snapshot, from the leader.

        Until its first message a snapshot is safe to ask of another node: a leader guess that
        went stale (the leader just died) is corrected as `_call` does, when there is another
        node to ask. A store node lost during the stream, or the only one, ends it with
        SNAPSHOT_LOST (code Unknown): etcd's clients retry a stream that failed with Unavailable
        before its first message, and each retry would meet the same lost node, so
        `etcdctl snapshot save` would never end.
        The store's own answers (refusals, its own failure) pass through as they are. A client
        that goes away first cancels the store's stream: nothing else would (the store would keep
        its copy of the database, blocked on a stream nobody reads, for ever).
        """
        now = time.monotonic()
        client_deadline = now + timeout if timeout is not None else None
        retry_deadline = min((client_deadline or now + DEFAULT_DEADLINE) - ANSWER_MARGIN, now + RETRY_WINDOW)
        stale_retried = False
        while True:
            endpoint = self._leader
            remaining = None if client_deadline is None else max(client_deadline - time.monotonic(), 0.001)
            call: grpc.aio.UnaryStreamCall | None = None
            proof: Metadata = ()
            started = False
            try:
                proof = await endpoint.metadata(remaining)
                metadata = proof if token is None else (*proof, (INTERNAL_TOKEN_METADATA, token))
                call = endpoint.snapshot(internal_request, timeout=remaining, metadata=metadata)
                async for chunk in call:
                    started = True
                    yield chunk
                return
            except grpc.aio.AioRpcError as error:
                if not started and not stale_retried and endpoint.prover is not None and is_stale(error):
                    endpoint.prover.forget(proof)  # refused before it ran: once more, with a new challenge
                    stale_retried = True
                    continue
                if _etcd_error(error) is not None or error.code() in _SNAPSHOT_PASS_THROUGH:
                    raise
                details = error.details() or ""
                if error.code() == grpc.StatusCode.INTERNAL and details.startswith(UNMARSHAL_ERROR_PREFIX):
                    raise
                lost = error.code() == grpc.StatusCode.UNAVAILABLE
                if started or not lost or len(self._endpoints) == 1 or time.monotonic() + BACKOFF >= retry_deadline:
                    raise EtcdError(Err.SNAPSHOT_LOST) from None
            finally:
                if call is not None:
                    call.cancel()  # a no-op once the stream has ended
            await self._rediscover()
            if self._leader is endpoint:
                await asyncio.sleep(BACKOFF)

    async def credentials(self, name: str, timeout: float | None = None) -> store_pb2.CredentialsResponse:
        req = store_pb2.CredentialsRequest(name=name).SerializeToString()
        answer = await self._call(lambda ep, t: ep.pipe.do(req, t, store_pb2.DoCall.CREDENTIALS), timeout,
                                  read=True)
        return store_pb2.CredentialsResponse.FromString(answer)

    async def authenticate(self, request: bytes, timeout: float | None = None) -> bytes:
        """A sidecar's Authenticate: AuthenticateRequest bytes -> AuthenticateResponse bytes; the
        store checks the password and issues the token (a write: never sent twice)."""
        return await self._call(lambda ep, t: ep.pipe.do(request, t, store_pb2.DoCall.AUTHENTICATE), timeout,
                                read=False)

    async def resolve_token(self, token: str, timeout: float | None = None) -> store_pb2.ResolveTokenResponse:
        req = store_pb2.ResolveTokenRequest(token=token).SerializeToString()
        answer = await self._call(lambda ep, t: ep.pipe.do(req, t, store_pb2.DoCall.RESOLVE_TOKEN), timeout,
                                  read=True)
        return store_pb2.ResolveTokenResponse.FromString(answer)

    def watch_streams(self) -> WatchStreams:
        """The store streams of one client's Watch stream, one after another."""
        return WatchStreams(self)

    def _watch_link(self, endpoint: _Endpoint) -> WatchLink | None:
        """A shared watch stream of the node with room for one more sub-stream (a new one if
        each ended or is full); None if the node served no WatchShared (a store older than the
        proxy: one WatchBatches stream each) when last asked, less than
        WATCH_SHARED_RETRY_SECONDS ago (it may be upgraded since)."""
        now = time.monotonic()
        refused = [link for link in endpoint.watch_links
                   if link.unimplemented and now - link.ended_at < WATCH_SHARED_RETRY_SECONDS]
        if refused:
            endpoint.watch_links = refused[-1:]
            return None
        endpoint.watch_links = [link for link in endpoint.watch_links if not link.dead]
        for link in endpoint.watch_links:
            if not link.full:
                return link
        link = WatchLink(endpoint.channel, endpoint.metadata)
        endpoint.watch_links.append(link)
        return link

    async def close(self) -> None:
        for task in (self._refresher, self._discovery):
            if task is not None:
                task.cancel()
        for ep in [*self._endpoints, *(ep for _, ep in self._retired), *([self._member] if self._member else [])]:
            await self._close_endpoint(ep)


# ---- watch streams ----
WATCH_METHOD = _SERVICE + "WatchBatches"
RESUME_DEADLINE = 30.0  # how long a stream may go without a store leader before the client is told
WATCH_BACKOFF = 0.1
#: how long a node that answered WatchShared with UNIMPLEMENTED gets WatchBatches streams only
WATCH_SHARED_RETRY_SECONDS = 300.0
#: a stream that served this long before it ended was no outage: a new one starts at its end
WATCH_SERVED_SECONDS = 5.0
_WATCH_RETRY_ERRS = frozenset({Err.NOT_LEADER, Err.NO_LEADER, Err.STOPPED, Err.LEADER_CHANGED,
                               Err.TOO_MANY_REQUESTS, Err.TIMEOUT, Err.TIMEOUT_DUE_TO_LEADER_FAIL, Err.NOT_CAPABLE})


def watch_retryable(error: grpc.aio.AioRpcError) -> bool:
    """The store node went away or stopped leading (resume elsewhere); not a refusal to pass on."""
    err = from_message(error.details() or "")
    if err is not None:
        return err in _WATCH_RETRY_ERRS
    # A node killed mid-stream shows up as UNAVAILABLE, CANCELLED or even INTERNAL; only the
    # answers of a node that works but will not serve us (wrong secret, no such method) are final.
    return error.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAUTHENTICATED,
                                grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)


class WatchStreams:
    """The retries of one client's Watch stream: each stream goes to the node believed to lead
    (a sub-stream of the proxy's shared stream there, proxy/watch_link.py, or a Store.WatchBatches
    stream of its own on a node without WatchShared); when one ends, ``ended`` finds the leader
    again and says whether to open the next (proxy/watch.py then resumes every watch on it) or to
    end the client's stream."""

    def __init__(self, client: StoreClient) -> None:
        self._client = client
        self._down_since: float | None = None
        self._opened_on: _Endpoint | None = None
        self._link: WatchLink | None = None
        self._proof: Metadata = ()

    async def open(self) -> SubStream | grpc.aio.StreamStreamCall:
        """A new stream on the node believed to lead; raises the Challenge call's AioRpcError when
        no challenge could be had there (``ended`` judges it as any other)."""
        endpoint = self._opened_on = self._client._leader
        link = self._link = self._client._watch_link(endpoint)
        if link is not None:
            try:
                return await link.open()
            finally:
                self._proof = link.proof  # a stale one is the link's to forget
        self._proof = await endpoint.metadata()
        return endpoint.channel.stream_stream(WATCH_METHOD)(metadata=self._proof)

    def served(self) -> None:
        """The stream delivered: whatever outage there was is over."""
        self._down_since = None

    async def ended(self, error: grpc.aio.AioRpcError | None, started: float) -> BaseException | None:
        """After a stream (reading since `started`) ended with `error` (None: closed): None once
        the next may be opened, or what to end the client's stream with."""
        if (error is not None and error.code() == grpc.StatusCode.UNIMPLEMENTED and self._link is not None
                and self._link.unimplemented):
            return None  # a store older than the proxy: the next is a WatchBatches stream, at once
        if isinstance(error, Overflowed):
            # its client read too slowly (it has taken what was held by now): no outage, no leader
            # to look for; the store replays what was dropped from its history
            self._down_since = None
            return None
        stale = error is not None and is_stale(error)
        if stale and self._opened_on is not None and self._opened_on.prover is not None:
            self._opened_on.prover.forget(self._proof)  # refused before it ran: open it again
        elif error is not None and not watch_retryable(error):
            return error
        now = time.monotonic()
        if now - started > WATCH_SERVED_SECONDS:
            self._down_since = None  # the stream served for a while: a new outage starts now
        self._down_since = self._down_since or now
        if now - self._down_since > RESUME_DEADLINE:
            return error or EtcdError(Err.NO_LEADER)
        log.info("watch stream to the store ended (%s); resuming on the leader",
                 error.code() if error is not None else "closed")
        with contextlib.suppress(Exception):
            await self._client._rediscover()
        await asyncio.sleep(WATCH_BACKOFF)
        return None
