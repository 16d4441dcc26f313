"""The seed's safety claims as race tests, against real etcd 3.5.1 and raftgate.

1. A permission revoke is enforced for every write SENT after the revoke was acknowledged.
2. No token is issued for an old password once the password change was acknowledged, and no token
   issued for the old password still works after it.

Time stamps are `time.monotonic()` in this process: a request "sent after the ack" started after the
admin call returned. Old-revision refusals are retried exactly like clientv3 does (a fresh send).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2
from tests.support.processes import EtcdServer, RaftgateLocal
from tests.support.rawgrpc import OLD_REVISION, Stubs, outcome

Server = EtcdServer | RaftgateLocal
ROUNDS = 12
WRITERS = 3
POST_REVOKE_WRITES = 15  # per writer per round
ROUND_TIMEOUT = 20.0


def _setup(srv: Server) -> Stubs:
    admin = Stubs(srv.target)
    a = admin.auth
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="racer", password="pw-0"), timeout=10)
    a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="race-r"), timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="racer", role="race-r"), timeout=10)
    a.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=10)
    admin.login("root", "rootpw")
    return admin


def _guard(fn: Callable[..., None], errors: list[str]) -> Callable[..., None]:
    """Record any exception of a worker thread as a failure (zero exceptions tolerated)."""

    def run(*args: object) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001
            errors.append(f"worker raised {exc!r}")

    return run


PERM = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=b"race/", range_end=b"race0")


@pytest.mark.slow
def test_revoke_races_writes(backend: str, start_server: Callable[..., Server]) -> None:
    srv = start_server(backend)
    admin = _setup(srv)
    md = admin.md
    violations: list[str] = []
    unexpected: list[str] = []
    stats = {"ok": 0, "denied": 0, "old_rev_retries": 0, "post_ack": 0}
    writers = [Stubs(srv.target) for _ in range(WRITERS)]
    for w in writers:
        w.login("racer", "pw-0")
    try:
        for rnd in range(ROUNDS):
            admin.auth.RoleGrantPermission(
                rpc_pb2.AuthRoleGrantPermissionRequest(name="race-r", perm=PERM), metadata=md, timeout=10
            )
            revoke_ack: list[float] = []
            first_ok = threading.Barrier(WRITERS + 1)
            lock = threading.Lock()

            def write_loop(
                w: Stubs,
                idx: int,
                rnd: int = rnd,
                revoke_ack: list[float] = revoke_ack,
                first_ok: threading.Barrier = first_ok,
                lock: threading.Lock = lock,
            ) -> None:
                seq = 0
                post = 0
                waited = False
                deadline = time.monotonic() + ROUND_TIMEOUT
                while post < POST_REVOKE_WRITES and time.monotonic() < deadline:
                    seq += 1
                    key = f"race/{rnd}/{idx}/{seq}".encode()
                    while True:
                        sent = time.monotonic()
                        code, detail = outcome(
                            w.kv.Put, rpc_pb2.PutRequest(key=key, value=b"v"), metadata=w.md, timeout=10
                        )
                        if code != "OK" and (code, detail) in OLD_REVISION:
                            with lock:
                                stats["old_rev_retries"] += 1
                            continue
                        break
                    after_ack = bool(revoke_ack) and sent > revoke_ack[0]
                    with lock:
                        if code == "OK":
                            stats["ok"] += 1
                        elif code == "PERMISSION_DENIED" and detail == "etcdserver: permission denied":
                            stats["denied"] += 1
                        else:
                            unexpected.append(f"round {rnd} writer {idx}: {code} {detail!r}")
                        if after_ack:
                            stats["post_ack"] += 1
                            if code != "PERMISSION_DENIED":
                                violations.append(f"round {rnd} writer {idx} key {key!r}: {code} sent after revoke ack")
                    if after_ack:
                        post += 1
                    if not waited and code == "OK":
                        waited = True
                        first_ok.wait(timeout=ROUND_TIMEOUT)
                    if unexpected:
                        return

            threads = [
                threading.Thread(target=_guard(write_loop, unexpected), args=(w, i)) for i, w in enumerate(writers)
            ]
            for t in threads:
                t.start()
            first_ok.wait(timeout=ROUND_TIMEOUT)  # every writer has had a write accepted under the grant
            admin.auth.RoleRevokePermission(
                rpc_pb2.AuthRoleRevokePermissionRequest(role="race-r", key=PERM.key, range_end=PERM.range_end),
                metadata=md,
                timeout=10,
            )
            revoke_ack.append(time.monotonic())
            for t in threads:
                t.join(timeout=ROUND_TIMEOUT + 10)
            assert not any(t.is_alive() for t in threads), "writer hung"
            assert not unexpected, unexpected[:5]
            assert not violations, violations[:5]
        assert stats["post_ack"] >= ROUNDS * WRITERS * POST_REVOKE_WRITES, stats
        assert stats["ok"] >= ROUNDS * WRITERS, stats
    finally:
        for w in writers:
            w.close()
        admin.close()


@pytest.mark.slow
def test_password_change_races_authenticate(backend: str, start_server: Callable[..., Server]) -> None:
    # every round ends with failed logins on the old password on purpose: raftgate's lockout (on by
    # default, etcd has none) would lock "racer"; the race, not the lockout, is under test here
    srv = start_server(backend, **({"extra_args": ["--auth-lockout-attempts", "0"]} if backend == "raftgate" else {}))
    admin = _setup(srv)
    admin.auth.RoleGrantPermission(
        rpc_pb2.AuthRoleGrantPermissionRequest(name="race-r", perm=PERM), metadata=admin.md, timeout=10
    )
    violations: list[str] = []
    unexpected: list[str] = []
    issued_for_old = 0
    auths = [Stubs(srv.target) for _ in range(WRITERS)]
    try:
        for rnd in range(ROUNDS):
            old_pw, new_pw = f"pw-{rnd}", f"pw-{rnd + 1}"
            ack: list[float] = []
            tokens: list[str] = []
            started = threading.Barrier(WRITERS + 1)
            lock = threading.Lock()

            def auth_loop(
                s: Stubs,
                idx: int,
                rnd: int = rnd,
                old_pw: str = old_pw,
                ack: list[float] = ack,
                tokens: list[str] = tokens,
                started: threading.Barrier = started,
                lock: threading.Lock = lock,
            ) -> None:
                post = 0
                first = True
                deadline = time.monotonic() + ROUND_TIMEOUT
                while post < POST_REVOKE_WRITES and time.monotonic() < deadline:
                    sent = time.monotonic()
                    code, resp = outcome(
                        s.auth.Authenticate, rpc_pb2.AuthenticateRequest(name="racer", password=old_pw), timeout=10
                    )
                    after_ack = bool(ack) and sent > ack[0]
                    with lock:
                        if code == "OK":
                            tokens.append(resp.token)
                            if after_ack:
                                violations.append(f"round {rnd} auth {idx}: token issued for old password after ack")
                        elif (code, resp) != (
                            "INVALID_ARGUMENT",
                            "etcdserver: authentication failed, invalid user ID or password",
                        ):
                            unexpected.append(f"round {rnd} auth {idx}: {code} {resp!r}")
                            return
                    if after_ack:
                        post += 1
                    if first:
                        first = False
                        started.wait(timeout=ROUND_TIMEOUT)

            threads = [threading.Thread(target=_guard(auth_loop, unexpected), args=(s, i)) for i, s in enumerate(auths)]
            for t in threads:
                t.start()
            started.wait(timeout=ROUND_TIMEOUT)
            admin.auth.UserChangePassword(
                rpc_pb2.AuthUserChangePasswordRequest(name="racer", password=new_pw), metadata=admin.md, timeout=10
            )
            ack.append(time.monotonic())
            for t in threads:
                t.join(timeout=ROUND_TIMEOUT + 10)
            assert not any(t.is_alive() for t in threads), "authenticator hung"
            assert not unexpected, unexpected[:5]
            assert not violations, violations[:5]
            # Every token issued for the old password must be dead now.
            probe = Stubs(srv.target)
            try:
                for tok in tokens:
                    probe.token = tok
                    code, detail = outcome(
                        probe.kv.Range, rpc_pb2.RangeRequest(key=b"race/x"), metadata=probe.md, timeout=10
                    )
                    if code == "OK":
                        violations.append(f"round {rnd}: a token issued for the old password still works")
                    elif (code, detail) not in {("UNAUTHENTICATED", "etcdserver: invalid auth token")} | OLD_REVISION:
                        unexpected.append(f"round {rnd}: old token probe {code} {detail!r}")
            finally:
                probe.close()
            issued_for_old += len(tokens)
            assert not unexpected, unexpected[:5]
            assert not violations, violations[:5]
            fresh = Stubs(srv.target)
            try:
                fresh.login("racer", new_pw)
                put = outcome(
                    fresh.kv.Put, rpc_pb2.PutRequest(key=b"race/ok", value=b"v"), metadata=fresh.md, timeout=10
                )
                assert put[0] == "OK", put
            finally:
                fresh.close()
        assert issued_for_old >= ROUNDS, issued_for_old
    finally:
        for s in auths:
            s.close()
        admin.close()
