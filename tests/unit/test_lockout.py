"""Lockout's apply side (authstore/state/auth/lockout.py): counted from the entries alone, so every
node that applies the same entries locks the same names at the same entry times."""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authstore.state.auth.lockout import Lockout
from authstore.state.auth.store import AuthStore
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

MIN = 60_000
HASH = base64.b64encode(bcrypt.hashpw(b"pw", bcrypt.gensalt(4))).decode()


class Store:
    def __init__(self, path: Path, max_unknown: int = 4096) -> None:
        self.env = lmdb.open(str(path), max_dbs=32, map_size=1 << 24, sync=False, metasync=False)
        self.auth = AuthStore(self.env)
        self.auth.lockout = Lockout(self.env, self.auth._key, max_unknown=max_unknown)
        self.index = 10

    def add_user(self, name: str) -> None:
        with self.env.begin(write=True) as txn:
            self.auth.user_add(txn, pb.AuthUserAddRequest(name=name, hashedPassword=HASH))

    def enable(self) -> None:
        self.add_user("root")
        with self.env.begin(write=True) as txn:
            self.auth.user_grant_role(txn, pb.AuthUserGrantRoleRequest(user="root", role="root"))
            self.auth.enable(txn, pb.AuthEnableRequest())

    def fail(self, t: int, *names: str, attempts: int = 3, duration: int = 10 * MIN) -> int:
        with self.env.begin(write=True) as txn:
            return self.auth.record_failures(
                txn, ipb.AuthFailuresEntry(names=list(names), attempts=attempts, duration_ms=duration), t)

    def login(self, name: str, t: int) -> str:
        """Authenticate's apply for a password the proxy found right; raises EtcdError."""
        self.index += 1
        with self.env.begin(write=True) as txn:
            req = ipb.InternalAuthenticateRequest(name=name, simple_token="abcdefghijklmnop",
                                                  checked_revision=self.auth.revision(txn), issued_at_unix_ms=t,
                                                  ttl_seconds=300)
            return self.auth.authenticate(txn, req, self.index)

    def locked(self, name: str, t: int) -> bool:
        with self.env.begin() as txn:
            return self.auth.lockout.is_locked(txn, name, t)

    def passwd(self, name: str) -> None:
        with self.env.begin(write=True) as txn:
            self.auth.user_change_password(txn, pb.AuthUserChangePasswordRequest(name=name, hashedPassword=HASH))

    def unknown(self) -> int:
        with self.env.begin() as txn:
            return self.auth.lockout.unknown_names(txn)


@pytest.fixture
def s(tmp_path: Path) -> Iterator[Store]:
    store = Store(tmp_path)
    store.enable()
    store.add_user("alice")
    yield store
    store.env.close()


def refused(store: Store, name: str, t: int) -> None:
    with pytest.raises(EtcdError) as info:
        store.login(name, t)
    assert info.value.err is Err.AUTH_FAILED


def test_attempts_within_the_duration_lock_and_even_the_right_password_is_refused(s: Store) -> None:
    assert s.fail(1000, "alice") == 0 and s.fail(2000, "alice") == 0
    assert not s.locked("alice", 2000)
    assert s.fail(3000, "alice") == 1
    assert s.locked("alice", 3000) and s.locked("alice", 3000 + 10 * MIN - 1)
    refused(s, "alice", 4000)
    assert not s.locked("alice", 3000 + 10 * MIN)  # the lock ends after the duration
    assert s.login("alice", 3000 + 10 * MIN)


def test_failures_while_locked_do_not_extend_the_lock(s: Store) -> None:
    for t in (1, 2, 3):
        s.fail(t, "alice")
    assert s.fail(5 * MIN, "alice") == 0
    assert not s.locked("alice", 3 + 10 * MIN)


def test_failures_spread_over_more_than_the_duration_do_not_lock(s: Store) -> None:
    s.fail(0, "alice")
    s.fail(5 * MIN, "alice")
    s.fail(10 * MIN, "alice")  # the window started at 0 is over: a new one starts here
    s.fail(11 * MIN, "alice")
    assert not s.locked("alice", 11 * MIN)
    assert s.fail(12 * MIN, "alice") == 1


def test_success_resets_the_count(s: Store) -> None:
    s.fail(1, "alice")
    s.fail(2, "alice")
    s.login("alice", 3)
    s.fail(4, "alice")
    s.fail(5, "alice")
    assert not s.locked("alice", 5)


def test_password_change_lifts_the_lock(s: Store) -> None:
    s.fail(1, "alice", "alice", "alice")  # one entry, several failures (a batch)
    assert s.locked("alice", 2)
    s.passwd("alice")
    assert not s.locked("alice", 2)
    assert s.login("alice", 3)


def test_unknown_names_are_counted_and_bounded(tmp_path: Path) -> None:
    s = Store(tmp_path, max_unknown=3)
    s.enable()
    for i, name in enumerate(["a", "b", "c", "d", "e"]):
        s.fail(i, name)
    assert s.unknown() == 3
    with s.env.begin() as txn:
        assert s.auth.lockout.get(txn, "a") is None and s.auth.lockout.get(txn, "b") is None  # the oldest went
        assert s.auth.lockout.get(txn, "e") is not None
    s.fail(10, "c", "c")
    assert s.locked("c", 10)
    s.add_user("c")  # a name that starts to exist starts with no failures
    assert not s.locked("c", 10) and s.unknown() == 2
    for name in ("x", "y", "z", "w"):
        s.fail(20, name)
    assert s.unknown() == 3  # existing users' records are never evicted by unknown names
    s.fail(30, "root", attempts=1)
    assert s.locked("root", 30)
    for i in range(10):
        s.fail(40 + i, f"spray{i}")
    assert s.locked("root", 50)


def test_a_skewed_clock_bounds_the_lock(s: Store) -> None:
    year = 365 * 24 * 60 * MIN
    for _ in range(3):
        s.fail(year, "alice")  # a leader whose clock is a year ahead
    assert s.locked("alice", year)
    assert not s.locked("alice", 0)  # a leader with the right time: not locked for a year
    assert s.login("alice", 0)
    for t in (5 * MIN, 1, 2):  # a clock going back within the duration still counts in the window
        s.fail(t, "alice")
    assert s.locked("alice", 3)


def test_zero_attempts_counts_nothing(s: Store) -> None:
    for t in range(10):
        assert s.fail(t, "alice", attempts=0) == 0
    assert not s.locked("alice", 10)


ops = st.lists(st.tuples(st.sampled_from(["fail", "login", "passwd"]), st.sampled_from(["alice", "ghost", "root"]),
                         st.integers(0, 30 * MIN)), max_size=25)


@settings(max_examples=30, deadline=None)
@given(ops)
def test_two_nodes_applying_the_same_entries_agree(entries: list[tuple[str, str, int]]) -> None:
    """Same entries, same state: the apply side reads nothing but the entries (no clock)."""
    results = []
    with tempfile.TemporaryDirectory() as d:
        for node in ("a", "b"):
            s = Store(Path(d) / node, max_unknown=2)
            s.enable()
            s.add_user("alice")
            out: list[object] = []
            for op, name, t in entries:
                if op == "fail":
                    out.append(s.fail(t, name))
                elif op == "login":
                    try:
                        out.append(s.login(name, t))
                    except EtcdError as e:
                        out.append(e.err)
                elif name != "ghost":
                    s.passwd(name)
                out.append(s.locked(name, t))
            with s.env.begin() as txn:
                out.append(sorted(bytes(k) for k, _ in txn.cursor(db=s.auth.lockout._db)))
            results.append(out)
            s.env.close()
    assert results[0] == results[1]


def test_store_flags(tmp_path: Path) -> None:
    from authstore import config

    secret = tmp_path / "secret"
    secret.write_text("s" * 20)
    base = ["--internal-secret-file", str(secret), "--peer-secret-file", str(secret)]
    c = config.parse(base, {})
    assert (c.auth_lockout_attempts, c.auth_lockout_duration_ms) == (5, 15 * MIN)
    c = config.parse([*base, "--auth-lockout-duration", "1m30s"], {"RAFTGATE_STORE_AUTH_LOCKOUT_ATTEMPTS": "0"})
    assert (c.auth_lockout_attempts, c.auth_lockout_duration_ms) == (0, 90_000)
    for bad in (["--auth-lockout-duration", "0s"], ["--auth-lockout-duration", "15"],
                ["--auth-lockout-attempts", "-1"]):
        with pytest.raises(config.ConfigError, match="--auth-lockout-"):
            config.parse([*base, *bad], {})
