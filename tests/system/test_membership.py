"""Membership through the Cluster API, with etcdctl: add a learner, let it join and catch up,
promote it, remove it; and etcd's refusals."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from raftgate.secret_proof import proving_channel
from tests.support.processes import REPO_ROOT, RaftgateLocal, etcdctl, free_port, wait_for

pytestmark = pytest.mark.slow


def _serializable_get(internal_port: int, secret: str, key: bytes) -> list[bytes]:
    """Reads one node's own state through its internal port (auth is off in this test)."""
    with grpc.insecure_channel(f"127.0.0.1:{internal_port}") as raw:
        channel = proving_channel(raw, secret)
        do = channel.unary_unary("/raftgate.storepb.Store/Do",
                                 request_serializer=ipb.InternalRaftRequest.SerializeToString,
                                 response_deserializer=store_pb2.InternalResponse.FromString)
        req = ipb.InternalRaftRequest(header=ipb.RequestHeader(),
                                      range=rpc_pb2.RangeRequest(key=key, serializable=True))
        answer = do(req, timeout=5)
    return [kv.value for kv in answer.range.kvs]


def test_learner_joins_catches_up_is_promoted_and_removed(tmp_path: Path) -> None:
    with RaftgateLocal(tmp_path / "cluster") as cluster:
        ep = cluster.endpoint
        for i in range(20):
            assert etcdctl(ep, "put", f"k{i}", f"v{i}")[0] == 0
        state = cluster.local_json()
        assert state is not None
        stores = [p for p in state["processes"] if p["role"] == "store"]  # type: ignore[index]
        secret_file = Path(state["data_dir"]) / "internal-secret"  # type: ignore[index]
        peer_port, internal_port = free_port(), free_port()
        peer_url = f"http://127.0.0.1:{peer_port}"

        rc, out, err = etcdctl(ep, "member", "add", "node4", f"--peer-urls={peer_url}", "--learner")
        assert rc == 0, err
        # etcdctl prints IDs with %16x: shorter IDs get leading spaces, as with etcd
        added = re.match(r"Member +([0-9a-f]+) added to cluster +([0-9a-f]+)\n", out)
        assert added, out
        member_hex = added.group(1)
        assert 'ETCD_INITIAL_CLUSTER_STATE="existing"' in out
        listed = etcdctl(ep, "member", "list")[1]
        assert f"{member_hex}, unstarted, , {peer_url}, , true" in listed

        initial = ",".join(f"{s['name']}=http://127.0.0.1:{s['peer_port']}" for s in stores)
        argv = [sys.executable, "-m", "raftgate.cli", "store", "--name", "node4", "--data-dir",
                str(tmp_path / "node4"), "--listen-internal-urls", f"http://127.0.0.1:{internal_port}",
                "--internal-secret-file", str(secret_file), "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url, "--peer-secret-file", str(secret_file),
                "--initial-cluster", f"{initial},node4={peer_url}", "--initial-cluster-state", "existing"]
        node4 = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        try:
            secret = secret_file.read_text().strip()
            wait_for(lambda: f"{member_hex}, started, node4, {peer_url}" in etcdctl(ep, "member", "list")[1],
                     30, "the learner to publish its name")
            wait_for(lambda: _serializable_get(internal_port, secret, b"k19") == [b"v19"], 30,
                     "the learner to catch up")

            rc, out, err = etcdctl(ep, "member", "promote", member_hex)
            assert rc == 0 and re.fullmatch(rf"Member +{member_hex} promoted in cluster +{added.group(2)}\n", out), err
            assert f"{member_hex}, started, node4, {peer_url}, , false" in etcdctl(ep, "member", "list")[1]
            assert etcdctl(ep, "put", "after-promote", "yes")[0] == 0
            wait_for(lambda: _serializable_get(internal_port, secret, b"after-promote") == [b"yes"], 30,
                     "the new voter to apply new writes")

            rc, out, err = etcdctl(ep, "member", "remove", member_hex)
            assert rc == 0 and re.fullmatch(rf"Member +{member_hex} removed from cluster +{added.group(2)}\n", out), err
            assert member_hex not in etcdctl(ep, "member", "list")[1]
            assert etcdctl(ep, "put", "after-remove", "yes")[0] == 0
        finally:
            with contextlib.suppress(ProcessLookupError):  # a removed member exits by itself
                os.killpg(node4.pid, signal.SIGKILL)
            node4.wait()


def test_membership_refusals_match_etcd(tmp_path: Path) -> None:
    with RaftgateLocal(tmp_path / "cluster") as cluster:
        ep = cluster.endpoint
        members = etcdctl(ep, "member", "list")[1].splitlines()
        voter_id, _, _, voter_peer = (field.strip() for field in members[0].split(",")[:4])
        assert etcdctl(ep, "member", "remove", "1234")[2].endswith("Error: etcdserver: member not found\n")
        assert etcdctl(ep, "member", "promote", voter_id)[2].endswith(
            "Error: etcdserver: can only promote a learner member\n")
        rc, _, err = etcdctl(ep, "member", "add", "dup", f"--peer-urls={voter_peer}")
        assert rc == 1 and err.endswith("Error: etcdserver: Peer URLs already exists\n")
