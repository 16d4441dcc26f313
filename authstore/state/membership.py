"""Cluster membership as replicated state: who the members are, their URLs, who is a learner.

Changed only by applying log entries (Raft conf changes and MemberUpdate), in the same LMDB
transaction as the applied index, so every node agrees on the member list at every index.
"""

from __future__ import annotations

import hashlib
import struct

import lmdb

from authstore.raft.types import ConfChange, ConfChangeType
from protos.etcdserverpb import rpc_pb2 as pb
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err, EtcdError

_ID = struct.Struct(">Q")
#: key prefix in members_meta: a member's internal URLs (newline-separated)
_INTERNAL = b"internal/"
#: key prefix in members_meta: where a member's proxy serves the JSON gateway (newline-separated)
_GATEWAY = b"gateway/"


def member_id(peer_urls: list[str], cluster_token: str, salt: int = 0) -> int:
    """A 64-bit member ID from the member's peer URLs and the cluster token, as etcd derives one;
    ``salt`` (the time of a MemberAdd) lets the same URLs rejoin later under a new ID."""
    raw = "\n".join([*sorted(peer_urls), cluster_token, str(salt) if salt else ""]).encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big") or 1


def cluster_id(member_ids: list[int], cluster_token: str) -> int:
    raw = b"".join(_ID.pack(m) for m in sorted(member_ids)) + cluster_token.encode()
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big") or 1


class Membership:
    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction | None = None) -> None:
        self._db = env.open_db(b"members", txn=txn)
        self._meta = env.open_db(b"members_meta", txn=txn)

    def members(self, txn: lmdb.Transaction) -> list[pb.Member]:
        with txn.cursor(db=self._db) as cur:
            return [pb.Member.FromString(v) for _, v in cur]

    def get(self, txn: lmdb.Transaction, mid: int) -> pb.Member | None:
        raw = txn.get(_ID.pack(mid), db=self._db)
        return pb.Member.FromString(raw) if raw else None

    def cluster_id(self, txn: lmdb.Transaction) -> int:
        raw = txn.get(b"cluster_id", db=self._meta)
        return _ID.unpack(raw)[0] if raw else 0

    def set_cluster_id(self, txn: lmdb.Transaction, cid: int) -> None:
        txn.put(b"cluster_id", _ID.pack(cid), db=self._meta)

    def clear(self, txn: lmdb.Transaction) -> None:
        """Forgets every member and the cluster ID: a snapshot restored into a new cluster, whose
        first log entries add its own members (``raftgate snapshot restore``)."""
        txn.drop(self._db, delete=False)
        txn.drop(self._meta, delete=False)

    def check_add(self, txn: lmdb.Transaction, member: pb.Member) -> None:
        """etcd's refusals for a MemberAdd, decided before anything enters the log."""
        if not member.peerURLs or any("://" not in u for u in member.peerURLs):
            raise EtcdError(Err.MEMBER_BAD_URLS)
        taken = {u for m in self.members(txn) for u in m.peerURLs}
        if taken & set(member.peerURLs):
            raise EtcdError(Err.PEER_URL_EXIST)
        if self.get(txn, member.ID) is not None:
            raise EtcdError(Err.MEMBER_EXIST)

    def apply_conf_change(self, txn: lmdb.Transaction, cc: ConfChange) -> int:
        """Records a conf change; returns the request ID waiting for it (0 when none)."""
        ctx = spb.MemberContext.FromString(cc.context) if cc.context else spb.MemberContext()
        if ctx.cluster_id and not self.cluster_id(txn):
            self.set_cluster_id(txn, ctx.cluster_id)
        key = _ID.pack(cc.node_id)
        if cc.type == ConfChangeType.REMOVE_NODE:
            txn.delete(key, db=self._db)
            txn.delete(_INTERNAL + key, db=self._meta)
            txn.delete(_GATEWAY + key, db=self._meta)
            return ctx.request_id
        current = self.get(txn, cc.node_id)
        member = current or ctx.member
        if not member.ID:
            member.ID = cc.node_id
        member.isLearner = cc.type == ConfChangeType.ADD_LEARNER_NODE
        txn.put(key, member.SerializeToString(), db=self._db)
        return ctx.request_id

    def update_peer_urls(self, txn: lmdb.Transaction, mid: int, peer_urls: list[str]) -> None:
        member = self.get(txn, mid)
        if member is None:
            raise EtcdError(Err.MEMBER_NOT_FOUND)
        taken = {u for m in self.members(txn) if mid != m.ID for u in m.peerURLs}
        if taken & set(peer_urls):
            raise EtcdError(Err.PEER_URL_EXIST)
        del member.peerURLs[:]
        member.peerURLs.extend(peer_urls)
        txn.put(_ID.pack(mid), member.SerializeToString(), db=self._db)

    def set_attributes(self, txn: lmdb.Transaction, mid: int, name: str, client_urls: list[str],
                       internal_urls: list[str] | None = None, gateway_urls: list[str] | None = None) -> None:
        member = self.get(txn, mid)
        if member is None:
            return
        member.name = name
        del member.clientURLs[:]
        member.clientURLs.extend(client_urls)
        txn.put(_ID.pack(mid), member.SerializeToString(), db=self._db)
        # Beside etcd's record, not in it: MemberList keeps etcd's wire fields.
        for prefix, urls in ((_INTERNAL, internal_urls), (_GATEWAY, gateway_urls)):
            key = prefix + _ID.pack(mid)
            if urls:
                txn.put(key, "\n".join(urls).encode(), db=self._meta)
            else:
                txn.delete(key, db=self._meta)

    def gateway_urls(self, txn: lmdb.Transaction, mid: int) -> list[str]:
        """Where the member's proxy serves the JSON gateway, as it published them (empty: none)."""
        raw = txn.get(_GATEWAY + _ID.pack(mid), db=self._meta)
        return raw.decode().split("\n") if raw else []

    def internal_urls(self, txn: lmdb.Transaction, mid: int) -> list[str]:
        """Where proxies reach the member's internal service, as it published it (empty: unknown)."""
        raw = txn.get(_INTERNAL + _ID.pack(mid), db=self._meta)
        return raw.decode().split("\n") if raw else []
