"""etcd's backend quota (``--quota-backend-bytes``), decided where etcd decides it: before the log.

The node that takes a write (the leader: followers refuse client writes) weighs it against the
store's size; if the store would pass its quota it refuses the write with NOSPACE and puts the
alarm into the log (``store_alarm``: ACTIVATE NOSPACE with its own member ID), as etcd's
quotaAlarmer does. Apply refuses writes that add data while the alarm is set - from the
replicated alarm alone, so every replica decides the same (authstore/state/apply.py). The size is
local and may differ between nodes; that is harmless here, outside apply.

The size is the pages LMDB's trees hold now (freed pages are not counted: LMDB reuses them, so a
compaction wins space back as etcd's compaction and defragmentation do), read from the main
database's records of the named databases without opening any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import lmdb

from authstore.state.apply import Applier, adds_data
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

log = logging.getLogger("raftgate.store.quota")

#: LMDB's MDB_db record, the value of a named database's key in the main database:
#: pad, flags, depth, branch pages, leaf pages, overflow pages, entries, root.
_MDB_DB = struct.Struct("=IHHQQQQQ")
#: etcd's per-request overhead in its quota cost (quota.go: kvOverhead, leaseOverhead)
OVERHEAD = 256


def live_bytes(env: lmdb.Environment) -> int:
    """Bytes of the pages every database's tree holds (and the two meta pages)."""
    with env.begin() as txn:
        main = env.stat()
        pages = 2 + main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        for _name, record in txn.cursor():
            if len(record) == _MDB_DB.size:
                _, _, _, branch, leaf, overflow, _, _ = _MDB_DB.unpack(record)
                pages += branch + leaf + overflow
    return int(pages * main["psize"])


def used_bytes_bound(env: lmdb.Environment, page_size: int) -> int:
    """At least ``live_bytes(env)``: the pages up to the last one LMDB has used (each page a tree
    holds is one of them), read from the environment's info without a transaction."""
    return (int(env.info()["last_pgno"]) + 1) * page_size


class Quota:
    def __init__(self, applier: Applier, quota_bytes: int, member_id: int,
                 propose: Callable[[bytes], Awaitable[Any]], applied: Callable[[], int]) -> None:
        self.applier = applier
        self._applied = applied
        #: (applied index, live bytes): the size only changes when a batch is applied
        self._size = (-1, 0)
        self.quota_bytes = quota_bytes
        self.member_id = member_id
        self._propose = propose
        self._raising: asyncio.Task[None] | None = None
        self._env: lmdb.Environment | None = None
        self._page_size = 0
        #: (applied index, used_bytes_bound)
        self._bound_at = (-1, 0)

    def available(self, req: ipb.InternalRaftRequest, size: int) -> bool:
        """etcd's Available: requests that add nothing always pass; others while the store and
        the request stay below the quota. The live pages are counted only when the file's
        high-water mark (every page ever used, which they cannot exceed) does not already say so."""
        if not adds_data(req):
            return True
        if self._bound() + size + OVERHEAD < self.quota_bytes:
            return True
        return self._live_bytes() + size + OVERHEAD < self.quota_bytes

    def _bound(self) -> int:
        """``used_bytes_bound``, read again only when a batch was applied (as the live size)."""
        index = self._applied()
        if self._bound_at[0] != index:
            env = self.applier.env  # a snapshot restore replaces it
            if env is not self._env:
                self._env, self._page_size = env, int(env.stat()["psize"])
            self._bound_at = (index, used_bytes_bound(env, self._page_size))
        return self._bound_at[1]

    def _live_bytes(self) -> int:
        index = self._applied()
        if self._size[0] != index:
            self._size = (index, live_bytes(self.applier.env))
        return self._size[1]

    async def check(self, req: ipb.InternalRaftRequest, size: int) -> None:
        """Raises NOSPACE after logging the alarm when the write would pass the quota."""
        if self.available(req, size):
            return
        if self._raising is None or self._raising.done():
            self._raising = asyncio.get_running_loop().create_task(self._raise_alarm())
        with contextlib.suppress(Exception):
            await asyncio.shield(self._raising)
        raise EtcdError(Err.NO_SPACE)

    async def _raise_alarm(self) -> None:
        with self.applier.env.begin() as txn:
            current = self.applier.alarms(txn).alarms
        if any(a.alarm == pb.NOSPACE and a.memberID == self.member_id for a in current):
            return  # logged already: apply refuses the write anyway
        log.warning("the store passed its quota of %d bytes: proposing the NOSPACE alarm", self.quota_bytes)
        alarm = pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=self.member_id, alarm=pb.NOSPACE)
        try:
            await self._propose(ipb.InternalRaftRequest(store_alarm=alarm).SerializeToString())
        except EtcdError as exc:
            log.warning("the NOSPACE alarm could not be logged: %s", exc.message)
