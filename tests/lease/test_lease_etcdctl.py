"""Leases through etcdctl 3.5.1, side by side with a real etcd 3.5.1 where 3.5.1 and 3.7.1 agree.

Expectations are etcd 3.7.1's (reference §3.3); the `v35=` overrides record where the etcd 3.5.1 we
run answers differently (before the 2026-03 fix, anonymous callers could grant, keep alive, list
and read TTLs, and nobody's keep-alive, TimeToLive --keys or lease list was checked).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.ctl_steps import DENIED, ROOT, USER_EMPTY, Ctl
from tests.support.lease_steps import grant, present
from tests.support.processes import (
    BACKENDS,
    ETCDCTL,
    EtcdServer,
    RaftgateLocal,
    client_script_env,
    new_server,
    skip_unless_available,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.default_raft_timing]  # about the default timing

Server = EtcdServer | RaftgateLocal
NOT_FOUND = "Error: etcdserver: requested lease not found\n"
ALICE, BOB, CAROL = "alice:pw", "bob:pw", "carol:pw"


def revision(ctl: Ctl, user: str | None = None) -> int:
    rc, out, _ = ctl.raw("get", "rev-probe", "-w", "json", user=user)
    assert rc == 0
    return int(json.loads(out)["header"]["revision"])


@pytest.fixture
def plain(backend: str, start_server: Callable[..., Server]) -> Ctl:
    return Ctl(start_server(backend).endpoint, backend)


def test_lease_commands(plain: Ctl) -> None:
    ctl = plain
    # TTL rules: etcd's minimum (1.5 election timeouts, rounded up) and MaxLeaseTTL
    lid = grant(ctl, 0)
    ctl("lease", "timetolive", lid, out_re=rf"lease {lid} granted with TTL\(2s\), remaining\([12]s\)\n", out=None)
    ctl("lease", "grant", "9000000001", rc=1, err="Error: failed to grant lease (etcdserver: too large lease TTL)\n")
    lid = grant(ctl, 60)
    ctl("put", "--lease", lid, "k1", "v", out="OK\n")
    ctl("put", "--lease", lid, "k2", "v", out="OK\n")
    ctl("put", "--lease", "1234", "k3", "v", rc=1, err=NOT_FOUND)
    # remaining: counting down from the grant, a few etcdctl runs ago (seconds on a loaded machine)
    ctl("lease", "timetolive", "--keys", lid,
        # etcd lists a lease's keys in Go map order (random); raftgate lists them sorted
        out_re=rf"lease {lid} granted with TTL\(60s\), remaining\((5[5-9]|60)s\), attached keys\(\[(k1 k2|k2 k1)\]\)\n",
        out=None)
    _, out, _ = ctl("lease", "list", out=None)
    assert out.startswith("found ") and lid in out.split()
    ctl("lease", "keep-alive", "--once", lid, out=f"lease {lid} keepalived with TTL(60)\n")
    # unknown leases: etcd answers TTL 0 in the keep-alive stream, -1 for TimeToLive
    ctl("lease", "keep-alive", "--once", "1234", rc=2, err=NOT_FOUND)
    ctl("lease", "keep-alive", "1234", out="lease 0000000000001234 expired or revoked.\n")
    ctl("lease", "timetolive", "1234", out="lease 0000000000001234 already expired\n")
    ctl("lease", "timetolive", "--keys", "1234", out="lease 0000000000001234 already expired\n")
    ctl("lease", "revoke", "1234", rc=1, err="Error: failed to revoke lease (etcdserver: requested lease not found)\n")
    # revoke deletes every attached key in ONE revision
    before = revision(ctl)
    ctl("lease", "revoke", lid, out=f"lease {lid} revoked\n")
    assert revision(ctl) == before + 1
    assert not present(ctl, "k1") and not present(ctl, "k2")
    ctl("lease", "timetolive", lid, out=f"lease {lid} already expired\n")
    ctl("lease", "keep-alive", "--once", lid, rc=2, err=NOT_FOUND)
    # a lease with no keys revokes without a revision
    lid = grant(ctl, 60)
    before = revision(ctl)
    ctl("lease", "revoke", lid, out=f"lease {lid} revoked\n")
    assert revision(ctl) == before


def test_expiry_removes_keys_and_keep_alive_extends(plain: Ctl) -> None:
    ctl = plain
    dies, lives = grant(ctl, 3), grant(ctl, 3)
    ctl("put", "--lease", dies, "dies/a", "v", out="OK\n")
    ctl("put", "--lease", dies, "dies/b", "v", out="OK\n")
    ctl("put", "--lease", lives, "lives", "v", out="OK\n")
    ctl("put", "plain", "v", out="OK\n")
    before = revision(ctl)
    start = time.monotonic()
    while time.monotonic() - start < 5.5:  # renew well past the TTL
        ctl("lease", "keep-alive", "--once", lives, out=f"lease {lives} keepalived with TTL(3)\n")
        time.sleep(0.8)  # a client's keep-alive interval (about TTL/3), not a wait for a condition
    assert not present(ctl, "dies/a") and not present(ctl, "dies/b")
    assert present(ctl, "lives") and present(ctl, "plain")
    ctl("lease", "timetolive", dies, out=f"lease {dies} already expired\n")
    # the server's revoke of an expired lease deletes its keys in one revision, like a client's
    assert revision(ctl) == before + 1
    wait_for(lambda: not present(ctl, "lives"), timeout=8, what="the lease nobody renews any more to expire")
    assert present(ctl, "plain")


# ---------------------------------------------------------------------------------------------
# the auth matrix (reference §3.3), one server per backend


def setup_users(ctl: Ctl) -> None:
    """root; alice READWRITE a/; bob READWRITE b/ and READ a/; carol nothing; auth on."""
    for u in (ROOT, ALICE, BOB, CAROL):
        ctl("user", "add", u, out=f"User {u.split(':')[0]} created\n")
    for role, perm, prefix in (("ra", "readwrite", "a/"), ("rb", "readwrite", "b/"), ("rr", "read", "a/")):
        ctl("role", "add", role, out=f"Role {role} created\n")
        ctl("role", "grant-permission", role, perm, prefix, "--prefix", out=f"Role {role} updated\n")
    for user, role in (("alice", "ra"), ("bob", "rb"), ("bob", "rr")):
        ctl("user", "grant-role", user, role, out=f"Role {role} is granted to user {user}\n")
    ctl("auth", "enable", out="Authentication Enabled\n")


@pytest.fixture(scope="module", params=BACKENDS)
def authed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Ctl]]:
    skip_unless_available(request.param)
    server = new_server(request.param, tmp_path_factory.mktemp(f"lease-{request.param}"))
    server.start()
    ctl = Ctl(server.endpoint, request.param)
    setup_users(ctl)
    yield server, ctl
    server.stop()


def test_anonymous_callers(authed: tuple[Server, Ctl]) -> None:
    _, ctl = authed
    lid = grant(ctl, 60, user=ALICE)
    keyless = grant(ctl, 60, user=ALICE)
    ctl("put", "--lease", lid, "a/anon", "v", user=ALICE, out="OK\n")
    granted_35 = {"rc": 0, "out": None, "err": ""}
    ctl("lease", "grant", "60", rc=1, err="Error: failed to grant lease (etcdserver: user name is empty)\n",
        v35=granted_35)
    ctl("lease", "keep-alive", "--once", lid, rc=2, err=USER_EMPTY,
        v35={"rc": 0, "out": f"lease {lid} keepalived with TTL(60)\n", "err": ""})
    ctl("lease", "timetolive", lid, rc=2, err=USER_EMPTY, v35=granted_35)
    ctl("lease", "timetolive", "--keys", lid, rc=2, err=USER_EMPTY, v35=granted_35)
    ctl("lease", "list", rc=2, err=USER_EMPTY, v35=granted_35)
    ctl("put", "--lease", lid, "a/x", "v", rc=1, err=USER_EMPTY)
    revoke_anon = "Error: failed to revoke lease (etcdserver: user name is empty)\n"
    ctl("lease", "revoke", lid, rc=1, err=revoke_anon)
    # 3.5.1 let an anonymous caller revoke a lease without keys; 3.7.1 asks for a user
    ctl("lease", "revoke", keyless, rc=1, err=revoke_anon, v35={"rc": 0, "out": f"lease {keyless} revoked\n",
                                                                  "err": ""})
    ctl("lease", "revoke", lid, user=ALICE, out=f"lease {lid} revoked\n")


def test_write_on_every_attached_key_to_revoke_keep_alive_and_attach(authed: tuple[Server, Ctl]) -> None:
    _, ctl = authed
    la = grant(ctl, 60, user=ALICE)
    ctl("put", "--lease", la, "a/1", "v", user=ALICE, out="OK\n")
    # Put with a lease needs WRITE on the keys already attached (bob may write b/ but not a/1)
    ctl("put", "--lease", la, "b/1", "v", user=BOB, rc=1, err=DENIED)
    ctl("put", "--lease", la, "a/2", "v", user=ALICE, out="OK\n")
    # keep-alive and revoke need WRITE on every attached key (3.5.1 did not check keep-alive)
    ctl("lease", "keep-alive", "--once", la, user=BOB, rc=2, err=DENIED,
        v35={"rc": 0, "out": f"lease {la} keepalived with TTL(60)\n", "err": ""})
    ctl("lease", "keep-alive", "--once", la, user=CAROL, rc=2, err=DENIED,
        v35={"rc": 0, "out": f"lease {la} keepalived with TTL(60)\n", "err": ""})
    ctl("lease", "keep-alive", "--once", la, user=ALICE, out=f"lease {la} keepalived with TTL(60)\n")
    ctl("lease", "revoke", la, user=BOB, rc=1, err="Error: failed to revoke lease (etcdserver: permission denied)\n")
    ctl("lease", "revoke", la, user=CAROL, rc=1, err="Error: failed to revoke lease (etcdserver: permission denied)\n")
    assert present(ctl, "a/1", user=ALICE)
    # root attaches a key alice cannot write: now alice can neither renew nor revoke
    ctl("put", "--lease", la, "z", "v", user=ROOT, out="OK\n")
    ctl("lease", "keep-alive", "--once", la, user=ALICE, rc=2, err=DENIED,
        v35={"rc": 0, "out": f"lease {la} keepalived with TTL(60)\n", "err": ""})
    ctl("lease", "revoke", la, user=ALICE, rc=1, err="Error: failed to revoke lease (etcdserver: permission denied)\n")
    ctl("put", "--lease", la, "a/3", "v", user=ALICE, rc=1, err=DENIED)
    ctl("lease", "keep-alive", "--once", la, user=ROOT, out=f"lease {la} keepalived with TTL(60)\n")
    ctl("lease", "revoke", la, user=ROOT, out=f"lease {la} revoked\n")
    assert not present(ctl, "a/1", user=ALICE) and not present(ctl, "z", user=ROOT)
    # a lease without keys: any authenticated user
    keyless = grant(ctl, 60, user=ALICE)
    ctl("lease", "keep-alive", "--once", keyless, user=CAROL, out=f"lease {keyless} keepalived with TTL(60)\n")
    ctl("lease", "revoke", keyless, user=CAROL, out=f"lease {keyless} revoked\n")


def test_read_on_every_attached_key_for_ttl_keys_and_list(authed: tuple[Server, Ctl]) -> None:
    _, ctl = authed
    # start from no leases at all (other tests of this module revoke theirs)
    _, out, _ = ctl("lease", "list", user=ROOT, out=None)
    for lid in out.split()[3:]:
        ctl.raw("lease", "revoke", lid, user=ROOT)
    la = grant(ctl, 60, user=ALICE)
    ctl("put", "--lease", la, "a/r", "v", user=ALICE, out="OK\n")
    ttl_keys = rf"lease {la} granted with TTL\(60s\), remaining\((5[5-9]|60)s\), attached keys\(\[a/r\]\)\n"
    ttl_plain = rf"lease {la} granted with TTL\(60s\), remaining\((5[5-9]|60)s\)\n"
    ctl("lease", "timetolive", "--keys", la, user=ALICE, out_re=ttl_keys, out=None)
    ctl("lease", "timetolive", "--keys", la, user=BOB, out_re=ttl_keys, out=None)  # bob reads a/
    # 3.5.1 did not check TimeToLive --keys
    ctl("lease", "timetolive", "--keys", la, user=CAROL, rc=2, err=DENIED,
        v35={"rc": 0, "out": None, "out_re": ttl_keys, "err": ""})
    ctl("lease", "timetolive", la, user=CAROL, out_re=ttl_plain, out=None)  # without keys: authenticated
    listed = f"found 1 leases\n{la}\n"
    ctl("lease", "list", user=ALICE, out=listed)
    ctl("lease", "list", user=BOB, out=listed)
    ctl("lease", "list", user=CAROL, rc=2, err=DENIED, v35={"rc": 0, "out": listed, "err": ""})
    # one unreadable key on any lease denies the whole list
    lb = grant(ctl, 60, user=BOB)
    ctl("put", "--lease", lb, "b/r", "v", user=BOB, out="OK\n")
    ctl("lease", "list", user=ALICE, rc=2, err=DENIED, v35={"rc": 0, "out": None, "err": ""})
    _, out, _ = ctl("lease", "list", user=BOB, out=None)
    assert sorted(out.split()[3:]) == sorted([la, lb])
    ctl("lease", "list", user=ROOT, out=None)
    ctl("lease", "revoke", lb, user=BOB, out=f"lease {lb} revoked\n")
    ctl("lease", "list", user=ALICE, out=listed)
    ctl("lease", "revoke", la, user=ALICE, out=f"lease {la} revoked\n")


def test_permission_revoked_mid_lease(authed: tuple[Server, Ctl]) -> None:
    """The lease rules follow the auth state in log order: a revoked grant denies the next renew."""
    _, ctl = authed
    ctl("role", "add", "rtmp", user=ROOT, out="Role rtmp created\n")
    ctl("role", "grant-permission", "rtmp", "readwrite", "t/", "--prefix", user=ROOT, out="Role rtmp updated\n")
    ctl("user", "grant-role", "carol", "rtmp", user=ROOT, out="Role rtmp is granted to user carol\n")
    lt = grant(ctl, 60, user=CAROL)
    ctl("put", "--lease", lt, "t/1", "v", user=CAROL, out="OK\n")
    ctl("lease", "keep-alive", "--once", lt, user=CAROL, out=f"lease {lt} keepalived with TTL(60)\n")
    ctl("role", "revoke-permission", "rtmp", "t/", "--prefix", user=ROOT,
        out="Permission of range [t/, t0) is revoked from role rtmp\n")
    ctl("lease", "keep-alive", "--once", lt, user=CAROL, rc=2, err=DENIED,
        v35={"rc": 0, "out": f"lease {lt} keepalived with TTL(60)\n", "err": ""})
    ctl("lease", "revoke", lt, user=CAROL, rc=1, err="Error: failed to revoke lease (etcdserver: permission denied)\n")
    ctl("lease", "revoke", lt, user=ROOT, out=f"lease {lt} revoked\n")


# ---------------------------------------------------------------------------------------------
# python-etcd3 (in a subprocess: its protos clash with raftgate's)


def test_python_etcd3_leases(authed: tuple[Server, Ctl]) -> None:
    server, ctl = authed
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("etcd3_lease_script.py")), server.target],
                          capture_output=True, text=True, env=client_script_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout)
    user_empty = {"error": {"code": "INVALID_ARGUMENT", "details": "etcdserver: user name is empty"}}
    denied = {"error": {"code": "PERMISSION_DENIED", "details": "etcdserver: permission denied"}}
    want: dict[str, object] = {
        "anon_grant": user_empty,
        "alice_grant_ttl": {"ok": 60},
        "alice_grant_given_id": {"ok": 0x4242},
        "alice_put_with_lease": {"ok": None},
        "bob_put_with_lease": denied,
        "alice_refresh": {"ok": [60]},
        "bob_refresh": denied,
        "anon_refresh": user_empty,
        "alice_refresh_unknown": {"ok": [0]},  # etcd answers TTL 0 in the stream
        "bob_info_keys": {"ok": ["a/e3"]},
        "carol_info_keys": denied,
        "alice_info_unknown_ttl": {"ok": -1},
        "lease_object_keys": {"ok": ["a/e3"]},
        "lease_object_remaining_ok": {"ok": True},
        "bob_revoke": denied,
        "anon_revoke": user_empty,
        "alice_revoke": {"ok": None},
        "key_after_revoke": {"ok": None},
        "root_revoke_given_id": {"ok": None},
        "expired_key": {"ok": None},
        "expired_info_ttl": {"ok": -1},
    }
    if ctl.backend == "etcd":  # 3.5.1: before the 2026-03 fix, none of these were checked
        want |= {"bob_refresh": {"ok": [60]}, "anon_refresh": {"ok": [60]}, "carol_info_keys": {"ok": ["a/e3"]}}
        del want["anon_grant"], got["anon_grant"]  # 3.5.1 grants it (a random ID)
    assert got == want


# ---------------------------------------------------------------------------------------------
# etcdctl lock / elect between two users (leases + watches + txns, clientv3's concurrency package)


class Running:
    """A long-running etcdctl whose stdout lines are collected as they come."""

    def __init__(self, endpoint: str, *args: str, user: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")} | {"ETCDCTL_API": "3"}
        self.proc = subprocess.Popen([ETCDCTL, f"--endpoints={endpoint}", f"--user={user}", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_lines(self, n: int, timeout: float = 15) -> list[str]:
        wait_for(lambda: len(self.lines) >= n or self.proc.poll() is not None, timeout, f"{n} lines of output")
        if len(self.lines) < n:
            self._reader.join(timeout=10)  # exited: what it wrote last may still be in the pipe
        assert len(self.lines) >= n, (self.lines, self.stop())
        return self.lines[:n]

    def exited(self, timeout: float) -> int:
        """Its exit code, once its output is read to the end (a process can exit before the reader
        thread has taken its last line: the test then saw no output from a command that wrote it)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def signal(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def stop(self) -> str:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        return self.proc.stderr.read() if self.proc.stderr else ""


@pytest.fixture
def sync_users(authed: tuple[Server, Ctl]) -> tuple[Server, Ctl]:
    server, ctl = authed
    if ctl.raw("role", "get", "rsync", user=ROOT)[0] != 0:
        ctl("role", "add", "rsync", user=ROOT, out="Role rsync created\n")
        for prefix in ("mylock/", "myelection/"):
            ctl("role", "grant-permission", "rsync", "readwrite", prefix, "--prefix", user=ROOT,
                out="Role rsync updated\n")
        for user in ("alice", "bob"):
            ctl("user", "grant-role", user, "rsync", user=ROOT, out=f"Role rsync is granted to user {user}\n")
    return server, ctl


def test_lock_between_two_users(sync_users: tuple[Server, Ctl]) -> None:
    server, ctl = sync_users
    holder = Running(server.endpoint, "lock", "mylock", user=ALICE)
    waiter: Running | None = None
    try:
        [key] = holder.wait_lines(1)
        assert re.fullmatch(r"mylock/[0-9a-f]+", key), key
        waiter = Running(server.endpoint, "lock", "mylock", "echo", "bob-has-it", user=BOB)
        # bob's key is created behind alice's and he waits for hers to go (a watch)
        wait_for(lambda: len(ctl.raw("get", "mylock/", "--prefix", "--keys-only", user=ROOT)[1].split()) == 2,
                 timeout=10, what="bob's lock key")
        assert waiter.proc.poll() is None and not waiter.lines
        holder.signal(signal.SIGTERM)  # etcdctl unlocks and closes its session
        assert waiter.exited(15) == 0, waiter.stop()
        assert waiter.lines == ["bob-has-it"]
        assert holder.proc.wait(timeout=10) == 0
        ctl("get", "mylock/", "--prefix", user=ROOT, out="")
        # no grant on the lock's prefix: refused
        rc, out, err = ctl.raw("lock", "mylock", "echo", "never", user=CAROL)
        assert (rc, out) == (1, "") and err.endswith("etcdserver: permission denied\n"), (rc, out, err)
    finally:
        holder.stop()
        if waiter is not None:
            waiter.stop()


def test_elect_between_two_users(sync_users: tuple[Server, Ctl]) -> None:
    server, ctl = sync_users
    alice = Running(server.endpoint, "elect", "myelection", "alice-proposal", user=ALICE)
    observer: Running | None = None
    bob: Running | None = None
    try:
        key, value = alice.wait_lines(2)
        assert re.fullmatch(r"myelection/[0-9a-f]+", key) and value == "alice-proposal"
        observer = Running(server.endpoint, "elect", "--listen", "myelection", user=BOB)
        assert observer.wait_lines(2) == [key, "alice-proposal"]
        bob = Running(server.endpoint, "elect", "myelection", "bob-proposal", user=BOB)
        wait_for(lambda: len(ctl.raw("get", "myelection/", "--prefix", "--keys-only", user=ROOT)[1].split()) == 2,
                 timeout=10, what="bob's candidacy")
        assert not bob.lines
        alice.signal(signal.SIGTERM)  # alice resigns
        bob_key, bob_value = bob.wait_lines(2)
        assert bob_value == "bob-proposal" and bob_key != key
        wait_for(lambda: observer.lines[-1:] == ["bob-proposal"], timeout=10, what="the observer to see bob")
        assert alice.proc.wait(timeout=10) == 0
        rc, out, err = ctl.raw("elect", "myelection", "carol-proposal", user=CAROL)
        assert (rc, out) == (1, "") and err.endswith("etcdserver: permission denied\n"), (rc, out, err)
    finally:
        for p in (alice, observer, bob):
            if p is not None:
                p.stop()
