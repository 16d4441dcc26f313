"""Requests that etcd answers outside its apply loop: status, hashes, membership, lease reads.

Each still goes through the one authorization function first (``Applier.check``); only the
answer is computed here, from the node's local state or, for membership changes, through Raft.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from google.protobuf.message import Message

from authstore.api.lease_keeper import LeaseKeeper
from authstore.api.proposer import Proposer
from authstore.node.driver import RaftNode
from authstore.raft.types import ConfChange, ConfChangeType
from authstore.state.apply import Applier
from authstore.state.backend import content_hash
from authstore.state.membership import member_id
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err, EtcdError
from raftgate.methods import Route, requests

log = logging.getLogger("raftgate.store.maintenance")

VERSION = "3.7.1"
STORAGE_VERSION = "3.7.0"
# etcd promotes a learner only once its log is within 10 % of the leader's.
LEARNER_READY_PERCENT = 0.9
MOVE_LEADER_WAIT = 5.0
# etcd answers these with an empty message, header included.
HEADERLESS = frozenset({"defragment", "move_leader"})
#: The requests answered here (the method table's MAINTENANCE route), each by ``_<kind>``.
MAINTENANCE_KINDS = requests(routes=(Route.MAINTENANCE,))
# Answered by the leader once it has applied up to a read index (etcd forwards them to the leader).
LEASE_KINDS = frozenset({"lease_keep_alive", "lease_time_to_live", "lease_leases"})


@dataclass
class MemberInfo:
    name: str
    peer_urls: list[str] = field(default_factory=list)
    client_urls: list[str] = field(default_factory=list)
    internal_urls: list[str] = field(default_factory=list)
    gateway_urls: list[str] = field(default_factory=list)


class Maintenance:
    def __init__(self, applier: Applier, node: RaftNode, proposer: Proposer, me: MemberInfo, quota_bytes: int,
                 cluster_token: str, leases: LeaseKeeper | None = None) -> None:
        self.applier = applier
        self.node = node
        self.proposer = proposer
        self.me = me
        self.quota_bytes = quota_bytes
        self.cluster_token = cluster_token
        #: the leader's lease keeper (keep-alive, TimeToLive)
        self.leases = leases

    def handles(self, kind: str) -> bool:
        """The method table routes it here; its handler is ``_<kind>`` (tests/unit/test_method_table.py)."""
        return kind in MAINTENANCE_KINDS

    async def answer(self, req: ipb.InternalRaftRequest, kind: str, now_ms: int) -> Message:
        """Authorizes, then answers; membership changes go through the log."""
        if kind in LEASE_KINDS and self.leases is not None:
            await self.leases.before_read()  # on the leader, at a read index, like etcd
        with self.applier.env.begin() as txn:
            self.applier.check(txn, req, read=True)
        resp: Message = await getattr(self, "_" + kind)(getattr(req, kind), now_ms)
        if kind not in HEADERLESS:
            with self.applier.env.begin() as txn:
                self.applier.stamp(txn, resp)
        return resp

    def members(self) -> list[pb.Member]:
        with self.applier.env.begin() as txn:
            return self.applier.membership.members(txn)

    def store_members(self) -> list[spb.StoreMember]:
        """The members with their internal URLs: what proxies follow (Store.Leader)."""
        with self.applier.env.begin() as txn:
            ms = self.applier.membership
            return [spb.StoreMember(id=m.ID, internal_urls=ms.internal_urls(txn, m.ID), is_learner=m.isLearner,
                                    gateway_urls=ms.gateway_urls(txn, m.ID))
                    for m in ms.members(txn)]

    def alarms(self) -> list[pb.AlarmMember]:
        """The alarms this node has applied (what the proxies' /health reports, as etcd's does)."""
        with self.applier.env.begin() as txn:
            return list(self.applier.alarms(txn).alarms)

    def member_list_bytes(self) -> bytes:
        return pb.MemberListResponse(members=self.members()).SerializeToString()

    async def publish_attributes(self) -> None:
        """Records this member's name and client URLs in the replicated member list (etcd does
        the same once a member starts), and its internal and gateway URLs beside it (what proxies
        follow, and what the JSON gateway's MemberList names), retrying until a leader takes it."""
        while True:
            with self.applier.env.begin() as txn:
                current = self.applier.membership.get(txn, self.node.id)
                internal = self.applier.membership.internal_urls(txn, self.node.id)
                gateway = self.applier.membership.gateway_urls(txn, self.node.id)
            if current is not None and current.name == self.me.name and \
                    list(current.clientURLs) == self.me.client_urls and internal == self.me.internal_urls and \
                    gateway == self.me.gateway_urls:
                return
            if current is not None:  # the proposal waits for a leader (admit), as etcd's publish does
                req = ipb.InternalRaftRequest(member_attr_set=ipb.MemberAttrSetRequest(
                    member_ID=self.node.id, name=self.me.name, client_urls=self.me.client_urls,
                    internal_urls=self.me.internal_urls, gateway_urls=self.me.gateway_urls))
                try:
                    await self.proposer.propose(req.SerializeToString())
                    continue
                except EtcdError as exc:
                    log.debug("publishing member attributes: %s", exc.message)
                    if exc.err is Err.NO_LEADER and not self.node.leader_id:
                        # Asked again at once, as etcd's publish does: the next proposal waits for
                        # a leader (admit), so nothing spins; any other failure (a leader known but
                        # the proposal dropped, stopped) is asked again after half a second.
                        continue
            await asyncio.sleep(0.5)

    # ---- Maintenance ----
    async def _status(self, _b: pb.StatusRequest, _now: int) -> Message:
        size, in_use = self.applier.backend.size()
        return pb.StatusResponse(version=VERSION, dbSize=size, dbSizeInUse=in_use, leader=self.node.leader_id,
                                 raftIndex=self.node.last_index, raftTerm=self.node.term,
                                 raftAppliedIndex=self.node.applied_index, isLearner=self.node.is_learner,
                                 storageVersion=STORAGE_VERSION, dbSizeQuota=self.quota_bytes)

    async def _defragment(self, _b: pb.DefragmentRequest, _now: int) -> Message:
        # LMDB reuses freed pages itself; there is nothing to rewrite.
        return pb.DefragmentResponse()

    async def _hash(self, _b: pb.HashRequest, _now: int) -> Message:
        with self.applier.env.begin() as txn:
            crc = content_hash(self.applier.env, txn)
        return pb.HashResponse(hash=crc)

    async def _hash_kv(self, body: pb.HashKVRequest, _now: int) -> Message:
        with self.applier.env.begin() as txn:
            digest, compact_rev, hash_rev = self.applier.kv.hash_kv(txn, body.revision)
        return pb.HashKVResponse(hash=digest, compact_revision=compact_rev, hash_revision=hash_rev)

    async def _move_leader(self, body: pb.MoveLeaderRequest, _now: int) -> Message:
        if not self.node.is_leader:
            raise EtcdError(Err.NOT_LEADER)
        if body.targetID not in self.node.conf_state.voters or body.targetID == self.node.id:
            raise EtcdError(Err.BAD_LEADER_TRANSFEREE)
        self.node.transfer_leader(body.targetID)
        deadline = time.monotonic() + MOVE_LEADER_WAIT
        while self.node.leader_id != body.targetID:
            if time.monotonic() > deadline:
                raise EtcdError(Err.TIMEOUT)
            await asyncio.sleep(0.02)
        return pb.MoveLeaderResponse()

    async def _downgrade(self, _b: pb.DowngradeRequest, _now: int) -> Message:
        raise EtcdError(Err.INVALID_DOWNGRADE_TARGET)

    # ---- Cluster ----
    async def _member_list(self, _b: pb.MemberListRequest, _now: int) -> Message:
        return pb.MemberListResponse(members=self.members())

    async def _member_add(self, body: pb.MemberAddRequest, now: int) -> Message:
        member = pb.Member(ID=member_id(list(body.peerURLs), self.cluster_token, salt=now),
                           peerURLs=body.peerURLs, isLearner=body.isLearner)
        with self.applier.env.begin() as txn:
            self.applier.membership.check_add(txn, member)
        kind = ConfChangeType.ADD_LEARNER_NODE if body.isLearner else ConfChangeType.ADD_NODE
        members = await self._change(kind, member)
        return pb.MemberAddResponse(member=member, members=members.members)

    async def _member_remove(self, body: pb.MemberRemoveRequest, _now: int) -> Message:
        member = self._existing(body.ID)
        members = await self._change(ConfChangeType.REMOVE_NODE, member)
        return pb.MemberRemoveResponse(members=members.members)

    async def _member_promote(self, body: pb.MemberPromoteRequest, _now: int) -> Message:
        member = self._existing(body.ID)
        if not member.isLearner:
            raise EtcdError(Err.MEMBER_NOT_LEARNER)
        if not self.node.is_leader:
            raise EtcdError(Err.NOT_LEADER)
        match = self.node.progress().get(body.ID, (0, 0, ""))[0]
        if match < LEARNER_READY_PERCENT * self.node.last_index:
            raise EtcdError(Err.LEARNER_NOT_READY)
        members = await self._change(ConfChangeType.ADD_NODE, member)
        return pb.MemberPromoteResponse(members=members.members)

    def _existing(self, mid: int) -> pb.Member:
        with self.applier.env.begin() as txn:
            member = self.applier.membership.get(txn, mid)
        if member is None:
            raise EtcdError(Err.MEMBER_NOT_FOUND)
        return member

    async def _change(self, kind: ConfChangeType, member: pb.Member) -> pb.MemberListResponse:
        request_id = self.proposer.new_id()
        ctx = spb.MemberContext(member=member, request_id=request_id)
        result = await self.node.propose_conf_change(ConfChange(kind, member.ID, ctx.SerializeToString()),
                                                     request_id)
        assert isinstance(result, pb.MemberListResponse)
        return result

    # ---- Lease reads ----
    async def _lease_time_to_live(self, body: pb.LeaseTimeToLiveRequest, now: int) -> Message:
        if self.leases is not None:
            return await self.leases.time_to_live(body)
        with self.applier.env.begin() as txn:
            return self.applier.lessor.time_to_live(txn, body, now)

    async def _lease_leases(self, _b: pb.LeaseLeasesRequest, _now: int) -> Message:
        with self.applier.env.begin() as txn:
            return self.applier.lessor.leases(txn)

    async def _lease_keep_alive(self, body: pb.LeaseKeepAliveRequest, _now: int) -> Message:
        """The leader renews; an unknown or expired lease answers TTL 0 in the stream (etcd)."""
        if self.leases is None:
            raise EtcdError(Err.NOT_CAPABLE)
        return pb.LeaseKeepAliveResponse(ID=body.ID, TTL=await self.leases.renew(body.ID))

