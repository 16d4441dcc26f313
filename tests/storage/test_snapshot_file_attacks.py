"""`raftgate snapshot status|restore` on damaged files: a clear `Error: ...` and exit code 1, never
a crash, and nothing left behind that looks like a data dir.

LMDB maps the file and trusts its meta pages: a file cut short (a copy interrupted, a download
that stopped) names pages past its end, and reading them kills the process with SIGBUS unless
the tool checks the file's extent first.

Finding: a truncated snapshot file killed `raftgate snapshot status|restore` with SIGBUS (failed
before the fix).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.snapshots import FLAGS, make_snapshot, raftgate


def _cut(src: Path, dst: Path, length: int, *, with_hash: bool) -> Path:
    data = src.read_bytes()[:length]
    dst.write_bytes(data + hashlib.sha256(data).digest() if with_hash else data)
    return dst


def test_truncated_snapshot_is_refused_not_a_crash(tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path)
    store_len = snap.stat().st_size - 32
    half = store_len // 2 // 4096 * 4096
    damaged = [
        _cut(snap, tmp_path / "half.db", store_len // 2, with_hash=False),
        # cut at a page boundary and given a matching sha256: the hash check cannot tell
        _cut(snap, tmp_path / "half-hashed.db", half, with_hash=True),
    ]
    for path in damaged:
        runs = [["status", str(path)]]
        for skip in ([], ["--skip-hash-check"]):
            runs.append(["restore", str(path), "--data-dir", str(tmp_path / "target"), *FLAGS, *skip])
        for argv in runs:
            proc = raftgate("snapshot", *argv)
            assert proc.returncode == 1, (argv, proc.returncode, proc.stderr[-500:])
            assert proc.stderr.startswith("Error: "), (argv, proc.stderr)
            # etcdutl's own words for a file without its hash name no file
            assert str(path) in proc.stderr or "snapshot missing hash" in proc.stderr, (argv, proc.stderr)
            assert not (tmp_path / "target").exists()
            assert not [p for p in tmp_path.iterdir() if "restoring" in p.name]


def test_second_restore_after_a_killed_one_works(tmp_path: Path) -> None:
    """A restore killed -9 leaves only its hidden staging dir; the data dir is not there, and a
    new restore into it succeeds."""
    snap = make_snapshot(tmp_path, keys=10)
    target = tmp_path / "target"
    stale = tmp_path / ".target.restoring-999999999"
    (stale / "store").mkdir(parents=True)
    (stale / "store" / "data.mdb").write_bytes(b"half")
    proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(target), *FLAGS)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in target.iterdir()) == ["member_id", "store", "wal"]
    # the killed restore's copy (as large as the snapshot) does not stay behind for ever
    assert not stale.exists()
    proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(target), *FLAGS)
    assert proc.returncode == 1 and "not empty" in proc.stderr, proc.stderr
    assert raftgate("snapshot", "status", str(snap)).returncode == 0


def test_a_restore_killed_inside_an_existing_data_dir_does_not_block_the_next(tmp_path: Path) -> None:
    """An existing empty data dir (a mount point) is filled from a staging dir inside it: what a
    killed restore left there does not make the dir "not empty" for the next restore, which
    removes it; a running restore's staging (a live process) does."""
    snap = make_snapshot(tmp_path, keys=10)
    target = tmp_path / "target"
    stale = target / ".restoring-999999999"
    (stale / "store").mkdir(parents=True)
    (stale / "store" / "data.mdb").write_bytes(b"half")
    proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(target), *FLAGS)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in target.iterdir()) == ["member_id", "store", "wal"]
    shutil.rmtree(target / "store")
    shutil.rmtree(target / "wal")
    (target / f".restoring-{os.getpid()}").mkdir()  # this process is alive: its restore may be under way
    proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(target), *FLAGS)
    assert proc.returncode == 1 and "not empty" in proc.stderr, proc.stderr


def test_a_data_dir_the_system_refuses_gets_error_not_a_traceback(tmp_path: Path) -> None:
    """A parent that is a file, a name too long, a symlink to an empty dir: `Error: ...`, exit 1,
    no staging dir left."""
    snap = make_snapshot(tmp_path, keys=10)
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    for target in (tmp_path / "file" / "data", tmp_path / ("d" * 300), tmp_path / "link"):
        proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(target), *FLAGS)
        assert proc.returncode == 1 and proc.stderr.startswith("Error: "), (target.name[:20], proc.stderr[-400:])
        assert "Traceback" not in proc.stderr
        assert not [p for p in tmp_path.iterdir() if "restoring" in p.name]
    assert not any((tmp_path / "empty").iterdir())


def test_a_restore_killed_mid_way_leaves_no_data_dir(tmp_path: Path) -> None:
    """kill -9 while the staging copy is being built: the data dir is not there (never a half
    one), and the next restore succeeds and removes the dead one's staging copy."""
    snap = make_snapshot(tmp_path, keys=20000)
    target = tmp_path / "target"
    proc = subprocess.Popen([sys.executable, "-m", "raftgate.cli", "snapshot", "restore", str(snap), "--data-dir",
                             str(target), *FLAGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(20000):  # bounded: until the staging copy appears or the restore ends
            if proc.poll() is not None or [p for p in tmp_path.iterdir() if "restoring" in p.name]:
                break
            time.sleep(0.001)
    finally:
        proc.kill()
        proc.wait()
    if proc.returncode == -9:  # killed mid-way (else it had finished: nothing to check)
        assert not target.exists()
    else:
        assert sorted(p.name for p in target.iterdir()) == ["member_id", "store", "wal"]
        shutil.rmtree(target)
    again = raftgate("snapshot", "restore", str(snap), "--data-dir", str(target), *FLAGS)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in target.iterdir()) == ["member_id", "store", "wal"]
    assert not [p for p in tmp_path.iterdir() if "restoring" in p.name]
