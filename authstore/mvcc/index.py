"""The key index: for every key, the ordered list of its revisions, kept in LMDB.

One dupsort sub-database maps a key to fixed-size entries sorted by revision. Each entry carries
what reads and writes need besides the value (create revision, version, lease), so a Range of the
newest revision of a key is one seek plus one `last_dup`, a historical read is one `set_range_dup`,
and puts, keys-only reads, counts and revision filters never touch the value records.

An entry whose version is 0 is a tombstone: the key was deleted at that revision. A key's entries
read oldest to newest form etcd's "generations"; a tombstone closes one.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import lmdb

from authstore.mvcc import revision

# main, sub, create_revision, version, lease
_ENTRY = struct.Struct(">QQQQq")
ENTRY_SIZE = _ENTRY.size

DB_NAME = b"mvcc_index"


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
        self._db = env.open_db(DB_NAME, txn=txn, dupsort=True, dupfixed=True)
        # LMDB refuses keys longer than this; longer keys can never be stored, so lookups skip them
        self.max_key = env.max_key_size()

    # ---- lookups ----
    def latest(self, txn: lmdb.Transaction, key: bytes) -> Entry | None:
        """The newest entry of `key` (possibly a tombstone), or None if the key has no history."""
        if not key or len(key) > self.max_key:
            return None
        cur = txn.cursor(db=self._db)
        if not cur.set_key(key):
            return None
        cur.last_dup()
        return unpack(cur.value())

    def get(self, txn: lmdb.Transaction, key: bytes, at_rev: int | None = None) -> Entry | None:
        """The live entry of `key` at revision `at_rev` (None = newest); None if absent there."""
        if not key or len(key) > self.max_key:
            return None
        cur = txn.cursor(db=self._db)
        if not cur.set_key(key):
            return None
        raw = self._visible(cur, key, at_rev)
        return unpack(raw) if raw is not None else None

    def _visible(self, cur: lmdb.Cursor, key: bytes, at_rev: int | None) -> bytes | None:
        """Raw live entry at `at_rev` for the key the cursor sits on; leaves the cursor on that key."""
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

    def scan(
        self, txn: lmdb.Transaction, key: bytes, end: bytes | None, at_rev: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """(key, raw entry) of every key live at `at_rev` in [key, end), ascending.

        `end` None means the single key; b"" means no upper bound.
        """
        if end is None:
            if key and len(key) <= self.max_key:
                cur = txn.cursor(db=self._db)
                if cur.set_key(key):
                    raw = self._visible(cur, key, at_rev)
                    if raw is not None:
                        yield key, raw
            return
        if end and end <= key:
            return
        cur = txn.cursor(db=self._db)
        if not cur.set_range(key[: self.max_key]):
            return
        while True:
            k = cur.key()
            if end and k >= end:
                return
            if k >= key:
                raw = self._visible(cur, k, at_rev)
                if raw is not None:
                    yield k, raw
            if not cur.next_nodup():
                return

    def count(self, txn: lmdb.Transaction, key: bytes, end: bytes | None, at_rev: int | None = None) -> int:
        """Number of keys live at `at_rev` in the range (see `scan`)."""
        return sum(1 for _ in self.scan(txn, key, end, at_rev))

    def history(self, txn: lmdb.Transaction, key: bytes) -> list[Entry]:
        """Every retained entry of `key`, oldest first (for watch and for tests)."""
        if not key or len(key) > self.max_key:
            return []
        cur = txn.cursor(db=self._db)
        if not cur.set_key(key):
            return []
        return [unpack(v) for v in cur.iternext_dup()]

    # ---- writes ----
    def append(self, txn: lmdb.Transaction, key: bytes, entry: bytes) -> None:
        """Records a new revision of `key`; revisions only ever grow, so it lands last."""
        txn.put(key, entry, db=self._db, dupdata=True)

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
        for key, raw in doomed:
            txn.delete(key, raw, db=self._db)
        return [raw[: revision.SIZE] for _, raw in doomed]
