"""Requests that etcd answers outside its log: status, hashes, membership, lease reads, defrag.

Each still goes through the one authorization function first (``Applier.check``); only the
answer is computed here, from the node's local state.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field

import lmdb
from google.protobuf.message import Message

from authstore.apply import Applier
from authstore.errors import Err, EtcdError
from authstore.node import Node
from protos.etcdserverpb import rpc_pb2 as pb

VERSION = "3.7.1"
STORAGE_VERSION = "3.7.0"


@dataclass
class MemberInfo:
    name: str
    peer_urls: list[str] = field(default_factory=list)
    client_urls: list[str] = field(default_factory=list)


def member_id(name: str, peer_urls: list[str], cluster_token: str) -> int:
    """A stable 64-bit member ID from the member's identity, as etcd derives one."""
    digest = hashlib.sha256("\n".join([name, *sorted(peer_urls), cluster_token]).encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def cluster_id(member_ids: list[int], cluster_token: str) -> int:
    raw = b"".join(m.to_bytes(8, "big") for m in sorted(member_ids)) + cluster_token.encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big") or 1


class Maintenance:
    def __init__(self, applier: Applier, node: Node, me: MemberInfo, quota_bytes: int) -> None:
        self.applier = applier
        self.node = node
        self.me = me
        self.quota_bytes = quota_bytes

    def handles(self, kind: str) -> bool:
        return hasattr(self, "_" + kind)

    def answer(self, txn: lmdb.Transaction, kind: str, body: Message, now_ms: int) -> Message:
        resp: Message = getattr(self, "_" + kind)(txn, body, now_ms)
        self.applier.stamp(txn, resp)
        return resp

    def members(self) -> list[pb.Member]:
        return [pb.Member(ID=self.applier.identity.member_id, name=self.me.name, peerURLs=self.me.peer_urls,
                          clientURLs=self.me.client_urls)]

    # ---- Maintenance ----
    def _status(self, txn: lmdb.Transaction, _b: pb.StatusRequest, _now: int) -> Message:
        size, in_use = self.applier.backend.size()
        mid = self.applier.identity.member_id
        return pb.StatusResponse(version=VERSION, dbSize=size, dbSizeInUse=in_use, leader=mid,
                                 raftIndex=self.node.last_index, raftTerm=self.node.term,
                                 raftAppliedIndex=self.node.applied_index, isLearner=False,
                                 storageVersion=STORAGE_VERSION, dbSizeQuota=self.quota_bytes)

    def _defragment(self, _t: lmdb.Transaction, _b: pb.DefragmentRequest, _now: int) -> Message:
        # LMDB reuses freed pages itself; there is nothing to rewrite.
        return pb.DefragmentResponse()

    def _hash(self, txn: lmdb.Transaction, _b: pb.HashRequest, _now: int) -> Message:
        crc = 0
        with txn.cursor() as cur:
            for key, value in cur:
                crc = zlib.crc32(value, zlib.crc32(key, crc))
        return pb.HashResponse(hash=crc)

    def _hash_kv(self, txn: lmdb.Transaction, body: pb.HashKVRequest, _now: int) -> Message:
        digest, compact_rev, hash_rev = self.applier.kv.hash_kv(txn, body.revision)
        return pb.HashKVResponse(hash=digest, compact_revision=compact_rev, hash_revision=hash_rev)

    def _move_leader(self, _t: lmdb.Transaction, body: pb.MoveLeaderRequest, _now: int) -> Message:
        if body.targetID != self.applier.identity.member_id:
            raise EtcdError(Err.BAD_LEADER_TRANSFEREE)
        return pb.MoveLeaderResponse()

    def _downgrade(self, _t: lmdb.Transaction, _b: pb.DowngradeRequest, _now: int) -> Message:
        raise EtcdError(Err.INVALID_DOWNGRADE_TARGET)

    # ---- Cluster ----
    def _member_list(self, _t: lmdb.Transaction, _b: pb.MemberListRequest, _now: int) -> Message:
        return pb.MemberListResponse(members=self.members())

    def _member_add(self, _t: lmdb.Transaction, _b: pb.MemberAddRequest, _now: int) -> Message:
        raise EtcdError(Err.NOT_CAPABLE)  # single-node store: membership changes come with Raft

    def _member_remove(self, _t: lmdb.Transaction, body: pb.MemberRemoveRequest, _now: int) -> Message:
        if self.applier.identity.member_id != body.ID:
            raise EtcdError(Err.MEMBER_NOT_FOUND)
        raise EtcdError(Err.NOT_CAPABLE)

    def _member_update(self, _t: lmdb.Transaction, body: pb.MemberUpdateRequest, _now: int) -> Message:
        if self.applier.identity.member_id != body.ID:
            raise EtcdError(Err.MEMBER_NOT_FOUND)
        raise EtcdError(Err.NOT_CAPABLE)

    def _member_promote(self, _t: lmdb.Transaction, body: pb.MemberPromoteRequest, _now: int) -> Message:
        if self.applier.identity.member_id != body.ID:
            raise EtcdError(Err.MEMBER_NOT_FOUND)
        raise EtcdError(Err.MEMBER_NOT_LEARNER)

    # ---- Lease reads ----
    def _lease_time_to_live(self, txn: lmdb.Transaction, body: pb.LeaseTimeToLiveRequest, now: int) -> Message:
        return self.applier.lessor.time_to_live(txn, body, now)

    def _lease_leases(self, txn: lmdb.Transaction, _b: pb.LeaseLeasesRequest, _now: int) -> Message:
        return self.applier.lessor.leases(txn)

    def _lease_keep_alive(self, txn: lmdb.Transaction, body: pb.LeaseKeepAliveRequest, now: int) -> Message:
        ttl = self.applier.lessor.time_to_live(txn, pb.LeaseTimeToLiveRequest(ID=body.ID), now)
        if ttl.TTL < 0:
            raise EtcdError(Err.LEASE_NOT_FOUND)
        return pb.LeaseKeepAliveResponse(ID=body.ID, TTL=ttl.grantedTTL)
