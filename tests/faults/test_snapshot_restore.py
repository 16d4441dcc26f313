"""`raftgate snapshot status` and `raftgate snapshot restore`, on a file `etcdctl snapshot save`
wrote from a raftgate cluster: etcd's own format, which etcdctl and etcdutl read too.

A cluster with keys, a lease, users, roles, grants and authentication enabled is saved, restored
into a new single-member cluster, started with a proxy, and everything an etcd client can see is
compared with the original. Bad inputs get a clear error, a non-zero exit and touch nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import (
    Client,
    auth_state,
    kv_state,
    program_cluster,
    retry_ok,
)
from tests.support.processes import etcdctl, free_port
from tests.support.restored_cluster import etcdctl_view, fill_cluster, restored_cluster
from tests.support.snapshots import etcd_tools_status

pytestmark = pytest.mark.slow

ROOT = "root:rootpw"


def raftgate(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "raftgate.cli", *args], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def _state(endpoint: str) -> dict[str, Any]:
    client = Client(endpoint)
    try:
        client.login("root", "rootpw")
        auth = auth_state(client)
        auth.pop("auth_revision")
        return {"kv": kv_state(client), "auth": auth, "etcdctl": etcdctl_view(endpoint),
                "revision": client.kv.Range(rpc_pb2.RangeRequest(key=b"/"), metadata=client.md,
                                            timeout=10).header.revision}
    finally:
        client.close()


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_restore_a_saved_snapshot_into_a_new_cluster(tmp_path: Path) -> None:
    saved = tmp_path / "saved.db"
    with program_cluster(tmp_path / "old", nodes=3) as old:
        client = Client(old.endpoint)
        try:
            retry_ok(lambda: client.put(b"/warm", b"up", timeout=10), 30, "a first write")
            lease = fill_cluster(client)
        finally:
            client.close()
        rc, out, err = etcdctl(old.endpoint, "snapshot", "save", str(saved), user=ROOT, timeout=60)
        assert rc == 0, err
        before = _state(old.endpoint)
        old_members = {m.ID for m in old.do(old.nodes[0], _member_list()).members}
    assert before["etcdctl"]["auth"] == "Authentication Status: true"
    assert len(before["etcdctl"]["leases"]) == 1 and f"{lease:x}" in before["etcdctl"]["leases"][0]

    # raftgate snapshot status: etcdutl's table and json, with the numbers etcd's tools print
    rc, out, err = raftgate("snapshot", "status", str(saved), "-w", "json")
    assert rc == 0, err
    status = json.loads(out)
    assert set(status) == {"hash", "revision", "totalKey", "totalSize"}
    assert etcd_tools_status(saved) == status
    assert status["revision"] == before["revision"]
    assert status["totalSize"] == saved.stat().st_size - 32  # etcd's trailing sha256 is not the store
    assert status["totalKey"] > len(before["kv"])
    rc, table, err = raftgate("snapshot", "status", str(saved), "-w", "table")
    assert rc == 0, err
    assert "|   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |" in table
    assert f"| {status['hash']:08x} |" in table
    rc, simple, err = raftgate("snapshot", "status", str(saved))
    assert rc == 0 and simple.startswith(f"{status['hash']:08x}, {status['revision']}, {status['totalKey']}, "), err

    # restore into a new single-member cluster
    data_dir = tmp_path / "restored"
    peer_port = free_port()
    peer_url = f"http://127.0.0.1:{peer_port}"
    flags = ["--data-dir", str(data_dir), "--name", "solo", "--initial-cluster", f"solo={peer_url}",
             "--initial-advertise-peer-urls", peer_url, "--initial-cluster-token", "restored-cluster"]
    saved_bytes = saved.read_bytes()
    rc, out, err = raftgate("snapshot", "restore", str(saved), *flags)
    assert rc == 0, err
    assert saved.read_bytes() == saved_bytes  # the snapshot itself is never changed

    # a damaged copy (one byte changed) is refused by its sha256, and nothing is written
    damaged = tmp_path / "damaged.db"
    broken = bytearray(saved_bytes)
    broken[len(broken) // 2] ^= 0xFF
    damaged.write_bytes(bytes(broken))
    elsewhere = tmp_path / "elsewhere"
    rc, out, err = raftgate("snapshot", "restore", str(damaged), *flags[2:], "--data-dir", str(elsewhere))
    assert rc != 0 and err.startswith("Error: expected sha256 "), err
    assert not elsewhere.exists() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    # restoring again into the now non-empty data dir is refused and changes nothing
    restored_files = _tree(data_dir)
    rc, out, err = raftgate("snapshot", "restore", str(saved), *flags)
    assert rc != 0 and "Error:" in err and str(data_dir) in err, err
    assert _tree(data_dir) == restored_files

    with restored_cluster(tmp_path / "new", [("solo", data_dir, peer_port)]) as new:
        after = retry_ok(lambda: _state(new.endpoint), 30, "the restored cluster to answer")
        members = new.do(new.nodes[0], _member_list()).members
        client = Client(new.endpoint)
        try:
            # passwords and grants act as before: alice reads /app/, may not write it
            client.login("alice", "alicepw")
            assert client.get(b"/app/a") == b"v4"
            with pytest.raises(grpc.RpcError) as denied:
                client.put(b"/app/a", b"no")
            assert denied.value.details() == "etcdserver: permission denied"  # type: ignore[attr-defined]
            # the restored cluster takes writes
            client.login("root", "rootpw")
            client.put(b"/after-restore", b"yes", timeout=10)
        finally:
            client.close()
    for part in ("kv", "auth"):
        assert after[part] == before[part], part
    assert after["etcdctl"] == before["etcdctl"]
    assert after["revision"] == before["revision"]
    # the old membership is gone: one new member with the new URL
    assert [(m.name, list(m.peerURLs)) for m in members] == [("solo", [peer_url])]
    assert not {m.ID for m in members} & old_members

    # the same snapshot restored into each member of a new 3-member cluster (once per member)
    trio = [(f"m{i}", tmp_path / f"m{i}", free_port()) for i in range(3)]
    initial = ",".join(f"{name}=http://127.0.0.1:{port}" for name, _, port in trio)
    for name, member_dir, port in trio:
        rc, out, err = raftgate("snapshot", "restore", str(saved), "--data-dir", str(member_dir), "--name", name,
                                "--initial-cluster", initial, "--initial-advertise-peer-urls",
                                f"http://127.0.0.1:{port}", "--initial-cluster-token", "trio")
        assert rc == 0, err
    with restored_cluster(tmp_path / "trio", trio) as new:
        after = retry_ok(lambda: _state(new.endpoint), 30, "the restored 3-member cluster to answer")
        members = new.do(new.nodes[0], _member_list()).members
    assert after["kv"] == before["kv"] and after["auth"] == before["auth"]
    assert after["etcdctl"] == before["etcdctl"]
    assert sorted(m.name for m in members) == ["m0", "m1", "m2"]


def _member_list() -> ipb.InternalRaftRequest:
    return ipb.InternalRaftRequest(header=ipb.RequestHeader(username="root"), member_list=rpc_pb2.MemberListRequest())


def test_bad_inputs_get_clear_errors_and_touch_nothing(tmp_path: Path) -> None:
    peer = "http://127.0.0.1:2380"
    flags = ["--name", "solo", "--initial-cluster", f"solo={peer}", "--initial-advertise-peer-urls", peer]
    missing = tmp_path / "missing.db"
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a snapshot\n" * 1000)
    target = tmp_path / "target"

    for command in (["status", str(missing)], ["restore", str(missing), "--data-dir", str(target), *flags]):
        rc, out, err = raftgate("snapshot", *command)
        assert rc != 0 and err.startswith("Error: ") and str(missing) in err, (command, err)
        assert not target.exists()
    for command in (["status", str(garbage)], ["restore", str(garbage), "--data-dir", str(target), *flags]):
        rc, out, err = raftgate("snapshot", *command)
        assert rc != 0 and err.startswith("Error: ") and "not a raftgate snapshot" in err, (command, err)
        assert not target.exists()
    assert garbage.read_bytes() == b"this is not a snapshot\n" * 1000
    # a name missing from --initial-cluster
    rc, out, err = raftgate("snapshot", "restore", str(garbage), "--data-dir", str(target), "--name", "other",
                            "--initial-cluster", f"solo={peer}", "--initial-advertise-peer-urls", peer)
    assert rc != 0 and err.startswith("Error: ") and "other" in err, err
    assert not target.exists()
    # a data dir with something in it
    target.mkdir()
    (target / "keep").write_text("mine")
    rc, out, err = raftgate("snapshot", "restore", str(garbage), "--data-dir", str(target), *flags)
    assert rc != 0 and err.startswith("Error: ") and "not empty" in err, err
    assert _tree(target) == {"keep": b"mine"}
    # no such subcommand
    rc, out, err = raftgate("snapshot", "save", str(garbage))
    assert rc != 0
