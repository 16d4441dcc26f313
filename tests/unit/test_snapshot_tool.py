"""`raftgate snapshot status` prints what etcdutl 3.5.1 prints for the same numbers (its output
for an etcd snapshot, copied from a run: hash 65e8aa98, revision 2, 7 keys, 20480 bytes)."""

from __future__ import annotations

from pathlib import Path

from authstore.api.stamp import stamp
from authstore.raft.types import Entry, EntryType
from authstore.snapshot_tool import Status, _human_bytes, format_status, status
from authstore.state.apply import Applier
from authstore.state.backend import Backend, content_hash
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2

ETCDUTL = Status(hash=1709746840, revision=2, total_key=7, total_size=20480)


def test_status_formats_as_etcdutl() -> None:
    assert format_status(ETCDUTL, "simple") == "65e8aa98, 2, 7, 20 kB"
    assert format_status(ETCDUTL, "json") == '{"hash":1709746840,"revision":2,"totalKey":7,"totalSize":20480}'
    assert format_status(ETCDUTL, "table") == "\n".join([
        "+----------+----------+------------+------------+",
        "|   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |",
        "+----------+----------+------------+------------+",
        "| 65e8aa98 |        2 |          7 |      20 kB |",
        "+----------+----------+------------+------------+",
    ])


def test_sizes_in_si_units_as_go_humanize() -> None:
    assert [_human_bytes(n) for n in (0, 9, 999, 1000, 2138112, 119_000, 5 << 30)] == \
        ["0 B", "9 B", "999 B", "1.0 kB", "2.1 MB", "119 kB", "5.4 GB"]


def _applied_store(directory: Path, member_id: int, puts: int) -> tuple[Backend, Applier]:
    backend = Backend(directory, map_size=64 << 20)
    applier = Applier(backend, member_id=member_id)
    reqs = [ipb.InternalRaftRequest(put=rpc_pb2.PutRequest(key=b"k%d" % i, value=b"v%d" % i)) for i in range(puts)]
    reqs.append(ipb.InternalRaftRequest(lease_grant=rpc_pb2.LeaseGrantRequest(ID=7, TTL=600)))
    applier.apply([Entry(term=1, index=i + 1, type=EntryType.NORMAL,
                         data=stamp(r.SerializeToString(), 100 + i, 1_700_000_000_000)) for i, r in enumerate(reqs)], 1)
    return backend, applier


def test_status_hash_of_a_raftgate_snapshot_is_maintenance_hash_of_the_store(tmp_path: Path) -> None:
    """`raftgate snapshot status` and Maintenance.Hash compute one hash (content_hash): a copy's hash
    is the hash of the store it was taken from, and it leaves the node-local meta out, so members
    that applied the same entries agree whatever their member IDs."""
    one, a1 = _applied_store(tmp_path / "one", member_id=1, puts=20)
    two, a2 = _applied_store(tmp_path / "two", member_id=2, puts=20)
    three, a3 = _applied_store(tmp_path / "three", member_id=1, puts=21)
    try:
        (tmp_path / "snap").mkdir()
        copy = a1.snapshot(tmp_path / "snap")
        with one.env.begin() as txn:
            live = content_hash(one.env, txn)
        with two.env.begin() as txn:
            other_member = content_hash(two.env, txn)
        with three.env.begin() as txn:
            one_more_put = content_hash(three.env, txn)
        assert status(copy).hash == live == other_member
        assert one_more_put != live
    finally:
        for backend in (one, two, three):
            backend.close()
