"""raftgate's state as etcd's buckets and back (authstore/etcd_format/snapshot.py), without the
bbolt file between them: what etcd's code reads from each bucket, and every refusal of a bucket
from a hostile file."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from authstore.etcd_format import snapshot as es
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from authstore.state.mvcc.kvstore import KVStore
from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2 as pb
from protos.mvccpb import kv_pb2

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4))


class Source:
    """Buckets in memory, as a BoltReader gives them."""

    def __init__(self, buckets: dict[bytes, dict[bytes, bytes]]) -> None:
        self.data = buckets

    def buckets(self) -> list[bytes]:
        return sorted(self.data)

    def items(self, bucket: bytes) -> Iterator[tuple[bytes, bytes]]:
        yield from sorted(self.data[bucket].items())

    def get(self, bucket: bytes, key: bytes) -> bytes | None:
        return self.data.get(bucket, {}).get(key)


def _populate(tmp: Path) -> Backend:
    backend = Backend(tmp / "src")
    a = Applier(backend, 7)
    with backend.env.begin(write=True) as txn:
        lease = a.lessor.grant(txn, pb.LeaseGrantRequest(ID=0x1234, TTL=300), 1000).ID
        a.kv.put(txn, pb.PutRequest(key=b"a", value=b"1"))                    # rev 2
        a.kv.put(txn, pb.PutRequest(key=b"a", value=b"2"))                    # rev 3
        a.kv.put(txn, pb.PutRequest(key=b"gone", value=b"x"))                 # rev 4
        a.kv.delete_range(txn, pb.DeleteRangeRequest(key=b"gone"))            # rev 5
        a.kv.put(txn, pb.PutRequest(key=b"leased", value=b"l", lease=lease))  # rev 6
        a.kv.put(txn, pb.PutRequest(key=b"a", value=b"3"))                    # rev 7
        a.kv.put(txn, pb.PutRequest(key=b"L" * 600, value=b"long"))           # rev 8
        a.kv.compact(txn, pb.CompactionRequest(revision=3))
        hashed = base64.b64encode(HASH).decode()
        for name in ("root", "alice"):
            a.auth.user_add(txn, pb.AuthUserAddRequest(name=name, hashedPassword=hashed))
        a.auth.user_add(txn, pb.AuthUserAddRequest(name="svc", options=auth_pb2.UserAddOptions(no_password=True)))
        a.auth.role_add(txn, pb.AuthRoleAddRequest(name="reader"))
        a.auth.role_grant_permission(txn, pb.AuthRoleGrantPermissionRequest(name="reader", perm=auth_pb2.Permission(
            permType=auth_pb2.Permission.READ, key=b"a", range_end=b"b")))
        a.auth.user_grant_role(txn, pb.AuthUserGrantRoleRequest(user="root", role="root"))
        a.auth.user_grant_role(txn, pb.AuthUserGrantRoleRequest(user="alice", role="reader"))
        a.auth.enable(txn, pb.AuthEnableRequest())
        a.membership.set_cluster_id(txn, 99)
    return backend


def _buckets(backend: Backend) -> dict[bytes, dict[bytes, bytes]]:
    out: dict[bytes, dict[bytes, bytes]] = {}
    names = []
    exporter = es.Exporter(backend)
    with backend.env.begin() as txn:
        for name, lazy in exporter.buckets(txn):
            names.append(name)
            pairs = list(lazy)
            keys = [k for k, _ in pairs]
            assert keys == sorted(keys), name
            out[name] = dict(pairs)
    assert names == sorted(names) == sorted(es.BUCKETS)
    return out


def test_buckets_hold_what_etcd_reads(tmp_path: Path) -> None:
    b = _buckets(_populate(tmp_path))
    keys = b[b"key"]
    # compaction at 3 keeps a@3 and later, drops a@2, gone@4 and its delete stay (above 3)
    assert [es.parse_rev_key(k)[:2] for k in keys] == [(3, 0), (4, 0), (5, 0), (6, 0), (7, 0), (8, 0)]
    tomb = es.rev_key(5, 0, True)
    assert len(tomb) == 18 and tomb in keys
    assert kv_pb2.KeyValue.FromString(keys[tomb]) == kv_pb2.KeyValue(key=b"gone")
    a7 = kv_pb2.KeyValue.FromString(keys[es.rev_key(7, 0)])
    assert (a7.key, a7.value, a7.create_revision, a7.mod_revision, a7.version) == (b"a", b"3", 2, 7, 3)
    assert es._compact_rev(b[b"meta"][b"finishedCompactRev"], "") == 3
    assert b[b"auth"][b"authEnabled"] == b"\x01" and len(b[b"auth"][b"authRevision"]) == 8
    assert sorted(b[b"authUsers"]) == [b"alice", b"root", b"svc"]
    assert auth_pb2.User.FromString(b[b"authUsers"][b"alice"]).password == HASH
    assert list(b[b"authRoles"]) == [b"reader"]
    lease = es.Lease.FromString(b[b"lease"][(0x1234).to_bytes(8, "big")])
    assert (lease.ID, lease.TTL) == (0x1234, 300)
    assert b[b"cluster"] == {b"clusterVersion": b"3.5.0"}
    assert json.loads(b[b"meta"][b"confState"]) == {"auto_leave": False}


def test_round_trip_keeps_history_leases_and_accounts(tmp_path: Path) -> None:
    src = _populate(tmp_path)
    buckets = _buckets(src)
    dst = Backend(tmp_path / "dst")
    loaded = es.load(Source(buckets), dst, now_ms=5000)
    assert (loaded.revision, loaded.compacted, loaded.revisions) == (8, 3, 6)
    a_src, a_dst = Applier(src, 1), Applier(dst, 1)
    with src.env.begin() as t1, dst.env.begin() as t2:
        assert list(a_src.kv.records(t1)) == list(a_dst.kv.records(t2))
        for key in (b"a", b"gone", b"leased", b"L" * 600):
            assert a_src.kv.history(t1, key) == a_dst.kv.history(t2, key)
        assert a_dst.kv.current_revision(t2) == 8 and a_dst.kv.compacted_revision(t2) == 3
        assert a_dst.lessor.attached_keys(t2, 0x1234) == [b"leased"]
        assert a_dst.lessor.get(t2, 0x1234).ttl == 300
        assert [u.SerializeToString() for u in a_src.auth.users(t1)] == \
            [u.SerializeToString() for u in a_dst.auth.users(t2)]
        assert [r.SerializeToString() for r in a_src.auth.roles(t1)] == \
            [r.SerializeToString() for r in a_dst.auth.roles(t2)]
        assert a_dst.auth.is_enabled(t2) and a_dst.auth.revision(t2) == a_src.auth.revision(t1)
        perms = a_dst.auth.user_permissions(t2, "alice")
        assert perms is not None
        rng = a_dst.kv.range(t2, pb.RangeRequest(key=b"a"))
        assert (rng.kvs[0].value, rng.kvs[0].version, rng.kvs[0].create_revision) == (b"3", 3, 2)


def _good() -> dict[bytes, dict[bytes, bytes]]:
    kv = kv_pb2.KeyValue(key=b"k", value=b"v", create_revision=2, mod_revision=2, version=1).SerializeToString()
    root = auth_pb2.User(name=b"root", password=HASH, roles=["root"]).SerializeToString()
    return {b"key": {es.rev_key(2, 0): kv}, b"meta": {}, b"auth": {b"authEnabled": b"\x01"},
            b"authUsers": {b"root": root}, b"authRoles": {}, b"lease": {}}


def _with(bucket: bytes, key: bytes, value: bytes | None) -> dict[bytes, dict[bytes, bytes]]:
    b = _good()
    if value is None:
        b[bucket].pop(key, None)
    else:
        b[bucket][key] = value
    return b


HOSTILE = {
    "not a revision": (_with(b"key", b"xyz", b""), "not a revision"),
    "revision 0": (_with(b"key", es.rev_key(0, 0), b""), "out of range"),
    "absurd revision": (_with(b"key", (1 << 64 - 1).to_bytes(8, "big") + b"_" + bytes(8), b""), "out of range"),
    "undecodable KeyValue": (_with(b"key", es.rev_key(3, 0), b"\xff\xff\xff"), "cannot decode"),
    "mod revision mismatch": (_with(b"key", es.rev_key(3, 0), kv_pb2.KeyValue(
        key=b"k", create_revision=2, mod_revision=9, version=2).SerializeToString()), "do not fit"),
    "empty key": (_with(b"key", es.rev_key(3, 0, True), kv_pb2.KeyValue().SerializeToString()), "empty key"),
    "user without a hash": (_with(b"authUsers", b"bob", auth_pb2.User(name=b"bob").SerializeToString()),
                            "no bcrypt password hash"),
    "user named otherwise": (_with(b"authUsers", b"bob", auth_pb2.User(name=b"eve", password=HASH)
                                   .SerializeToString()), "record names user"),
    "undecodable user": (_with(b"authUsers", b"bob", b"\x0a\xff"), "cannot decode"),
    "undecodable role": (_with(b"authRoles", b"r", b"\x12\x05"), "cannot decode"),
    "auth flag": (_with(b"auth", b"authEnabled", b"yes"), "authEnabled"),
    "auth revision": (_with(b"auth", b"authRevision", b"\x01"), "authRevision"),
    "enabled without root": (_with(b"authUsers", b"root", None), "no user root"),
    "lease key": (_with(b"lease", b"\x01", b""), "not a lease ID"),
    "lease TTL": (_with(b"lease", (5).to_bytes(8, "big"), es.Lease(ID=5, TTL=-3).SerializeToString()),
                  "out of range"),
    "lease ID": (_with(b"lease", (5).to_bytes(8, "big"), es.Lease(ID=6, TTL=3).SerializeToString()), "holds ID"),
    "compact revision": (_with(b"meta", b"finishedCompactRev", b"\x00"), "finishedCompactRev"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_bucket_is_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    buckets, message = HOSTILE[case]
    backend = Backend(tmp_path / "dst")
    Applier(backend, 1)
    with pytest.raises(es.EtcdFormatError, match=message):
        es.load(Source(buckets), backend, now_ms=0)
    with backend.env.begin() as txn:
        kv = KVStore(backend.env, txn)
        assert list(kv.records(txn)) == [] and kv.current_revision(txn) == 1


def test_no_key_bucket_is_not_etcd(tmp_path: Path) -> None:
    with pytest.raises(es.EtcdFormatError, match="no bucket key"):
        es.load(Source({b"meta": {}}), Backend(tmp_path / "d"), now_ms=0)


def test_crc32c_is_castagnoli() -> None:
    assert es.crc32c(b"123456789") == 0xE3069283
    assert es.crc32c(b"6789", es.crc32c(b"12345")) == 0xE3069283
    data = bytes(range(256)) * 3
    for cut in (0, 1, 7, 8, 9, 100, 767):  # word steps and the bytes after them agree
        assert es.crc32c(data[cut:], es.crc32c(data[:cut])) == es.crc32c(data)


def test_a_key_naming_a_missing_lease_is_kept_unattached(tmp_path: Path) -> None:
    """etcd logs "failed to attach a lease" and keeps the key; so does the restore."""
    b = _good()
    b[b"key"][es.rev_key(3, 0)] = kv_pb2.KeyValue(key=b"orphan", value=b"o", create_revision=3, mod_revision=3,
                                                   version=1, lease=9).SerializeToString()
    b[b"lease"][(5).to_bytes(8, "big")] = es.Lease(ID=5, TTL=60).SerializeToString()
    backend = Backend(tmp_path / "dst")
    loaded = es.load(Source(b), backend, now_ms=0)
    assert (loaded.unattached, loaded.leases, loaded.users, loaded.revision) == (1, 1, 1, 3)
    a = Applier(backend, 1)
    with backend.env.begin() as txn:
        assert a.kv.get(txn, b"orphan").lease == 9
        assert a.lessor.attached_keys(txn, 5) == []
