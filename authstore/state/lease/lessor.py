"""Lease records in LMDB: grant, revoke (deleting attached keys), lookups, TTL arithmetic.

Time never comes from a clock here: grant and renew take the entry's timestamp, TTL queries take
the caller's `now_ms`, so every member applying the same log holds the same lease state.

Layout:
  lease           id (8 bytes, signed big-endian) -> record (ttl, refreshed_at_ms, deadline_ms,
                  remaining_ttl for a checkpoint; 0 = none)
  lease_keys      id + index key -> b"" for a short key, the full key for a long one (index keys
                  as in mvcc/index.py: a key over index.PREFIX bytes is its prefix + SHA-256)
  lease_deadline  deadline_ms + id -> b""   (leases by expiry, so expiry is a cursor walk)
  lease_meta      b"next_id_seq" -> counter for IDs picked by the store
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import lmdb

from authstore.state.mvcc.index import PREFIX, index_key
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

#: etcd's MaxLeaseTTL (seconds)
MAX_LEASE_TTL = 9_000_000_000
#: etcd's minimum TTL with default timing: ceil(1.5 * election timeout of 10 x 100 ms heartbeats)
DEFAULT_MIN_TTL = 2

_ID = struct.Struct(">q")
_REC = struct.Struct(">qqqq")
_DEADLINE = struct.Struct(">qq")
_U64 = struct.Struct(">Q")
_SEQ_KEY = b"next_id_seq"
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1


class LeaseRecord(NamedTuple):
    ttl: int
    refreshed_at_ms: int
    deadline_ms: int
    remaining_ttl: int


def _mix(x: int) -> int:
    """splitmix64 finaliser: spreads a counter over 63 bits so store-picked IDs look like etcd's."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & _MASK63


class Lessor:
    """Lease state machine; registers itself with the KVStore to keep key attachments in step."""

    def __init__(
        self,
        env: lmdb.Environment,
        kv: KVStore,
        *,
        min_ttl: int = DEFAULT_MIN_TTL,
        txn: lmdb.Transaction | None = None,
    ) -> None:
        self.kv = kv
        self.min_ttl = min_ttl
        if txn is None:
            with env.begin(write=True) as own:
                self._open(env, own)
        else:
            self._open(env, txn)
        kv.lessor = self

    def _open(self, env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        self._leases = env.open_db(b"lease", txn=txn)
        self._keys = env.open_db(b"lease_keys", txn=txn)
        self._deadlines = env.open_db(b"lease_deadline", txn=txn)
        self._meta = env.open_db(b"lease_meta", txn=txn)

    # ---- records ----
    def _get(self, txn: lmdb.Transaction, lease_id: int) -> LeaseRecord | None:
        raw = txn.get(_ID.pack(lease_id), db=self._leases)
        return LeaseRecord._make(_REC.unpack(raw)) if raw else None

    def _put(self, txn: lmdb.Transaction, lease_id: int, rec: LeaseRecord, old: LeaseRecord | None) -> None:
        if old is not None:
            txn.delete(_DEADLINE.pack(old.deadline_ms, lease_id), db=self._deadlines)
        txn.put(_ID.pack(lease_id), _REC.pack(*rec), db=self._leases)
        txn.put(_DEADLINE.pack(rec.deadline_ms, lease_id), b"", db=self._deadlines)

    def exists(self, txn: lmdb.Transaction, lease_id: int) -> bool:
        return lease_id != 0 and txn.get(_ID.pack(lease_id), db=self._leases) is not None

    def get(self, txn: lmdb.Transaction, lease_id: int) -> LeaseRecord | None:
        """The stored record, or None."""
        return self._get(txn, lease_id) if lease_id else None

    # ---- grant / revoke / renew ----
    def grant(self, txn: lmdb.Transaction, req: pb.LeaseGrantRequest, granted_at_unix_ms: int) -> pb.LeaseGrantResponse:
        """etcd LeaseGrant. Raises LEASE_TTL_TOO_LARGE, LEASE_EXIST."""
        if req.TTL > MAX_LEASE_TTL:
            raise EtcdError(Err.LEASE_TTL_TOO_LARGE)
        lease_id = req.ID or self._pick_id(txn)
        if self.exists(txn, lease_id):
            raise EtcdError(Err.LEASE_EXIST)
        ttl = max(req.TTL, self.min_ttl)
        rec = LeaseRecord(ttl, granted_at_unix_ms, granted_at_unix_ms + ttl * 1000, 0)
        self._put(txn, lease_id, rec, None)
        return pb.LeaseGrantResponse(ID=lease_id, TTL=ttl)

    def _pick_id(self, txn: lmdb.Transaction) -> int:
        # deterministic: a counter in LMDB mixed with the current revision, never 0 nor taken
        raw = txn.get(_SEQ_KEY, db=self._meta)
        seq = _U64.unpack(raw)[0] if raw else 0
        rev = self.kv.current_revision(txn)
        while True:
            seq += 1
            lease_id = _mix((rev << 32) ^ seq)
            if lease_id and not self.exists(txn, lease_id):
                break
        txn.put(_SEQ_KEY, _U64.pack(seq), db=self._meta)
        return lease_id

    def revoke(self, txn: lmdb.Transaction, lease_id: int) -> pb.LeaseRevokeResponse:
        """etcd LeaseRevoke: every attached key is deleted in ONE revision. Raises LEASE_NOT_FOUND."""
        rec = self.get(txn, lease_id)
        if rec is None:
            raise EtcdError(Err.LEASE_NOT_FOUND)
        keys = self._attached(txn, lease_id)  # already in byte order, like etcd's sorted revoke
        self.kv.delete_keys(txn, keys)  # detaches each key through the hooks below
        for key in self._attached(txn, lease_id):  # defensive: anything the deletes missed
            self.detach(txn, lease_id, key)
        txn.delete(_ID.pack(lease_id), db=self._leases)
        txn.delete(_DEADLINE.pack(rec.deadline_ms, lease_id), db=self._deadlines)
        return pb.LeaseRevokeResponse()

    def renew(self, txn: lmdb.Transaction, lease_id: int, now_ms: int) -> int:
        """Keep-alive: restarts the lease's TTL from `now_ms` (a logged deadline never moves back,
        whatever the clock of the node that logged it); returns the TTL. Raises LEASE_NOT_FOUND."""
        rec = self.get(txn, lease_id)
        if rec is None:
            raise EtcdError(Err.LEASE_NOT_FOUND)
        deadline = max(rec.deadline_ms, now_ms + rec.ttl * 1000)
        self._put(txn, lease_id, LeaseRecord(rec.ttl, now_ms, deadline, 0), rec)
        return rec.ttl

    def expire(self, txn: lmdb.Transaction, lease_id: int, seen_deadline_ms: int) -> bool:
        """The leader's revoke of an expired lease: revokes it unless it is gone already or a
        later entry moved its deadline past the one the leader saw. Returns whether it revoked."""
        rec = self.get(txn, lease_id)
        if rec is None or rec.deadline_ms > seen_deadline_ms:
            return False
        self.revoke(txn, lease_id)
        return True

    def checkpoint(self, txn: lmdb.Transaction, lease_id: int, remaining_ttl: int) -> None:
        """Records a remaining TTL (etcd's LeaseCheckpoint); unknown leases are ignored like etcd."""
        rec = self.get(txn, lease_id)
        if rec is not None:
            self._put(txn, lease_id, rec._replace(remaining_ttl=remaining_ttl), rec)

    def load(self, txn: lmdb.Transaction, lease_id: int, ttl: int, now_ms: int) -> None:
        """A lease read from another store's snapshot, given its whole TTL from ``now_ms`` (as
        etcd's new leader does with the leases it takes over); keys are attached by the caller."""
        ttl = max(ttl, self.min_ttl)
        self._put(txn, lease_id, LeaseRecord(ttl, now_ms, now_ms + ttl * 1000, 0), self._get(txn, lease_id))

    # ---- key attachments (called by KVStore) ----
    def attach(self, txn: lmdb.Transaction, lease_id: int, key: bytes) -> None:
        if len(key) <= PREFIX:
            txn.put(_ID.pack(lease_id) + key, b"", db=self._keys)
        else:
            txn.put(_ID.pack(lease_id) + index_key(key), key, db=self._keys)

    def detach(self, txn: lmdb.Transaction, lease_id: int, key: bytes) -> None:
        txn.delete(_ID.pack(lease_id) + (key if len(key) <= PREFIX else index_key(key)), db=self._keys)

    def _attached(self, txn: lmdb.Transaction, lease_id: int) -> list[bytes]:
        prefix = _ID.pack(lease_id)
        cur = txn.cursor(db=self._keys)
        out: list[bytes] = []
        if not cur.set_range(prefix):
            return out
        has_long = False
        for k, v in cur.iternext(keys=True, values=True):
            if not k.startswith(prefix):
                break
            if v:  # a long key: the entry holds the full key
                out.append(v)
                has_long = True
            else:
                out.append(k[8:])
        if has_long:  # long keys sharing a prefix sit in hash order; everything else is in order
            out.sort()
        return out

    def attached_keys(self, txn: lmdb.Transaction, lease_id: int) -> list[bytes]:
        """Keys attached to the lease, ascending. Raises LEASE_NOT_FOUND."""
        if not self.exists(txn, lease_id):
            raise EtcdError(Err.LEASE_NOT_FOUND)
        return self._attached(txn, lease_id)

    # ---- reads ----
    def time_to_live(
        self, txn: lmdb.Transaction, req: pb.LeaseTimeToLiveRequest, now_ms: int
    ) -> pb.LeaseTimeToLiveResponse:
        """etcd LeaseTimeToLive: TTL is whole seconds left (never below 0); -1 if no such lease."""
        rec = self.get(txn, req.ID)
        if rec is None:
            return pb.LeaseTimeToLiveResponse(ID=req.ID, TTL=-1)
        remaining = max(0, (rec.deadline_ms - now_ms) // 1000)
        resp = pb.LeaseTimeToLiveResponse(ID=req.ID, TTL=remaining, grantedTTL=rec.ttl)
        if req.keys:
            resp.keys.extend(self._attached(txn, req.ID))
        return resp

    def leases(self, txn: lmdb.Transaction) -> pb.LeaseLeasesResponse:
        """All leases, soonest expiry first (etcd's order)."""
        resp = pb.LeaseLeasesResponse()
        for k in txn.cursor(db=self._deadlines).iternext(keys=True, values=False):
            resp.leases.add(ID=_DEADLINE.unpack(k)[1])
        return resp

    def expired(self, txn: lmdb.Transaction, now_ms: int, limit: int = 0) -> list[int]:
        """IDs of leases whose deadline is at or before `now_ms`, soonest first (for the expiry loop)."""
        return [lease_id for lease_id, _ in self.due(txn, now_ms, limit)]

    def due(self, txn: lmdb.Transaction, now_ms: int, limit: int = 0) -> list[tuple[int, int]]:
        """(id, logged deadline) of leases whose logged deadline is at or before `now_ms`, soonest first."""
        out: list[tuple[int, int]] = []
        for k in txn.cursor(db=self._deadlines).iternext(keys=True, values=False):
            deadline, lease_id = _DEADLINE.unpack(k)
            if deadline > now_ms or (limit and len(out) >= limit):
                break
            out.append((lease_id, deadline))
        return out

    def iter_records(self, txn: lmdb.Transaction) -> Iterator[tuple[int, LeaseRecord]]:
        """Every lease with its record, by ID bytes, read lazily (a snapshot streams them)."""
        for k, v in txn.cursor(db=self._leases):
            yield _ID.unpack(k)[0], LeaseRecord._make(_REC.unpack(v))

    def all_records(self, txn: lmdb.Transaction) -> list[tuple[int, LeaseRecord]]:
        """Every lease with its record (a new leader's starting point)."""
        return list(self.iter_records(txn))
