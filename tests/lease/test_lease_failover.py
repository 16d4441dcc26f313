"""Leases across a leader kill (no early expiry, eventual expiry, keep-alive streams that survive)
and lease expiry in verify-only JWT mode (beyond etcd, which cannot revoke expired leases there)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.ctl_steps import Ctl
from tests.support.lease_steps import grant, present
from tests.support.processes import ETCDCTL, RaftgateLocal, pem_rsa_keypair, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.default_raft_timing]  # about the default timing

TTL = 4


def leader_pid(local: RaftgateLocal, ctl: Ctl) -> tuple[int, str]:
    """The pid and name of the store node that leads, from etcdctl and local.json."""
    _, out, _ = ctl("endpoint", "status", "-w", "json", out=None)
    leader = json.loads(out)[0]["Status"]["leader"]
    _, out, _ = ctl("member", "list", "-w", "json", out=None)
    name = next(m["name"] for m in json.loads(out)["members"] if m["ID"] == leader)
    state = local.local_json()
    assert state is not None
    pid = next(p["pid"] for p in state["processes"] if p.get("name") == name)  # type: ignore[union-attr]
    return int(pid), name


def test_leader_kill_neither_expires_leases_early_nor_keeps_them(tmp_path: Path) -> None:
    local = RaftgateLocal(tmp_path / "rg")
    local.start()
    keeper: subprocess.Popen[str] | None = None
    try:
        ctl = Ctl(local.endpoint, "raftgate")
        idle, kept = grant(ctl, TTL), grant(ctl, TTL)
        ctl("put", "--lease", idle, "idle/k", "v", out="OK\n")
        ctl("put", "--lease", kept, "kept/k", "v", out="OK\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")} | {"ETCDCTL_API": "3"}
        keeper = subprocess.Popen([ETCDCTL, f"--endpoints={local.endpoint}", "lease", "keep-alive", kept],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                  start_new_session=True)
        wait_for(lambda: ctl.raw("lease", "timetolive", kept)[0] == 0, timeout=5, what="keep-alive to start")
        pid, name = leader_pid(local, ctl)
        # the last renewal of `idle` before the kill: a deadline of (at least) renewed + TTL
        renewed = time.monotonic()
        ctl("lease", "keep-alive", "--once", idle, out=f"lease {idle} keepalived with TTL({TTL})\n")
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        # no early expiry: the key stays until the deadline the old leader promised
        while time.monotonic() < renewed + TTL - 0.3:
            assert present(ctl, "idle/k"), f"lease expired {time.monotonic() - renewed:.1f}s after its renewal"
        wait_for(lambda: leader_pid(local, ctl)[1] != name, timeout=10, what="a new leader")
        # eventual expiry: at most TTL/2 + an election timeout late (plus the election and a round)
        wait_for(lambda: not present(ctl, "idle/k"), timeout=TTL / 2 + 1 + 8, what="the idle lease to expire")
        gone = time.monotonic()
        print(f"idle lease gone {gone - renewed:.1f}s after its last renewal (TTL {TTL}s, leader killed "
              f"{killed - renewed:.1f}s after it)")
        ctl("lease", "timetolive", idle, out=f"lease {idle} already expired\n")
        # the continuous keep-alive went on through the proxy, across the leader change
        while time.monotonic() < killed + 2 * TTL:
            assert present(ctl, "kept/k"), "a lease kept alive expired across the leader change"
        ctl("lease", "timetolive", kept, out_re=rf"lease {kept} granted with TTL\({TTL}s\), remaining\(\d+s\)\n",
            out=None)
        assert keeper.poll() is None
        os.killpg(keeper.pid, signal.SIGKILL)
        keeper.wait(timeout=5)
        wait_for(lambda: not present(ctl, "kept/k"), timeout=TTL + 1 + 8, what="the abandoned lease to expire")
    finally:
        if keeper is not None and keeper.poll() is None:
            os.killpg(keeper.pid, signal.SIGKILL)
            keeper.wait(timeout=5)
        local.stop()


def test_expiry_in_verify_only_jwt_mode(tmp_path: Path) -> None:
    """etcd revokes expired leases with an internally minted root token, which it cannot sign in
    verify-only JWT mode, so there they stay. raftgate's expiry is an internal log entry."""
    import jwt as pyjwt

    priv, pub = pem_rsa_keypair(tmp_path)
    local = RaftgateLocal(tmp_path / "rg", auth_token=f"jwt,pub-key={pub},sign-method=RS256")
    local.start()
    try:
        ctl = Ctl(local.endpoint, "raftgate")
        ctl("user", "add", "root:rootpw", out="User root created\n")
        ctl("user", "add", "alice:pw", out="User alice created\n")
        ctl("role", "add", "ra", out="Role ra created\n")
        ctl("role", "grant-permission", "ra", "readwrite", "a/", "--prefix", out="Role ra updated\n")
        ctl("user", "grant-role", "alice", "ra", out="Role ra is granted to user alice\n")
        ctl("auth", "enable", out="Authentication Enabled\n")
        ctl("put", "a/x", "v", user="alice:pw", rc=2, out=None, err=None)  # no password logins here
        _, out, _ = ctl("auth", "status", out=None)
        revision = int(out.split("AuthRevision: ")[1])

        def token(user: str) -> tuple[tuple[str, str]]:
            claims = {"username": user, "revision": revision, "exp": int(time.time()) + 600}
            return (("token", pyjwt.encode(claims, priv.read_bytes(), algorithm="RS256")),)

        with grpc.insecure_channel(local.target) as channel:
            lease, kv = rpc_pb2_grpc.LeaseStub(channel), rpc_pb2_grpc.KVStub(channel)
            with pytest.raises(grpc.RpcError) as e:
                lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=2), timeout=10)
            assert e.value.details() == "etcdserver: user name is empty"
            lid = lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=2), metadata=token("alice"), timeout=10).ID
            kv.Put(rpc_pb2.PutRequest(key=b"a/x", value=b"v", lease=lid), metadata=token("alice"), timeout=10)
            resp = lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=lid, keys=True),
                                         metadata=token("alice"), timeout=10)
            assert (resp.grantedTTL, list(resp.keys)) == (2, [b"a/x"])

            def gone() -> bool:
                got = kv.Range(rpc_pb2.RangeRequest(key=b"a/x"), metadata=token("alice"), timeout=10)
                return got.count == 0

            wait_for(gone, timeout=10, what="the expired lease's key to be deleted")
            resp = lease.LeaseTimeToLive(rpc_pb2.LeaseTimeToLiveRequest(ID=lid), metadata=token("root"), timeout=10)
            assert resp.TTL == -1
            assert not lease.LeaseLeases(rpc_pb2.LeaseLeasesRequest(), metadata=token("root"), timeout=10).leases
    finally:
        local.stop()
