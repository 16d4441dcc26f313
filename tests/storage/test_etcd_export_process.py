"""The process that writes a client snapshot in etcd's format (authstore/etcd_format/export.py)
never outlives the store that started it, and writes nothing once its copy is gone: a store
killed mid-snapshot leaves no writer (and so no file appearing after its restart's clean-up)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from authstore.etcd_format.export import command
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import rpc_pb2 as pb


def _copy(tmp: Path) -> Path:
    backend = Backend(tmp / "src")
    applier = Applier(backend, 1)
    with backend.env.begin(write=True) as txn:
        applier.kv.put(txn, pb.PutRequest(key=b"k", value=b"v"))
    copy = backend.copy_to(tmp / "copy")
    backend.close()
    return copy.parent


def _export(*args: str) -> list[str]:
    return [sys.executable, "-m", "authstore.etcd_format.export", *args]


def test_writes_etcds_file_for_its_store(tmp_path: Path) -> None:
    out = tmp_path / "etcd.db"
    proc = subprocess.run(command(_copy(tmp_path), out), capture_output=True, timeout=60)  # as the store runs it
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[16:20] == (0xED0CDAED).to_bytes(4, "little")


def test_a_writer_whose_store_is_gone_writes_nothing(tmp_path: Path) -> None:
    """Its parent is no longer the store that named itself (the store died, the writer was
    handed to another process): it ends without writing."""
    copy, out = _copy(tmp_path), tmp_path / "etcd.db"
    proc = subprocess.run(_export(str(copy), str(out), "1"), capture_output=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert not out.exists()


def test_a_copy_removed_meanwhile_is_not_recreated(tmp_path: Path) -> None:
    missing = tmp_path / "client-out" / "store"
    proc = subprocess.run(_export(str(missing), str(tmp_path / "etcd.db"), str(os.getpid())), capture_output=True,
                          timeout=60)
    assert proc.returncode == 1
    assert not missing.exists() and not (tmp_path / "etcd.db").exists()
