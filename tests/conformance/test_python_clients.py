"""Python etcd clients (python-etcd3 0.12, etcd3aio) against real etcd 3.5.1 and raftgate.

The client code runs in subprocesses (tests/clients/*.py): both packages ship their own copies of
etcd's protos, which must never be imported into the pytest process next to raftgate's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ctl_steps import ROOT, Ctl, setup_auth
from tests.support.processes import (
    BACKENDS,
    EtcdServer,
    RaftgateLocal,
    client_script_env,
    new_server,
    skip_unless_available,
)

CLIENTS = Path(__file__).resolve().parent.parent / "clients"
Server = EtcdServer | RaftgateLocal

USER_EMPTY = {"error": {"code": "INVALID_ARGUMENT", "details": "etcdserver: user name is empty"}}
AUTH_FAILED = {
    "error": {"code": "INVALID_ARGUMENT", "details": "etcdserver: authentication failed, invalid user ID or password"}
}
BAD_TOKEN = {"error": {"code": "UNAUTHENTICATED", "details": "etcdserver: invalid auth token"}}
DENIED = {"error": {"code": "PERMISSION_DENIED", "details": "etcdserver: permission denied"}}
OK_NONE = {"ok": None}


def run_client(script: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(CLIENTS / script), *args],
        capture_output=True,
        text=True,
        env=client_script_env(),
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout)


def grant_cli_prefix(ctl: Ctl) -> None:
    ctl("role", "add", "cli-r", user=ROOT, out="Role cli-r created\n")
    ctl("role", "grant-permission", "cli-r", "readwrite", "/cli/", "--prefix", user=ROOT, out="Role cli-r updated\n")
    ctl("user", "grant-role", "test-user", "cli-r", user=ROOT, out="Role cli-r is granted to user test-user\n")


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    skip_unless_available(request.param)
    srv = new_server(request.param, tmp_path_factory.mktemp(f"clients-{request.param}"))
    srv.start()
    ctl = Ctl(srv.endpoint, request.param)
    setup_auth(ctl)
    grant_cli_prefix(ctl)
    yield request.param, srv
    srv.stop()


def check(results: dict[str, Any], expected: dict[str, Any]) -> None:
    diffs = {k: {"got": results.get(k), "want": v} for k, v in expected.items() if results.get(k) != v}
    assert not diffs, json.dumps(diffs, indent=1, sort_keys=True)
    assert set(results) == set(expected), set(results) ^ set(expected)


def test_python_etcd3(server: tuple[str, Server]) -> None:
    _, srv = server
    results = run_client("etcd3_client.py", srv.target)
    check(
        results,
        {
            "anon_get": USER_EMPTY,
            "anon_put": USER_EMPTY,
            "bad_password": AUTH_FAILED,
            "unknown_user": AUTH_FAILED,
            "bogus_token_get": BAD_TOKEN,
            "login": {"ok": True},
            "put_a": OK_NONE,
            "put_b": OK_NONE,
            "get_a": {"ok": "1"},
            "get_missing": OK_NONE,
            "get_prefix": {"ok": [["/cli/e3/a", "1"], ["/cli/e3/b", "2"]]},
            "put_denied": DENIED,
            "get_denied": DENIED,
            "prefix_denied": DENIED,
            "txn_success": {"ok": True},
            "txn_failure_branch": {"ok": False},
            "txn_denied_compare": DENIED,
            "txn_denied_unused_branch": DENIED,
            "get_c": {"ok": "3"},
            "get_d": OK_NONE,
            "delete_b": {"ok": True},
            "delete_denied": DENIED,
            "root_put": OK_NONE,
            "root_get": {"ok": "root"},
            "root_status_version": {"ok": True},
        },
    )


def test_etcd3aio(server: tuple[str, Server]) -> None:
    backend, srv = server
    results = run_client("etcd3aio_client.py", srv.target, "basic")
    expected = {
        "anon_get": USER_EMPTY,
        "anon_auth_status": {"ok": True},  # 3.7: AuthStatus is open
        "bad_password": AUTH_FAILED,
        "unknown_user": AUTH_FAILED,
        "bogus_token_get": BAD_TOKEN,
        "put_a": OK_NONE,
        "put_b": {"ok": False},
        "get_a": {"ok": [["/cli/aio/a", "1"]]},
        "get_prefix": {"ok": [["/cli/aio/a", "1"], ["/cli/aio/b", "2"]]},
        "get_from_key_denied": DENIED,
        "put_denied": DENIED,
        "get_denied": DENIED,
        "delete_range_denied": DENIED,
        "txn_success": {"ok": True},
        "txn_denied_failure_branch": DENIED,
        "get_d": {"ok": []},
        "delete_b": {"ok": 1},
        "user_list_denied": DENIED,
        "user_get_self": {"ok": ["cli-r", "test-role"]},
        "status": {"ok": True},  # 3.7: any authenticated user
        "defrag_denied": DENIED,
        "auth_status": {"ok": True},
        "compact_denied": DENIED,  # 3.7: root only
        "lease_grant": {"ok": 60},
        "root_user_list_has_test_user": {"ok": True},
        "root_get_prefix": {"ok": [["/cli/aio/a", "1"], ["/cli/aio/c", "3"]]},
    }
    if backend == "etcd":  # where real etcd 3.5.1 differs from 3.7.1
        expected.update(
            {
                "anon_auth_status": USER_EMPTY,
                "auth_status": DENIED,
                "defrag_denied": {"error": {"code": "UNKNOWN", "details": "auth: permission denied"}},
                "compact_denied": OK_NONE,
            }
        )
    check(results, expected)


@pytest.mark.slow
def test_simple_token_sliding_ttl(backend: str, start_server: Callable[..., Server]) -> None:
    """--auth-token-ttl 2: a token used more often than the TTL stays valid; idle > TTL -> invalid."""
    srv = start_server(backend, auth_token="simple", auth_token_ttl=2)
    ctl = Ctl(srv.endpoint, backend)
    setup_auth(ctl)
    grant_cli_prefix(ctl)
    results = run_client("etcd3aio_client.py", srv.target, "ttl", "2")
    assert results["active_uses_ok"], results
    assert results["active_uses"] >= 6, results
    assert results["after_idle"] == BAD_TOKEN, results
    assert results["after_reauth"] == OK_NONE, results
