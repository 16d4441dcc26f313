"""The MVCC key space with etcd v3 semantics, stored in LMDB.

Layout (all in the caller's LMDB environment):
  mvcc_kv     revision (16 bytes) -> serialized mvccpb.KeyValue; a tombstone is KeyValue{key,
              mod_revision} with version 0, so history can later be replayed as watch events.
  mvcc_index  key -> index entries (see index.py); a key longer than index.PREFIX is indexed
              under its prefix + SHA-256, with the full key in mvcc_longkey. Keys of any length
              are accepted; their size is bounded only by the request size limit, as in etcd.
  mvcc_meta   current and compacted revision.

Every method takes the LMDB transaction to use, keeps no state outside LMDB and raises EtcdError
before its first write, so the apply stage can abort a refused entry without leftovers.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

import lmdb

from authstore.state.mvcc import index, revision
from authstore.state.mvcc.index import Entry, KeyIndex
from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2
from raftgate.errors import Err, EtcdError

_I64 = struct.Struct(">q")
_META_REV = b"current_revision"
_META_COMPACT = b"compacted_revision"

_KEY = pb.RangeRequest.KEY
_VERSION = pb.RangeRequest.VERSION
_CREATE = pb.RangeRequest.CREATE
_MOD = pb.RangeRequest.MOD
_VALUE = pb.RangeRequest.VALUE
_NONE = pb.RangeRequest.NONE
_ASCEND = pb.RangeRequest.ASCEND
_DESCEND = pb.RangeRequest.DESCEND

# sort keys over decoded index entries, for every target but VALUE
_SORT_FIELD: dict[int, Callable[[tuple[bytes, Entry]], object]] = {
    _KEY: lambda row: row[0],
    _VERSION: lambda row: row[1].version,
    _CREATE: lambda row: row[1].create_revision,
    _MOD: lambda row: row[1].main,
}


class LeaseHooks(Protocol):
    """What the key space asks of the lessor; the lessor registers itself as `KVStore.lessor`."""

    def exists(self, txn: lmdb.Transaction, lease_id: int) -> bool: ...

    def attach(self, txn: lmdb.Transaction, lease_id: int, key: bytes) -> None: ...

    def detach(self, txn: lmdb.Transaction, lease_id: int, key: bytes) -> None: ...


class _Write:
    """One write transaction: its changes share main revision `main` and are numbered by `sub`."""

    __slots__ = ("txn", "main", "sub")

    def __init__(self, txn: lmdb.Transaction, begin_rev: int) -> None:
        self.txn = txn
        self.main = begin_rev + 1
        self.sub = 0

    @property
    def read_rev(self) -> int:
        """The revision a read inside this write sees: the new one once something changed."""
        return self.main if self.sub else self.main - 1

    def next_rev(self) -> tuple[int, int]:
        sub = self.sub
        self.sub += 1
        return self.main, sub


class _Plan(NamedTuple):
    """The branch a Txn takes, decided from the state before any of its writes (as etcd does)."""

    succeeded: bool
    ops: list[pb.RequestOp]
    children: list[_Plan | None]


def _gte_end(range_end: bytes) -> bytes | None:
    """etcd's range_end convention: empty = single key (None), "\\x00" = no upper bound (b"")."""
    if not range_end:
        return None
    if range_end == b"\x00":
        return b""
    return range_end


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tombstone(key: bytes, main: int) -> bytes:
    return kv_pb2.KeyValue(key=key, mod_revision=main).SerializeToString()


class KVStore:
    """etcd's KV service (Range, Put, DeleteRange, Txn, Compact) plus HashKV over LMDB."""

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction | None = None) -> None:
        self.env = env
        if txn is None:
            with env.begin(write=True) as own:
                self._open(env, own)
        else:
            self._open(env, txn)
        #: set by the Lessor; without one, every put with a lease fails with LEASE_NOT_FOUND
        self.lessor: LeaseHooks | None = None

    def _open(self, env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        self._meta = env.open_db(b"mvcc_meta", txn=txn)
        self._kv = env.open_db(b"mvcc_kv", txn=txn)
        self._index = KeyIndex(env, txn)

    # ---- revisions ----
    def current_revision(self, txn: lmdb.Transaction) -> int:
        raw = txn.get(_META_REV, db=self._meta)
        return _I64.unpack(raw)[0] if raw else 1

    def compacted_revision(self, txn: lmdb.Transaction) -> int:
        """The last compaction revision; 0 when the store was never compacted."""
        return self.raw_compacted_revision(txn) or 0

    def _compact_floor(self, txn: lmdb.Transaction) -> int:
        # etcd starts with compactMainRev = -1, so compacting at 0 on a fresh store is allowed
        raw = txn.get(_META_COMPACT, db=self._meta)
        return _I64.unpack(raw)[0] if raw else -1

    def _begin(self, txn: lmdb.Transaction) -> _Write:
        return _Write(txn, self.current_revision(txn))

    def _end(self, w: _Write) -> None:
        if w.sub:
            w.txn.put(_META_REV, _I64.pack(w.main), db=self._meta)

    # ---- Range ----
    def range(self, txn: lmdb.Transaction, req: pb.RangeRequest) -> pb.RangeResponse:
        """etcd Range; the response header is left for the caller to stamp."""
        resp = pb.RangeResponse()
        self._range_into(txn, req, self.current_revision(txn), resp)
        return resp

    def _range_into(self, txn: lmdb.Transaction, req: pb.RangeRequest, cur_rev: int, out: pb.RangeResponse) -> None:
        rev = req.revision
        if rev > cur_rev:
            raise EtcdError(Err.FUTURE_REV)
        if rev <= 0:
            rev = cur_rev
        if rev < self.compacted_revision(txn):
            raise EtcdError(Err.COMPACTED)
        at = None if rev == cur_rev else rev
        end = _gte_end(req.range_end)
        if req.count_only:
            out.count = self._index.count(txn, req.key, end, at)
            return

        has_filters = bool(
            req.min_mod_revision or req.max_mod_revision or req.min_create_revision or req.max_create_revision
        )
        order, target, limit = req.sort_order, req.sort_target, req.limit
        # etcd pushes the limit down only for the default order, judged on the request as sent
        pushdown = order == _NONE or (target == _KEY and order == _ASCEND)
        fetch = limit + 1 if (limit > 0 and pushdown and not has_filters) else 0

        rows: list[tuple[bytes, bytes]] = []
        total = 0
        for row in self._index.scan(txn, req.key, end, at):
            total += 1
            if not fetch or len(rows) < fetch:
                rows.append(row)

        # an unset order with a non-key target means ascending
        if target != _KEY and order == _NONE:
            order = _ASCEND
        resort = not (order == _NONE or (target == _KEY and order == _ASCEND))
        fast_keys_only = req.keys_only and target != _VALUE

        if not has_filters and not resort and not fast_keys_only and not req.keys_only:
            # hot path: splice the stored KeyValue bytes straight into the response encoding
            more = limit > 0 and len(rows) > limit
            if more:
                rows = rows[:limit]
            get, kvdb = txn.get, self._kv
            parts = []
            for _k, raw in rows:
                rec = get(raw[: revision.SIZE], db=kvdb)
                parts.append(b"\x12" + _varint(len(rec)) + rec)
            if more:
                parts.append(b"\x18\x01")
            if total:
                parts.append(b"\x20" + _varint(total))
            out.MergeFromString(b"".join(parts))
            return

        decoded = [(k, index.unpack(raw)) for k, raw in rows]
        if has_filters:
            decoded = [row for row in decoded if _passes(req, row[1])]
        values: dict[bytes, bytes] | None = None
        if resort:
            if target == _VALUE:
                values = {k: self._record(txn, e) for k, e in decoded}
                vals = {k: kv_pb2.KeyValue.FromString(rec).value for k, rec in values.items()}
                decoded.sort(key=lambda row: vals[row[0]], reverse=order == _DESCEND)
            else:
                decoded.sort(key=_SORT_FIELD.get(target, _SORT_FIELD[_KEY]), reverse=order == _DESCEND)
        if limit > 0 and len(decoded) > limit:
            decoded = decoded[:limit]
            out.more = True
        out.count = total
        if fast_keys_only:
            # etcd answers keys-only reads from its index alone: no value and no lease
            for k, e in decoded:
                out.kvs.add(key=k, create_revision=e.create_revision, mod_revision=e.main, version=e.version)
            return
        for k, e in decoded:
            rec = values[k] if values is not None else self._record(txn, e)
            kv = out.kvs.add()
            kv.MergeFromString(rec)
            if req.keys_only:
                kv.value = b""

    def _record(self, txn: lmdb.Transaction, e: Entry) -> bytes:
        rec = txn.get(e.rev, db=self._kv)
        if rec is None:  # the index and the records are written together; a miss is corruption
            raise RuntimeError(f"mvcc: no record for revision {e.main}.{e.sub}")
        return rec

    # ---- Put ----
    def put(self, txn: lmdb.Transaction, req: pb.PutRequest) -> pb.PutResponse:
        """etcd Put: one new revision. Raises LEASE_NOT_FOUND or KEY_NOT_FOUND before writing."""
        self._check_put(txn, req)
        w = self._begin(txn)
        resp = pb.PutResponse()
        self._put(w, req, resp)
        self._end(w)
        return resp

    def _check_put(self, txn: lmdb.Transaction, req: pb.PutRequest) -> None:
        if req.lease and (self.lessor is None or not self.lessor.exists(txn, req.lease)):
            raise EtcdError(Err.LEASE_NOT_FOUND)
        if not req.key:
            raise EtcdError(Err.EMPTY_KEY)
        if (req.ignore_value or req.ignore_lease) and self._index.get(txn, req.key) is None:
            raise EtcdError(Err.KEY_NOT_FOUND)

    def _put(self, w: _Write, req: pb.PutRequest, resp: pb.PutResponse) -> None:
        txn, key = w.txn, req.key
        prev = self._index.get(txn, key)
        value, lease = req.value, req.lease
        if prev is not None:
            if req.prev_kv or req.ignore_value:
                rec = self._record(txn, prev)
                if req.prev_kv:
                    resp.prev_kv.MergeFromString(rec)
                if req.ignore_value:
                    value = kv_pb2.KeyValue.FromString(rec).value
            if req.ignore_lease:
                lease = prev.lease
        elif req.ignore_value or req.ignore_lease:
            raise EtcdError(Err.KEY_NOT_FOUND)
        main, sub = w.next_rev()
        create = prev.create_revision if prev is not None else main
        version = prev.version + 1 if prev is not None else 1
        rec = kv_pb2.KeyValue(
            key=key, value=value, create_revision=create, mod_revision=main, version=version, lease=lease
        ).SerializeToString()
        txn.put(revision.encode(main, sub), rec, db=self._kv, append=True)
        self._index.append(txn, key, index.pack(main, sub, create, version, lease))
        old_lease = prev.lease if prev is not None else 0
        if old_lease != lease and self.lessor is not None:
            if old_lease:
                self.lessor.detach(txn, old_lease, key)
            if lease:
                self.lessor.attach(txn, lease, key)

    # ---- DeleteRange ----
    def delete_range(self, txn: lmdb.Transaction, req: pb.DeleteRangeRequest) -> pb.DeleteRangeResponse:
        """etcd DeleteRange: one new revision if anything was deleted, none otherwise."""
        w = self._begin(txn)
        resp = pb.DeleteRangeResponse()
        self._delete_into(w, req, resp)
        self._end(w)
        return resp

    def _delete_into(self, w: _Write, req: pb.DeleteRangeRequest, resp: pb.DeleteRangeResponse) -> None:
        prev = [] if req.prev_kv else None
        resp.deleted = self._delete(w, req.key, _gte_end(req.range_end), prev)
        for rec in prev or ():
            resp.prev_kvs.add().MergeFromString(rec)

    def _delete(self, w: _Write, key: bytes, end: bytes | None, prev: list[bytes] | None) -> int:
        txn = w.txn
        rows = list(self._index.scan(txn, key, end))  # materialized: the loop writes to the index
        for k, raw in rows:
            e = index.unpack(raw)
            if prev is not None:
                prev.append(self._record(txn, e))
            main, sub = w.next_rev()
            txn.put(revision.encode(main, sub), _tombstone(k, main), db=self._kv, append=True)
            self._index.append(txn, k, index.pack(main, sub, 0, 0, 0))
            if e.lease and self.lessor is not None:
                self.lessor.detach(txn, e.lease, k)
        return len(rows)

    def delete_keys(self, txn: lmdb.Transaction, keys: list[bytes]) -> int:
        """Deletes the given keys (absent ones are skipped) in one revision; for lease revoke."""
        w = self._begin(txn)
        n = sum(self._delete(w, k, None, None) for k in keys)
        self._end(w)
        return n

    # ---- Txn ----
    def txn(self, txn: lmdb.Transaction, req: pb.TxnRequest) -> pb.TxnResponse:
        """etcd Txn: compares and checks run on the state before the txn, then every write of
        every chosen branch shares one revision; reads inside see the txn's earlier writes."""
        plan = self._plan(txn, req)
        self._check_plan(txn, plan, self.current_revision(txn), self.compacted_revision(txn))
        w = self._begin(txn)
        resp = pb.TxnResponse()
        self._exec(w, plan, resp)
        self._end(w)
        return resp

    def _plan(self, txn: lmdb.Transaction, req: pb.TxnRequest) -> _Plan:
        ok = all(self._compare(txn, c) for c in req.compare)
        ops = list(req.success if ok else req.failure)
        children = [self._plan(txn, op.request_txn) if op.HasField("request_txn") else None for op in ops]
        return _Plan(ok, ops, children)

    def _check_plan(self, txn: lmdb.Transaction, plan: _Plan, cur_rev: int, compact_rev: int) -> None:
        for op, child in zip(plan.ops, plan.children, strict=True):
            which = op.WhichOneof("request")
            if which == "request_range":
                r = op.request_range.revision
                if r > cur_rev:
                    raise EtcdError(Err.FUTURE_REV)
                if 0 < r < compact_rev:
                    raise EtcdError(Err.COMPACTED)
            elif which == "request_put":
                self._check_put(txn, op.request_put)
            elif child is not None:
                self._check_plan(txn, child, cur_rev, compact_rev)

    def _exec(self, w: _Write, plan: _Plan, resp: pb.TxnResponse) -> None:
        resp.succeeded = plan.succeeded
        for op, child in zip(plan.ops, plan.children, strict=True):
            out = resp.responses.add()
            which = op.WhichOneof("request")
            if which == "request_range":
                rr = out.response_range
                cur = w.read_rev
                self._range_into(w.txn, op.request_range, cur, rr)
                rr.header.revision = cur
            elif which == "request_put":
                pr = out.response_put
                self._put(w, op.request_put, pr)
                pr.header.revision = w.main
            elif which == "request_delete_range":
                dr = out.response_delete_range
                self._delete_into(w, op.request_delete_range, dr)
                dr.header.revision = w.read_rev
            elif child is not None:
                tr = out.response_txn
                tr.header.SetInParent()  # etcd sends nested txn headers empty
                self._exec(w, child, tr)

    def _compare(self, txn: lmdb.Transaction, c: pb.Compare) -> bool:
        end = _gte_end(c.range_end)
        rows = list(self._index.scan(txn, c.key, end))
        target = c.target
        if not rows:
            if target == pb.Compare.VALUE:
                return False  # a missing key has no value, not an empty one
            return _compare_kv(c, kv_pb2.KeyValue())
        for _k, raw in rows:
            e = index.unpack(raw)
            if target == pb.Compare.VALUE:
                kv = kv_pb2.KeyValue.FromString(self._record(txn, e))
            else:
                kv = kv_pb2.KeyValue(
                    create_revision=e.create_revision, mod_revision=e.main, version=e.version, lease=e.lease
                )
            if not _compare_kv(c, kv):
                return False
        return True

    # ---- Compact / Hash ----
    def compact(self, txn: lmdb.Transaction, req: pb.CompactionRequest) -> pb.CompactionResponse:
        """Drops history below `revision` (always physically; `physical` only changes etcd's wait)."""
        rev = req.revision
        if rev <= self._compact_floor(txn):
            raise EtcdError(Err.COMPACTED)
        if rev > self.current_revision(txn):
            raise EtcdError(Err.FUTURE_REV)
        for rec_key in self._index.compact(txn, rev):
            txn.delete(rec_key, db=self._kv)
        txn.put(_META_COMPACT, _I64.pack(rev), db=self._meta)
        return pb.CompactionResponse()

    def hash_kv(self, txn: lmdb.Transaction, rev: int) -> tuple[int, int, int]:
        """(hash, compact_revision, hash_revision) of all records up to `rev` (0 = current).

        CRC-32 (IEEE) over revision key and record, skipping a tombstone kept at the compaction
        revision as etcd does; only comparable between raftgate members, not with etcd's value.
        compact_revision is -1 when never compacted, like etcd.
        """
        compact_rev, cur = self._compact_floor(txn), self.current_revision(txn)
        if rev > 0 and rev < compact_rev:
            raise EtcdError(Err.COMPACTED)
        if rev > 0 and rev > cur:
            raise EtcdError(Err.FUTURE_REV)
        if rev <= 0:
            rev = cur
        h = zlib.crc32(b"key")
        upper = revision.encode(rev + 1, 0)
        cur_kv = txn.cursor(db=self._kv)
        for k, v in cur_kv:
            if k >= upper:
                break
            if revision.main_of(k) == compact_rev and kv_pb2.KeyValue.FromString(v).version == 0:
                continue
            h = zlib.crc32(v, zlib.crc32(k, h))
        return h & 0xFFFFFFFF, compact_rev, rev

    # ---- another store's history (raftgate snapshot restore of etcd's format) ----
    def load_revision(self, txn: lmdb.Transaction, main: int, sub: int, key: bytes,
                      kv: kv_pb2.KeyValue | None) -> None:
        """Writes one revision of a history read from elsewhere, which must come in revision
        order on an empty store: a put (``kv``, its create revision, version and lease kept) or,
        with ``kv`` None, a delete of ``key``. The caller checked the values."""
        if kv is None:
            txn.put(revision.encode(main, sub), _tombstone(key, main), db=self._kv, append=True)
            self._index.append(txn, key, index.pack(main, sub, 0, 0, 0))
            return
        txn.put(revision.encode(main, sub), kv.SerializeToString(), db=self._kv, append=True)
        self._index.append(txn, key, index.pack(main, sub, kv.create_revision, kv.version, kv.lease))

    def set_loaded_revisions(self, txn: lmdb.Transaction, current: int, compacted: int | None) -> None:
        """The current and compacted revision of a loaded history (None: never compacted)."""
        txn.put(_META_REV, _I64.pack(current), db=self._meta)
        if compacted is not None:
            txn.put(_META_COMPACT, _I64.pack(compacted), db=self._meta)

    def records(self, txn: lmdb.Transaction) -> Iterator[tuple[int, int, bytes]]:
        """Every retained revision as (main, sub, KeyValue bytes; version 0 = a delete), in
        revision order, read lazily (a snapshot in etcd's format streams them)."""
        for k, v in txn.cursor(db=self._kv):
            main, sub = revision.decode(k)
            yield main, sub, v

    def live_leases(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, int]]:
        """(key, lease) of every live key whose newest revision names a lease, by key."""
        for key, raw in self._index.scan(txn, b"\x00", b""):
            lease = index.unpack(raw).lease
            if lease:
                yield key, lease

    def raw_compacted_revision(self, txn: lmdb.Transaction) -> int | None:
        """The recorded compaction revision, None when the store was never compacted."""
        raw = txn.get(_META_COMPACT, db=self._meta)
        return _I64.unpack(raw)[0] if raw else None

    # ---- reads for other components ----
    def get(self, txn: lmdb.Transaction, key: bytes) -> kv_pb2.KeyValue | None:
        """The newest live KeyValue of `key`, or None."""
        e = self._index.get(txn, key)
        return kv_pb2.KeyValue.FromString(self._record(txn, e)) if e is not None else None

    def history(self, txn: lmdb.Transaction, key: bytes) -> list[Entry]:
        """Retained index entries of `key`, oldest first (tombstones have version 0)."""
        return self._index.history(txn, key)

    def changes(self, txn: lmdb.Transaction, first_rev: int, last_rev: int,
                limit: int = 0, max_bytes: int = 0) -> list[tuple[int, bytes]]:
        """The records written at main revisions first_rev..last_rev, in revision order, as
        (main revision, KeyValue bytes; version 0 = a delete); for watches. With `limit` (records)
        or `max_bytes` (their size), stops after the revision that reaches it (a revision is never
        split), so a reader of history holds a bounded amount at a time."""
        out: list[tuple[int, bytes]] = []
        if last_rev < first_rev:
            return out
        cur = txn.cursor(db=self._kv)
        if not cur.set_range(revision.encode(max(first_rev, 0), 0)):
            return out
        upper = revision.encode(last_rev + 1, 0)
        size = 0
        for k, v in cur:
            if k >= upper:
                break
            main = revision.main_of(k)
            if out and main != out[-1][0] and (limit and len(out) >= limit or max_bytes and size >= max_bytes):
                break
            out.append((main, v))
            size += len(v)
        return out

    def previous(self, txn: lmdb.Transaction, key: bytes, rev: int) -> bytes | None:
        """The KeyValue bytes of `key` live just before revision `rev` (for a watch's prev_kv)."""
        e = self._index.get(txn, key, rev - 1)
        if e is None:
            return None
        return txn.get(e.rev, db=self._kv)


def _passes(req: pb.RangeRequest, e: Entry) -> bool:
    if req.max_mod_revision and e.main > req.max_mod_revision:
        return False
    if req.min_mod_revision and e.main < req.min_mod_revision:
        return False
    if req.max_create_revision and e.create_revision > req.max_create_revision:
        return False
    return not (req.min_create_revision and e.create_revision < req.min_create_revision)


def _compare_kv(c: pb.Compare, kv: kv_pb2.KeyValue) -> bool:
    target, union = c.target, c.WhichOneof("target_union")
    result: int
    if target == pb.Compare.VALUE:
        want = c.value if union == "value" else b""
        result = (kv.value > want) - (kv.value < want)
    else:
        if target == pb.Compare.CREATE:
            have, want_i = kv.create_revision, c.create_revision if union == "create_revision" else 0
        elif target == pb.Compare.MOD:
            have, want_i = kv.mod_revision, c.mod_revision if union == "mod_revision" else 0
        elif target == pb.Compare.VERSION:
            have, want_i = kv.version, c.version if union == "version" else 0
        elif target == pb.Compare.LEASE:
            have, want_i = kv.lease, c.lease if union == "lease" else 0
        else:
            have = want_i = 0
        result = (have > want_i) - (have < want_i)
    res = c.result
    if res == pb.Compare.EQUAL:
        return result == 0
    if res == pb.Compare.NOT_EQUAL:
        return result != 0
    if res == pb.Compare.GREATER:
        return result > 0
    if res == pb.Compare.LESS:
        return result < 0
    return True
