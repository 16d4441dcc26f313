"""The key index: for every key, the ordered list of its revisions, kept in LMDB.

One dupsort sub-database maps a key to fixed-size entries sorted by revision. Each entry carries
what reads and writes need besides the value (create revision, version, lease), so a Range of the
newest revision of a key is one seek plus one `last_dup`, a historical read is one `set_range_dup`,
and puts, keys-only reads, counts and revision filters never touch the value records.

An entry whose version is 0 is a tombstone: the key was deleted at that revision. A key's entries
read oldest to newest form etcd's "generations"; a tombstone closes one.

Long keys. LMDB caps a key at 511 bytes, etcd caps a key only by the request size (1.5 MiB). A
key of at most PREFIX bytes is its own index key (so short keys pay nothing). A longer key is
indexed as its first PREFIX bytes + the SHA-256 of the whole key (`index_key`), and the full key is
kept in `mvcc_longkey` (index key -> key). Length alone tells the two kinds apart: an index key
longer than PREFIX is a long one. This keeps index order equal to key order everywhere except
among long keys sharing their first PREFIX bytes (a "bucket"), which sit together in hash order;
`scan` reads such a bucket whole, sorts it by full key and applies the true range bounds. Proof
sketch: a short key s and a long key L with prefix P = L[:PREFIX] compare like s and P + hash
(they differ before byte PREFIX, or s is a prefix of P and so of L), and two long keys with
different prefixes compare like their prefixes.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from typing import NamedTuple

import lmdb

from authstore.state.mvcc import revision

# main, sub, create_revision, version, lease
_ENTRY = struct.Struct(">QQQQq")
ENTRY_SIZE = _ENTRY.size

DB_NAME = b"mvcc_index"
LONG_DB_NAME = b"mvcc_longkey"

#: keys up to this length are their own index key; longer ones become PREFIX bytes + SHA-256
PREFIX = 400
#: length of the index key of every long key
LONG_INDEX_KEY = PREFIX + hashlib.sha256().digest_size


def index_key(key: bytes) -> bytes:
    """The LMDB key under which `key` is indexed (the key itself unless longer than PREFIX)."""
    if len(key) <= PREFIX:
        return key
    return key[:PREFIX] + hashlib.sha256(key).digest()


class Entry(NamedTuple):
    """One revision of one key, decoded."""

    main: int
    sub: int
    create_revision: int
    version: int
    lease: int

    @property
    def tombstone(self) -> bool:
        return self.version == 0

    @property
    def rev(self) -> bytes:
        """The record key of this revision in the value store."""
        return revision.encode(self.main, self.sub)


def pack(main: int, sub: int, create_revision: int, version: int, lease: int) -> bytes:
    return _ENTRY.pack(main, sub, create_revision, version, lease)


def unpack(raw: bytes) -> Entry:
    return Entry._make(_ENTRY.unpack(raw))


def _is_live(raw: bytes) -> bool:
    # version is bytes 24..32; zero means tombstone
    return raw[24:32] != b"\x00\x00\x00\x00\x00\x00\x00\x00"


class KeyIndex:
    """Key -> revisions, with point and range lookups at any retained revision."""

    def __init__(self, env: lmdb.Environment, txn: lmdb.Transaction) -> None:
        if env.max_key_size() < LONG_INDEX_KEY + 8:  # + 8: the lessor prefixes a lease id
            raise RuntimeError(f"LMDB max key size {env.max_key_size()} is below {LONG_INDEX_KEY + 8}")
        self._db = env.open_db(DB_NAME, txn=txn, dupsort=True, dupfixed=True)
        self._long = env.open_db(LONG_DB_NAME, txn=txn)

    # ---- lookups ----
    def latest(self, txn: lmdb.Transaction, key: bytes) -> Entry | None:
        """The newest entry of `key` (possibly a tombstone), or None if the key has no history."""
        if not key:
            return None
        cur = txn.cursor(db=self._db)
        if not cur.set_key(key if len(key) <= PREFIX else index_key(key)):
            return None
        cur.last_dup()
        return unpack(cur.value())

    def get(self, txn: lmdb.Transaction, key: bytes, at_rev: int | None = None) -> Entry | None:
        """The live entry of `key` at revision `at_rev` (None = newest); None if absent there."""
        if not key:
            return None
        ikey = key if len(key) <= PREFIX else index_key(key)
        cur = txn.cursor(db=self._db)
        if not cur.set_key(ikey):
            return None
        raw = self._visible(cur, ikey, at_rev)
        return unpack(raw) if raw is not None else None

    def _visible(self, cur: lmdb.Cursor, key: bytes, at_rev: int | None) -> bytes | None:
        """Raw live entry at `at_rev` for the index key the cursor sits on; leaves the cursor on it."""
        if at_rev is None:
            cur.last_dup()
            raw = cur.value()
        else:
            # first entry newer than at_rev, then one step back
            if cur.set_range_dup(key, _ENTRY.pack(at_rev + 1, 0, 0, 0, 0)):
                if not cur.prev_dup():
                    cur.set_key(key)  # nothing at or before at_rev; a failed step may unposition
                    return None
            else:
                cur.set_key(key)
                cur.last_dup()
            raw = cur.value()
        return raw if _is_live(raw) else None

    def full_key(self, txn: lmdb.Transaction, ikey: bytes) -> bytes:
        """The key an index key stands for."""
        if len(ikey) <= PREFIX:
            return ikey
        key = txn.get(ikey, db=self._long)
        if key is None:  # written with the first entry, dropped with the last: a miss is corruption
            raise RuntimeError("mvcc: no full key stored for a long index key")
        return key

    def scan(
        self, txn: lmdb.Transaction, key: bytes, end: bytes | None, at_rev: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, raw entry) of every key live at `at_rev` in [key, end), ascending by key.

        `end` None means the single key; b"" means no upper bound.
        """
        if end is None:
            if key:
                ikey = key if len(key) <= PREFIX else index_key(key)
                cur = txn.cursor(db=self._db)
                if cur.set_key(ikey):
                    raw = self._visible(cur, ikey, at_rev)
                    if raw is not None:
                        yield key, raw
            return
        if end and end <= key:
            return
        cur = txn.cursor(db=self._db)
        # a long start key: its bucket begins at its prefix (a short key equal to the prefix sorts
        # before the start and is skipped by the bound check below)
        if not cur.set_range(key if len(key) <= PREFIX else key[:PREFIX]):
            return
        longs = txn.cursor(db=self._long)  # long index keys, in index order
        k = cur.key()
        while True:
            # every index key below the prefix of the next long key (and below `end`) is a short
            # key, in key order: walk those with no per-key work beyond the original comparisons
            lim = end
            if longs.set_range(k):
                nxt = longs.key()[:PREFIX]
                if not lim or nxt < lim:
                    lim = nxt
            while not lim or k < lim:
                if k >= key:
                    raw = self._visible(cur, k, at_rev)
                    if raw is not None:
                        yield k, raw
                if not cur.next_nodup():
                    return
                k = cur.key()
            if len(k) <= PREFIX:
                if end and k >= end:
                    return
                # the short key equal to the next bucket's prefix: it sorts before the whole bucket
                if k >= key:
                    raw = self._visible(cur, k, at_rev)
                    if raw is not None:
                        yield k, raw
                if not cur.next_nodup():
                    return
                k = cur.key()
                continue
            # a bucket of long keys sharing prefix p: every key in it is > p, and every index key
            # after it is greater than all of them
            p = k[:PREFIX]
            if end and end <= p:
                return
            live: list[tuple[bytes, bytes]] = []
            more = True
            while True:
                raw = self._visible(cur, k, at_rev)
                if raw is not None:
                    live.append((k, raw))
                if not cur.next_nodup():
                    more = False
                    break
                k = cur.key()
                if len(k) <= PREFIX or k[:PREFIX] != p:
                    break
            rows = sorted((self.full_key(txn, ik), raw) for ik, raw in live)
            for full, raw in rows:
                if full < key:
                    continue
                if end and full >= end:
                    return
                yield full, raw
            if not more:
                return

    def count(self, txn: lmdb.Transaction, key: bytes, end: bytes | None, at_rev: int | None = None) -> int:
        """Number of keys live at `at_rev` in the range (see `scan`)."""
        return sum(1 for _ in self.scan(txn, key, end, at_rev))

    def history(self, txn: lmdb.Transaction, key: bytes) -> list[Entry]:
        """Every retained entry of `key`, oldest first (for watch and for tests)."""
        if not key:
            return []
        cur = txn.cursor(db=self._db)
        if not cur.set_key(index_key(key)):
            return []
        return [unpack(v) for v in cur.iternext_dup()]

    # ---- writes ----
    def append(self, txn: lmdb.Transaction, key: bytes, entry: bytes) -> None:
        """Records a new revision of `key`; revisions only ever grow, so it lands last."""
        if len(key) <= PREFIX:
            txn.put(key, entry, db=self._db, dupdata=True)
            return
        ikey = index_key(key)
        txn.put(ikey, key, db=self._long, overwrite=False)
        txn.put(ikey, entry, db=self._db, dupdata=True)

    def compact(self, txn: lmdb.Transaction, at_rev: int) -> list[bytes]:
        """Drops history no read at revision >= `at_rev` can see; returns the dropped record keys.

        Per key, the newest entry at or below `at_rev` stays (readers at `at_rev` need it) with
        everything after it. A tombstone there stays only if it is exactly at `at_rev` (a watcher
        starting at `at_rev` must still see the delete); an older tombstone goes, and with it the
        key once nothing newer exists. This matches etcd >= 3.5.16.
        """
        doomed: list[tuple[bytes, bytes]] = []
        cur = txn.cursor(db=self._db)
        ok = cur.first()
        while ok:
            key = cur.key()
            older: list[bytes] = []
            for raw in cur.iternext_dup():
                if revision.main_of(raw) > at_rev:
                    break
                older.append(raw)
            if older:
                last = older[-1]
                drop = older if (not _is_live(last) and revision.main_of(last) < at_rev) else older[:-1]
                doomed.extend((key, raw) for raw in drop)
            ok = cur.set_key(key) and cur.next_nodup()  # iterating dups to the end unpositions
        emptied: set[bytes] = set()
        for key, raw in doomed:
            txn.delete(key, raw, db=self._db)
            if len(key) > PREFIX:
                emptied.add(key)
        for ikey in emptied:  # a long key whose whole history went no longer needs its full key
            if txn.get(ikey, db=self._db) is None:
                txn.delete(ikey, db=self._long)
        return [raw[: revision.SIZE] for _, raw in doomed]
