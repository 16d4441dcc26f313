"""``raftgate snapshot status|restore``: etcdutl's snapshot commands, for etcd's snapshot files
and raftgate's older ones.

``etcdctl snapshot save`` through a proxy writes what the store streams: etcd's own file (a bbolt
database in etcd 3.5's layout) followed, as with etcd, by the sha256 of everything before it, so
etcd's tools read it too. Releases before that streamed a copy of the LMDB store; both are read
here. ``restore`` makes the data dir of a member of a NEW cluster from a snapshot, as ``etcdutl
snapshot restore`` does: keys with their revisions and versions, leases (each given its full TTL
again from the restore), users (their bcrypt hashes, so passwords keep working), roles, grants
and the enabled flag are kept; the old membership, alarms and live simple tokens are dropped; the
log starts with the new cluster's members. A snapshot saved from a real etcd restores the same
way (migration from etcd). Start the member with ``raftgate store`` and the same ``--name``,
``--initial-cluster*`` and ``--initial-advertise-peer-urls`` flags.

Nothing is changed before every check passed: the data dir is built beside its final place and
renamed into it at the end (an existing empty one, perhaps a volume's mount point, is filled from
a staging dir inside it), and the snapshot file is only read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import struct
import sys
import time
from dataclasses import dataclass
from glob import escape as glob_escape
from pathlib import Path

import lmdb

from authstore.config import ConfigError, StoreConfig, parse_initial_cluster
from authstore.etcd_format import bbolt
from authstore.etcd_format.bbolt import BoltError, BoltReader
from authstore.etcd_format.snapshot import EtcdFormatError, etcd_status, load
from authstore.main import bootstrap_entries
from authstore.node import identity
from authstore.node.wal import WAL
from authstore.state.apply import Applier
from authstore.state.auth.store import DB_TOKENS, DB_USER_TOKENS
from authstore.state.backend import Backend, content_hash
from authstore.state.membership import member_id
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.private_files import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, fsync_dir, restrict_umask

SHA_SIZE = hashlib.sha256().digest_size
#: what every raftgate store holds (an LMDB file without it is someone else's)
RAFTGATE_DB = b"mvcc_kv"
#: bbolt's meta page: 16 bytes of page header, then the magic (little-endian)
_BBOLT_MAGIC = struct.pack("<I", bbolt.MAGIC)
_CHUNK = 1 << 20
#: LMDB's meta page (lmdb.h, 64-bit, native order): page header (16 bytes), magic, version,
#: address, mapsize, two MDB_db records of 48 bytes (the first one's pad holds the page size),
#: then the last page number used
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_META = struct.Struct("<16xII16xI92xQ")

USAGE = """usage: raftgate snapshot {status,restore} FILE [flags]

  status FILE [-w simple|table|json]   hash, revision, total keys and size of a snapshot file
  restore FILE --data-dir DIR [--name ... --initial-cluster ... --initial-advertise-peer-urls ...
               --initial-cluster-token ... --skip-hash-check]
                                       a new member's data dir from a snapshot (a new cluster)

For files written by `etcdctl snapshot save` from raftgate or from etcd (etcd's bbolt format), and
raftgate's older snapshots (an LMDB store). Backup and restore: docs/operations.md."""


class SnapshotError(Exception):
    """A refusal, printed as etcdutl prints its errors (``Error: ...``), exit code 1."""


@dataclass(frozen=True)
class Status:
    hash: int
    revision: int
    total_key: int
    total_size: int


def _check_file(path: Path) -> int:
    """The file's size; a missing or unreadable file is refused."""
    try:
        if not path.exists():
            raise SnapshotError(f"stat {path}: no such file or directory")
        if not path.is_file():
            raise SnapshotError(f"{path} is not a file")
        with open(path, "rb"):
            pass  # readable
        return path.stat().st_size
    except OSError as exc:
        raise SnapshotError(f"{path}: {exc.strerror}") from None


def _sha256(path: Path, length: int) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        left = length
        while left > 0:
            data = f.read(min(_CHUNK, left))
            if not data:
                break
            digest.update(data)
            left -= len(data)
    return digest.digest()


def store_length(path: Path, size: int, *, verify: bool) -> int:
    """How many bytes of the file are the store: without etcd's trailing sha256 when it has one
    (as etcd decides: a size 32 past a multiple of 512). With ``verify``, the sha256 must be there
    and match (etcdutl's rule; ``--skip-hash-check`` for a store file copied from a data dir)."""
    has_hash = size % 512 == SHA_SIZE
    if not has_hash:
        if verify:
            raise SnapshotError("snapshot missing hash but --skip-hash-check=false")
        return size
    length = size - SHA_SIZE
    if verify:
        with open(path, "rb") as f:
            f.seek(length)
            stored = f.read(SHA_SIZE)
        actual = _sha256(path, length)
        if stored != actual:
            raise SnapshotError(f"expected sha256 {stored.hex()}, got {actual.hex()}: {path} is damaged or incomplete")
    return length


def _not_ours(path: Path, why: str) -> SnapshotError:
    return SnapshotError(f"{path} is not a raftgate snapshot: {why}")


def _check_extent(path: Path, length: int) -> None:
    """Refuses a file shorter than the pages its LMDB meta pages name. LMDB maps the file and
    trusts them: reading a page past the end of a file cut short kills the process (SIGBUS)
    instead of raising."""
    with open(path, "rb") as f:
        head = f.read(_LMDB_META.size)
        if len(head) < _LMDB_META.size:
            raise _not_ours(path, "too short for an LMDB store")
        magic, _version, psize, _last = _LMDB_META.unpack(head)
        if magic != _LMDB_MAGIC or psize < 512 or psize & (psize - 1) or psize > 1 << 16:
            raise _not_ours(path, "not an LMDB store")
        f.seek(psize)
        second = f.read(_LMDB_META.size)
    last = max(_LMDB_META.unpack(m)[3] for m in (head, second)
               if len(m) == _LMDB_META.size and _LMDB_META.unpack(m)[0] == _LMDB_MAGIC)
    if (last + 1) * psize > length:
        raise SnapshotError(f"{path} is truncated: its store needs {(last + 1) * psize} bytes, the file "
                            f"holds {length}")


def _open_read_only(path: Path) -> lmdb.Environment:
    try:
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=64)
    except lmdb.Error as exc:
        raise _not_ours(path, f"not an LMDB store: {exc}") from None
    try:
        with env.begin() as txn:
            env.open_db(RAFTGATE_DB, txn=txn, create=False)
    except lmdb.Error:
        env.close()
        raise _not_ours(path, "an LMDB file without raftgate's key space") from None
    return env


def status(path: Path) -> Status:
    """etcdutl snapshot status. An etcd file (what raftgate streams now): etcdutl's own numbers.
    raftgate's older LMDB file: CRC-32 of the store (as Maintenance.Hash computes it), the key
    space's revision, entries in every sub-database, and the store's size."""
    size = _check_file(path)
    length = store_length(path, size, verify=False)
    if is_etcd_file(path):
        return _etcd_file_status(path)
    _check_extent(path, length)
    env = _open_read_only(path)
    try:
        with env.begin() as txn:
            crc = content_hash(env, txn)
            revision = KVStore(env, txn).current_revision(txn)
            with txn.cursor() as names:
                dbs = [name for name, _ in names]
            total = sum(txn.stat(env.open_db(name, txn=txn, create=False))["entries"] for name in dbs)
    except lmdb.Error as exc:
        raise _not_ours(path, f"unreadable: {exc}") from None
    finally:
        env.close()
    return Status(crc, revision, total, length)


def is_etcd_file(path: Path) -> bool:
    """bbolt's magic in a meta page: etcd's format (raftgate's since issue 24). The first meta
    page, else (not an LMDB file, whose magic is at the same place) the second at any page size
    bbolt uses: bbolt reads a file whose first meta page is damaged from the second, and so do
    etcd's tools."""
    with open(path, "rb") as f:
        magic = f.read(20)[16:20]
        if magic == _BBOLT_MAGIC:
            return True
        if magic == struct.pack("<I", _LMDB_MAGIC):
            return False
        for page_size in bbolt.PAGE_SIZES:  # bbolt's page is its OS's page size
            f.seek(page_size + 16)
            if f.read(4) == _BBOLT_MAGIC:
                return True
    return False


def _open_etcd(path: Path) -> BoltReader:
    try:
        return BoltReader(path)
    except BoltError as exc:
        raise SnapshotError(f"invalid database: {path}: {exc}") from None


def _etcd_file_status(path: Path) -> Status:
    """What etcdutl prints for the file: its hash, revision and total keys as it computes them,
    and the size of the pages in use (so never the trailing sha256)."""
    try:
        with _open_etcd(path) as reader:
            st = etcd_status(reader)
            size = reader.data_size  # the pages in use (bbolt's tx.Size), what etcdutl prints
    except BoltError as exc:
        raise SnapshotError(f"invalid database: {path}: {exc}") from None
    return Status(st.hash, st.revision, st.total_key, size)


def _human_bytes(n: int) -> str:
    """go-humanize's Bytes, as etcdutl prints TOTAL SIZE (SI units)."""
    if n < 10:
        return f"{n} B"
    units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"]
    e = min(int(math.floor(math.log(n, 1000))), len(units) - 1)
    value = math.floor(n / 1000**e * 10 + 0.5) / 10
    return f"{value:.0f} {units[e]}" if value >= 10 else f"{value:.1f} {units[e]}"


def format_status(s: Status, write_out: str) -> str:
    if write_out == "json":
        return json.dumps({"hash": s.hash, "revision": s.revision, "totalKey": s.total_key,
                           "totalSize": s.total_size}, separators=(",", ":"))
    cells = [f"{s.hash:08x}", str(s.revision), str(s.total_key), _human_bytes(s.total_size)]
    if write_out == "simple":
        return ", ".join(cells)
    header = ["HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"]
    widths = [max(len(h), len(c)) + 2 for h, c in zip(header, cells, strict=True)]
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    head = "|" + "|".join(h.center(w) for h, w in zip(header, widths, strict=True)) + "|"
    row = "|" + "|".join(f" {c.rjust(w - 2)} " for c, w in zip(cells, widths, strict=True)) + "|"
    return "\n".join([rule, head, rule, row, rule])


@dataclass
class RestoreTarget:
    data_dir: Path
    name: str
    initial_cluster: list[tuple[str, list[str]]]
    peer_urls: list[str]
    token: str


def _check_target(t: RestoreTarget) -> None:
    mine = dict(t.initial_cluster).get(t.name)
    if mine is None:
        raise SnapshotError(f"couldn't find local name {t.name!r} in the initial cluster configuration")
    if sorted(mine) != sorted(t.peer_urls):
        raise SnapshotError(f"--initial-cluster: {t.name}'s URLs {mine} differ from --initial-advertise-peer-urls "
                            f"{t.peer_urls}")
    d = t.data_dir
    if d.is_symlink():  # the new dir is renamed into place, which replaces no link
        raise SnapshotError(f"data-dir {str(d)!r} is a symbolic link; give the directory it points to")
    _remove_dead_stagings(d)  # a killed restore's staging inside the dir does not make it "not empty"
    try:
        if d.exists() and (not d.is_dir() or any(d.iterdir())):
            raise SnapshotError(f"data-dir {str(d)!r} not empty or could not be read")
    except OSError:
        raise SnapshotError(f"data-dir {str(d)!r} not empty or could not be read") from None


def restore(path: Path, target: RestoreTarget, *, skip_hash_check: bool = False) -> int:
    """Makes ``target.data_dir`` the data dir of a member of a new cluster holding the snapshot's
    state; returns the member's ID."""
    _check_target(target)
    size = _check_file(path)
    etcd = is_etcd_file(path)
    if etcd:
        _open_etcd(path).close()  # its meta pages are sound
    else:
        _check_extent(path, store_length(path, size, verify=False))  # before LMDB reads it (SIGBUS)
        _open_read_only(path).close()
    length = store_length(path, size, verify=not skip_hash_check)
    data_dir = target.data_dir
    # An existing (empty) data dir is filled from inside: it may be a volume's mount point, which
    # cannot be removed or renamed over (etcdutl too writes into it); a new one is built beside
    # its place and renamed into it whole.
    inside = data_dir.is_dir()
    staging = (data_dir / f".restoring-{os.getpid()}" if inside
               else data_dir.parent / f".{data_dir.name}.restoring-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    moved: list[Path] = []
    try:
        # owner-only, whatever the umask: the copy holds every key, value and password hash
        staging.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
        store = staging / "store"
        store.mkdir(mode=PRIVATE_DIR_MODE)
        if etcd:
            _load_etcd_file(path, store)
        else:
            _copy_store(path, length, store)
        mid = member_id(target.peer_urls, target.token)
        _rewrite_store(store, mid)
        identity.write(staging, mid)  # before the log, as a new member's start writes it
        cfg = StoreConfig(name=target.name, data_dir=data_dir, listen_host="", listen_port=0,
                          peer_urls=target.peer_urls, initial_cluster=target.initial_cluster,
                          initial_cluster_token=target.token)
        entries, hard_state = bootstrap_entries(cfg)
        wal = WAL(staging / "wal")
        try:
            wal.save(hard_state, entries)
        finally:
            wal.close()
        if inside:
            # The ID last: a restore killed between two moves leaves a store alone (which starts
            # as this restored member) or a store and its log without an ID (refused at start),
            # never an ID (and a log) beside an empty store, which would start as a member of the
            # new cluster holding none of the snapshot.
            for part in ("store", "wal", identity.FILE_NAME):
                os.rename(staging / part, data_dir / part)
                moved.append(data_dir / part)
            staging.rmdir()
            fsync_dir(data_dir)
        else:
            os.rename(staging, data_dir)
            fsync_dir(data_dir.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for part in reversed(moved):  # the data dir was empty: what is in it now is this restore's
            if part.is_dir():
                shutil.rmtree(part, ignore_errors=True)
            else:
                part.unlink(missing_ok=True)
        raise
    return mid


def _copy_store(path: Path, length: int, store: Path) -> None:
    """raftgate's older snapshot: the LMDB store it holds, as it is."""
    fd = os.open(store / "data.mdb", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    with open(path, "rb") as src, os.fdopen(fd, "wb") as dst:
        left = length
        while left > 0 and (data := src.read(min(_CHUNK, left))):
            dst.write(data)
            left -= len(data)
        dst.flush()
        os.fsync(dst.fileno())


def _load_etcd_file(path: Path, store: Path) -> None:
    """etcd's snapshot: a new store filled from its buckets (history, leases, auth)."""
    backend = Backend(store)
    try:
        with _open_etcd(path) as reader:
            load(reader, backend, int(time.time() * 1000))
    except (BoltError, EtcdFormatError) as exc:
        raise SnapshotError(f"invalid database: {path}: {exc}") from None
    except lmdb.MapFullError:
        raise SnapshotError(f"{path}: its contents need more than the store's {backend.map_size} bytes") from None
    finally:
        backend.close()


def _remove_dead_stagings(data_dir: Path) -> None:
    """Removes what restores into the same data dir left when they were killed (a copy as large
    as the snapshot): staging dirs whose process is gone, beside the data dir or inside it. A
    running restore's is left alone."""
    _remove_dead(data_dir.parent, f".{data_dir.name}.restoring-")
    if data_dir.is_dir() and not data_dir.is_symlink():
        _remove_dead(data_dir, ".restoring-")


def _remove_dead(directory: Path, prefix: str) -> None:
    for path in directory.glob(glob_escape(prefix) + "*"):
        pid = path.name[len(prefix):]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except (ProcessLookupError, OverflowError):  # gone, or no process could have it
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass  # alive (another user's): its restore may be under way


def _rewrite_store(store: Path, mid: int) -> None:
    """The copy becomes a new cluster's first state: no members (the new cluster's first log
    entries add them), nothing applied yet, no member ID of an older version's store, no alarms
    of old members, no simple token of the old cluster, and every lease its full TTL from now
    (etcd's new leader does the same when it takes the leases over)."""
    backend = Backend(store)
    try:
        applier = Applier(backend, mid)
        now_ms = int(time.time() * 1000)
        with backend.env.begin(write=True) as txn:
            applier.membership.clear(txn)
            backend.set_applied(txn, 0, 0)
            backend.meta_put(txn, Applier._ALARMS, pb.AlarmResponse().SerializeToString())
            for name in (DB_TOKENS, DB_USER_TOKENS):
                txn.drop(backend.env.open_db(name, txn=txn, dupsort=name == DB_USER_TOKENS), delete=False)
            for lease_id, _record in applier.lessor.all_records(txn):
                applier.lessor.renew(txn, lease_id, now_ms)
        backend.sync()
        backend.drop_legacy_member_id()  # a copy from an older version
    finally:
        backend.close()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftgate snapshot", description="Snapshot files of raftgate.")
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="hash, revision, total keys and size of a snapshot file")
    st.add_argument("file")
    st.add_argument("-w", "--write-out", choices=("simple", "table", "json"), default="simple")
    r = sub.add_parser("restore", help="a new member's data dir from a snapshot (a new cluster)")
    r.add_argument("file")
    r.add_argument("--data-dir", default=None, help="the new data dir (default: NAME.raftgate); must not exist "
                   "or be empty")
    r.add_argument("--name", default="default", help="this member's name")
    r.add_argument("--initial-cluster", default="default=http://localhost:2380",
                   help="name=peer-url,... of the new cluster's members")
    r.add_argument("--initial-advertise-peer-urls", default="http://localhost:2380", help="this member's peer URLs")
    r.add_argument("--initial-cluster-token", default="etcd-cluster", help="the new cluster's token")
    r.add_argument("--skip-hash-check", action="store_true",
                   help="accept a file without etcd's trailing sha256 (a store copied from a data dir)")
    return p


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    a = _parser().parse_args(argv)
    try:
        if a.command == "status":
            print(format_status(status(Path(a.file)), a.write_out))
            return 0
        restrict_umask()  # the new data dir, as the store makes its own (raftgate/private_files.py)
        try:
            cluster = parse_initial_cluster(a.initial_cluster)
        except ConfigError as exc:
            raise SnapshotError(str(exc)) from None
        peer_urls = [u.strip() for u in a.initial_advertise_peer_urls.split(",") if u.strip()]
        target = RestoreTarget(Path(a.data_dir or f"{a.name}.raftgate"), a.name, cluster, peer_urls,
                               a.initial_cluster_token)
        mid = restore(Path(a.file), target, skip_hash_check=a.skip_hash_check)
        print(f"raftgate snapshot: restored {a.file} into {target.data_dir} (member {mid:x} of a new cluster); "
              f"start it with raftgate store --data-dir {target.data_dir} --name {a.name} and the same "
              "--initial-cluster flags")
        return 0
    except SnapshotError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the system refused a path (the staging dir is already removed)
        print(f"Error: {exc.filename or a.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
