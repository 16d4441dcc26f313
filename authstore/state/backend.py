"""The store node's one LMDB environment, and the record of which log index it has applied.

Every commit is synced (LMDB without sync can be corrupted by a machine crash, not only lose
its last transactions); only the meta page sync is relaxed, which at worst undoes the newest
transaction, which the log then replays. Recording the applied index in the same write
transaction as the entries it covers is what makes the replay idempotent.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import lmdb

from raftgate.private_files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, fsync_dir

_APPLIED = b"applied_index"
#: where versions before authstore/node/identity.py kept the member ID (and so sent it in every
#: copy of the store): read once, to take it over, then dropped
LEGACY_MEMBER_ID_KEY = b"member_id"
_TERM = b"applied_term"
#: the node-local sub-database (applied index and term): not part of the replicated state
META_DB = b"meta"
_U64 = struct.Struct(">Q")

DEFAULT_MAP_SIZE = 8 << 30


class Backend:
    def __init__(self, path: Path, map_size: int = DEFAULT_MAP_SIZE) -> None:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self.path = path
        self.map_size = map_size
        self._open()

    def _open(self) -> None:
        # mode: data.mdb and lock.mdb are owner-only (py-lmdb's default 0o755 leaves them 0644
        # under umask 022, readable by every local user)
        self.env = lmdb.open(str(self.path), max_dbs=32, map_size=self.map_size, subdir=True, sync=True,
                             metasync=False, writemap=False, max_readers=1024, mode=PRIVATE_FILE_MODE)
        self._meta = self.env.open_db(META_DB)
        self._page_size = self.env.stat()["psize"]

    def copy_to(self, directory: Path) -> Path:
        """A consistent copy of the whole store (snapshots for followers and clients).

        A plain page copy inside one read transaction, as etcd copies its bbolt file: LMDB's
        compacting copy (MDB_CP_COMPACT) walks sub-databases of duplicates with code that
        crashed the process in LMDB 0.9.36 (the `lmdb` 3.0.0 wheel) once one key of the MVCC
        index had more revisions than fit in a page. The price is that free pages travel too.
        """
        directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        self.env.copy(str(directory), compact=False)
        copy = directory / "data.mdb"
        os.chmod(copy, PRIVATE_FILE_MODE)  # LMDB creates it 0666 less the umask
        return copy

    def replace(self, snapshot_file: Path) -> None:
        """Swaps the store for a copy received from the leader, durably, then reopens it. The
        copy's node-local records are the leader's; this node's member ID is not among them
        (authstore/node/identity.py), and a leader of an older version's ID is dropped (taken
        over as this node's own if its ID file were ever missing)."""
        self.env.close()
        target = self.path / "data.mdb"
        staged = self.path / "data.mdb.incoming"
        os.replace(snapshot_file, staged)
        with open(staged, "rb") as f:
            os.fsync(f.fileno())
        os.replace(staged, target)
        (self.path / "lock.mdb").unlink(missing_ok=True)
        fsync_dir(self.path)
        self._open()
        self.drop_legacy_member_id()

    def applied_index(self, txn: lmdb.Transaction) -> int:
        raw = txn.get(_APPLIED, db=self._meta)
        return _U64.unpack(raw)[0] if raw else 0

    def set_applied(self, txn: lmdb.Transaction, index: int, term: int) -> None:
        txn.put(_APPLIED, _U64.pack(index), db=self._meta)
        txn.put(_TERM, _U64.pack(term), db=self._meta)

    def meta_get(self, txn: lmdb.Transaction, key: bytes) -> bytes | None:
        return txn.get(key, db=self._meta)

    def meta_put(self, txn: lmdb.Transaction, key: bytes, value: bytes) -> None:
        txn.put(key, value, db=self._meta)

    def legacy_member_id(self) -> int:
        """The member ID an older version kept in this store (0: none)."""
        with self.env.begin() as txn:
            raw = txn.get(LEGACY_MEMBER_ID_KEY, db=self._meta)
        return _U64.unpack(raw)[0] if raw else 0

    def drop_legacy_member_id(self) -> None:
        """Removes an older version's member ID record, durably, if the store holds one."""
        with self.env.begin(write=True) as txn:
            dropped = txn.delete(LEGACY_MEMBER_ID_KEY, db=self._meta)
        if dropped:
            self.sync()

    def sync(self) -> None:
        """Forces LMDB to disk, after which log segments up to the applied index may be released."""
        self.env.sync(True)

    def in_use(self) -> int:
        """Bytes of pages ever used (LMDB reuses freed pages but never shrinks), without a stat()."""
        return (self.env.info()["last_pgno"] + 1) * self._page_size

    def size(self) -> tuple[int, int]:
        """(bytes the file takes, bytes in use), as etcd's dbSize / dbSizeInUse."""
        info = self.env.info()
        stat = self.env.stat()
        in_use = (info["last_pgno"] + 1) * stat["psize"]
        try:
            total = (self.path / "data.mdb").stat().st_size
        except OSError:
            total = in_use
        return total, in_use

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()


def content_hash(env: lmdb.Environment, txn: lmdb.Transaction) -> int:
    """CRC-32 over every sub-database but the node-local meta: equal on members that applied the
    same entries (Maintenance.Hash; ``raftgate snapshot status`` on an LMDB snapshot)."""
    crc = 0
    with txn.cursor() as names:
        dbs = [name for name, _ in names if name != META_DB]
    for name in dbs:
        db = env.open_db(name, txn=txn, create=False)
        with txn.cursor(db=db) as cur:
            for key, value in cur:
                crc = zlib.crc32(value, zlib.crc32(key, crc))
    return crc
