"""Lockout: failed Authenticate calls counted per user name, in log order on every node.

A proxy records each failed password check as an ``auth_failures`` entry; the store node that logs
it stamps its policy (``attempts`` failures within ``duration_ms``) and the entry's time. Apply
counts from the entry alone (no clock): ``attempts`` failures of one name within ``duration_ms``
lock the name for ``duration_ms`` from the time of the entry that reached the count. While locked,
Authenticate's apply refuses the name with the wrong-password error, whatever the password.

Time comes from the logging node's wall clock, which may be skewed or change on failover. A time
``t`` is taken to fall within a period started at ``base`` only when ``|t - base| < duration``:
a clock far ahead can therefore neither lock a name for longer than twice the duration as any
other clock sees it, nor make a count window last for ever; a clock going back cannot either.

Records of existing users are kept (one per user at most; dropped with the user, on its password
change and on a successful login). Records of names that do not exist are counted too (a caller
must not learn which names exist) but are bounded: at most ``MAX_UNKNOWN_NAMES``, the one
touched least recently (by entry time, ties by name digest) evicted first - all from replicated
state, so every node evicts the same one.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

import lmdb

DB_LOCKOUT = b"auth_lockout"  # name key -> _RECORD
DB_LOCKOUT_AGE = b"auth_lockout_age"  # be64(last time) + sha256(name key) -> name key (unknown names only)

#: Names that do not exist tracked at once; the least recently failed one is evicted beyond it.
MAX_UNKNOWN_NAMES = 4096
#: Names one auth_failures entry may carry (the proxy batches concurrent failures).
MAX_NAMES_PER_ENTRY = 256

# count, window start, locked at, lock duration, last failure time, flags (1: locked, 2: unknown name)
_RECORD = struct.Struct(">Iqqqqb")
_LOCKED = 1
_UNKNOWN = 2
_OFFSET = 1 << 63  # times as unsigned big-endian keys that sort in time order (negative times too)


def near(t: int, base: int, duration_ms: int) -> bool:
    """``t`` within the period started at ``base``, on a clock that may be skewed either way."""
    return abs(t - base) < duration_ms


@dataclass
class Record:
    count: int
    window_start: int
    locked_at: int
    lock_ms: int
    last: int
    flags: int

    def locked_at_time(self, t: int) -> bool:
        return bool(self.flags & _LOCKED) and near(t, self.locked_at, self.lock_ms)

    def pack(self) -> bytes:
        return _RECORD.pack(self.count, self.window_start, self.locked_at, self.lock_ms, self.last, self.flags)

    @classmethod
    def unpack(cls, raw: bytes) -> Record:
        return cls(*_RECORD.unpack(raw))


def _age_key(last: int, key: bytes) -> bytes:
    return ((last + _OFFSET) % (1 << 64)).to_bytes(8, "big") + hashlib.sha256(key).digest()


class Lockout:
    """The failure records over LMDB; every method takes the caller's transaction."""

    def __init__(self, env: lmdb.Environment, key: Callable[[str], bytes],
                 max_unknown: int = MAX_UNKNOWN_NAMES) -> None:
        self._key = key
        self._max_unknown = max_unknown
        with env.begin(write=True) as txn:
            self._db = env.open_db(DB_LOCKOUT, txn=txn)
            self._age = env.open_db(DB_LOCKOUT_AGE, txn=txn)

    def get(self, txn: lmdb.Transaction, name: str) -> Record | None:
        raw = txn.get(self._key(name), db=self._db) if name else None
        return Record.unpack(raw) if raw is not None else None

    def is_locked(self, txn: lmdb.Transaction, name: str, t: int) -> bool:
        rec = self.get(txn, name)
        return rec is not None and rec.locked_at_time(t)

    def clear(self, txn: lmdb.Transaction, name: str) -> None:
        """Lifts the lock and forgets the count (a successful login, a password set, the user
        added or deleted)."""
        if not name:
            return
        key = self._key(name)
        raw = txn.get(key, db=self._db)
        if raw is None:
            return
        rec = Record.unpack(raw)
        if rec.flags & _UNKNOWN:
            txn.delete(_age_key(rec.last, key), db=self._age)
        txn.delete(key, db=self._db)

    def record_failure(self, txn: lmdb.Transaction, name: str, t: int, attempts: int, duration_ms: int,
                       exists: bool) -> bool:
        """Counts one failure of ``name`` at entry time ``t``; True when it locks the name now.

        A failure while the name is locked is counted nowhere (the lock is not extended).
        """
        if not name or attempts <= 0 or duration_ms <= 0:
            return False
        key = self._key(name)
        raw = txn.get(key, db=self._db)
        rec = Record.unpack(raw) if raw is not None else None
        if rec is not None and rec.flags & _UNKNOWN:
            txn.delete(_age_key(rec.last, key), db=self._age)
        locks = False
        if rec is not None and rec.locked_at_time(t):
            rec.last = t
        elif rec is not None and not rec.flags & _LOCKED and near(t, rec.window_start, duration_ms):
            rec.count += 1
            rec.last = t
        else:
            rec = Record(1, t, 0, 0, t, 0)
        if not rec.flags & _LOCKED and rec.count >= attempts:
            rec.flags |= _LOCKED
            rec.locked_at, rec.lock_ms = t, duration_ms
            locks = True
        rec.flags = (rec.flags & _LOCKED) | (0 if exists else _UNKNOWN)
        if not exists:
            if raw is None:
                self._make_room(txn)
            txn.put(_age_key(rec.last, key), key, db=self._age)
        txn.put(key, rec.pack(), db=self._db)
        return locks

    def _make_room(self, txn: lmdb.Transaction) -> None:
        """Evicts the least recently failed unknown names until one more fits."""
        while txn.stat(self._age)["entries"] >= self._max_unknown:
            with txn.cursor(db=self._age) as cur:
                if not cur.first():
                    return
                age_key, key = bytes(cur.key()), bytes(cur.value())
            txn.delete(age_key, db=self._age)
            txn.delete(key, db=self._db)

    def locked_names(self, txn: lmdb.Transaction, t: int) -> int:
        """How many names are locked at time ``t`` (for the gauge; never for a decision)."""
        return sum(1 for raw in txn.cursor(db=self._db).iternext(keys=False) if Record.unpack(raw).locked_at_time(t))

    def unknown_names(self, txn: lmdb.Transaction) -> int:
        return int(txn.stat(self._age)["entries"])
