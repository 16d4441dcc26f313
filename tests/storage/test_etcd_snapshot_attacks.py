"""`raftgate snapshot status|restore` on hostile files in etcd's format: valid bbolt with bad
contents (undecodable records, absurd revisions, a user without a hash, a file cut short, pages
that lie): each gets etcdutl's kind of error (`Error: invalid database: ...` naming the file and
what is wrong), exit code 1, and leaves no data dir and no staging dir behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest

from authstore.etcd_format import snapshot as es
from authstore.etcd_format.bbolt import write_db
from protos.authpb import auth_pb2
from protos.mvccpb import kv_pb2
from tests.support.processes import skip_unless_available
from tests.support.snapshots import FLAGS, etcd_tools_status, raftgate

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4))
Buckets = dict[bytes, dict[bytes, bytes]]


def _good() -> Buckets:
    kv = kv_pb2.KeyValue(key=b"k", value=b"v", create_revision=2, mod_revision=2, version=1).SerializeToString()
    root = auth_pb2.User(name=b"root", password=HASH, roles=["root"]).SerializeToString()
    return {b"key": {es.rev_key(2, 0): kv}, b"meta": {b"consistent_index": bytes(8)},
            b"auth": {b"authEnabled": b"\x01", b"authRevision": (3).to_bytes(8, "big")},
            b"authUsers": {b"root": root}, b"authRoles": {}, b"lease": {}}


def _file(path: Path, buckets: Buckets) -> Path:
    out = io.BytesIO()
    write_db(out, [(name, sorted(buckets[name].items())) for name in sorted(buckets)])
    data = out.getvalue()
    path.write_bytes(data + hashlib.sha256(data).digest())
    return path


def _changed(bucket: bytes, key: bytes, value: bytes) -> Buckets:
    b = _good()
    b[bucket][key] = value
    return b


CASES: dict[str, tuple[Buckets, str]] = {
    "undecodable KeyValue": (_changed(b"key", es.rev_key(3, 0), b"\xff\xff\xff\xff"), "cannot decode"),
    "absurd revision": (_changed(b"key", b"\xff" * 8 + b"_" + bytes(8), b""), "out of range"),
    "user without a hash": (_changed(b"authUsers", b"eve", auth_pb2.User(name=b"eve").SerializeToString()),
                            "no bcrypt password hash"),
    "undecodable lease": (_changed(b"lease", (7).to_bytes(8, "big"), b"\x08"), "cannot decode"),
    "no key bucket": ({b"meta": {}}, "no bucket key"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_contents_are_refused_and_leave_nothing(tmp_path: Path, case: str) -> None:
    buckets, why = CASES[case]
    path = _file(tmp_path / "hostile.db", buckets)
    proc = raftgate("snapshot", "restore", str(path), "--data-dir", str(tmp_path / "target"), *FLAGS)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"Error: invalid database: {path}: ") and why in proc.stderr, proc.stderr
    assert not (tmp_path / "target").exists()
    assert not [p for p in tmp_path.iterdir() if "restoring" in p.name]


def test_a_good_file_restores_and_its_status_is_etcdutls(tmp_path: Path) -> None:
    path = _file(tmp_path / "good.db", _good())
    proc = raftgate("snapshot", "status", str(path), "-w", "json")
    assert proc.returncode == 0, proc.stderr
    assert '"revision":2,"totalKey":' in proc.stdout
    proc = raftgate("snapshot", "restore", str(path), "--data-dir", str(tmp_path / "target"), *FLAGS)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "target" / "store" / "data.mdb").exists()


def test_damaged_pages_are_refused_by_status_and_restore(tmp_path: Path) -> None:
    good = _file(tmp_path / "good.db", _good()).read_bytes()[:-32]
    cut = tmp_path / "cut.db"
    cut.write_bytes(good[: 3 * 4096])  # the meta pages name pages past the end; no hash either
    scribbled = bytearray(good)
    for i in range(2 * 4096, len(scribbled)):  # every page after the meta pages is garbage
        scribbled[i] = 0xA5
    garbled = tmp_path / "garbled.db"
    garbled.write_bytes(bytes(scribbled) + hashlib.sha256(scribbled).digest())
    for path in (cut, garbled):
        for argv in (["status", str(path)],
                     ["restore", str(path), "--data-dir", str(tmp_path / "target"), "--skip-hash-check", *FLAGS]):
            proc = raftgate("snapshot", *argv)
            assert proc.returncode == 1, (argv, proc.stderr[-2000:])
            assert proc.stderr.startswith("Error: invalid database: "), (argv, proc.stderr)
            assert "Traceback" not in proc.stderr
            assert not (tmp_path / "target").exists()


def test_status_counts_the_pages_in_use_as_etcdutl(tmp_path: Path) -> None:
    """A bbolt file may be longer than its pages in use (bbolt grows a member's backend file
    ahead): TOTAL SIZE is the pages in use, as etcdutl counts it (tx.Size)."""
    skip_unless_available("etcd")
    data = _file(tmp_path / "good.db", _good()).read_bytes()[:-32]
    grown = tmp_path / "grown.db"
    grown.write_bytes(data + bytes(8 * 4096))
    expected = etcd_tools_status(grown)
    assert expected["totalSize"] == len(data)
    proc = raftgate("snapshot", "status", str(grown), "-w", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected


@pytest.fixture
def fixed_empty_dir(tmp_path: Path) -> Iterator[Path]:
    """An empty data dir that can be written into but not removed or replaced: a volume's mount
    point (as root), else a directory in a parent that is not writable."""
    parent = tmp_path / "volumes"
    parent.mkdir()
    target = parent / "data"
    target.mkdir(mode=0o700)
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(target)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        try:
            yield target
        finally:
            subprocess.run(["umount", str(target)], check=True)
        return
    parent.chmod(0o555)
    try:
        yield target
    finally:
        parent.chmod(0o700)


def test_restore_into_an_empty_mount_point(tmp_path: Path, fixed_empty_dir: Path) -> None:
    """`--data-dir` naming an existing empty directory that cannot be replaced (a volume mounted
    there, as on Kubernetes): etcdutl restores into it; so must raftgate, not answer `Device or
    resource busy` (or a permission error) because it builds the data dir beside it and renames it over."""
    path = _file(tmp_path / "good.db", _good())
    proc = raftgate("snapshot", "restore", str(path), "--data-dir", str(fixed_empty_dir), *FLAGS)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in fixed_empty_dir.iterdir()) == ["member_id", "store", "wal"]
    assert (fixed_empty_dir / "store" / "data.mdb").is_file()
    assert not [p for p in fixed_empty_dir.parent.iterdir() if p != fixed_empty_dir]


def test_a_file_whose_first_meta_page_is_damaged_is_read_from_the_second(tmp_path: Path) -> None:
    """bbolt keeps two meta pages and reads the sound one (a torn write of one, in a db file copied
    from a member after a crash): etcd's tools read such a file, so raftgate must take it as
    etcd's format too, not call it a damaged LMDB store."""
    skip_unless_available("etcd")
    data = bytearray(_file(tmp_path / "good.db", _good()).read_bytes()[:-32])
    data[16:20] = bytes(4)  # page 0's magic
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(bytes(data) + hashlib.sha256(data).digest())
    expected = etcd_tools_status(damaged)
    proc = raftgate("snapshot", "status", str(damaged), "-w", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == expected
    proc = raftgate("snapshot", "restore", str(damaged), "--data-dir", str(tmp_path / "target"), *FLAGS)
    assert proc.returncode == 0, proc.stderr
