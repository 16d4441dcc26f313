"""``--auth-lockout-attempts 0`` turns lockout off (issue 12), also for the locks taken while it
was on: the operator's way out when a name that matters (root, with no other root-role user and
no live token) is kept locked by someone guessing is to restart the store with lockout off. Before
the fix the proxy found the password right but apply still refused the login with the
wrong-password answer until the lock's duration (up to a year) ran out."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import Program, free_port, proxy_program, stop_together, store_program, wait_serving

pytestmark = pytest.mark.slow

AUTH_FAILED = (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")
OK = (grpc.StatusCode.OK, "")


def login(auth: rpc_pb2_grpc.AuthStub, name: str, password: str) -> tuple[grpc.StatusCode, str]:
    try:
        auth.Authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password), timeout=30)
    except grpc.RpcError as e:
        return e.code(), e.details()
    return OK


def test_restarting_the_store_with_lockout_off_lifts_a_lock_taken_while_it_was_on(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path, "--auth-lockout-attempts", "2", "--auth-lockout-duration", "8000h")
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}")
    started: list[Program] = []
    try:
        store.start()
        started.append(store)
        proxy.start()
        started.append(proxy)
        wait_serving(f"http://127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            auth = rpc_pb2_grpc.AuthStub(channel)
            auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password="rootpw"), timeout=30)
            auth.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=30)
            auth.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=30)
            assert login(auth, "root", "guess1") == AUTH_FAILED
            assert login(auth, "root", "guess2") == AUTH_FAILED
            assert login(auth, "root", "rootpw") == AUTH_FAILED  # locked
            store.args[store.args.index("--auth-lockout-attempts") + 1] = "0"
            store.restart()
            wait_serving(f"http://127.0.0.1:{port}")
            assert login(auth, "root", "rootpw") == OK
    finally:
        stop_together(started)
