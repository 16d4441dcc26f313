"""Shared fixtures: servers under test (`raftgate local`, a real etcd 3.5.1) and their lifecycle."""

from __future__ import annotations

import atexit
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import EtcdServer, RaftgateLocal

BACKENDS = ("etcd", "raftgate")

#: Every server any fixture started; stopped at the latest when the session ends, whatever happened.
_all_servers: list[EtcdServer | RaftgateLocal] = []


def _stop_all() -> None:
    for server in _all_servers:
        with contextlib.suppress(Exception):
            server.stop(timeout=5)


atexit.register(_stop_all)


def skip_unless_available(kind: str) -> None:
    if kind == "etcd" and not EtcdServer.available():
        pytest.skip("real etcd binary not installed")
    if kind == "raftgate" and not RaftgateLocal.available():
        pytest.skip("raftgate local is not implemented yet (raftgate/cli.py missing)")


def new_server(kind: str, workdir: Path, **kw: object) -> EtcdServer | RaftgateLocal:
    """Build (not start) a server of `kind`; kw: auth_token, auth_token_ttl (raftgate), extra_args."""
    skip_unless_available(kind)
    if kind == "etcd":
        extra = list(kw.pop("extra_args", ()))  # type: ignore[call-overload]
        if kw.get("auth_token") is not None:
            extra.append(f"--auth-token={kw.pop('auth_token')}")
        kw.pop("auth_token", None)
        if kw.get("auth_token_ttl") is not None:
            extra.append(f"--auth-token-ttl={kw.pop('auth_token_ttl')}")
        kw.pop("auth_token_ttl", None)
        server: EtcdServer | RaftgateLocal = EtcdServer(workdir, extra_args=extra, **kw)  # type: ignore[arg-type]
    else:
        server = RaftgateLocal(workdir, **kw)  # type: ignore[arg-type]
    _all_servers.append(server)
    return server


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., EtcdServer | RaftgateLocal]]:
    """Factory: start_server(kind, **kw) -> a started server, stopped at the end of the test."""
    started: list[EtcdServer | RaftgateLocal] = []

    def _start(kind: str, **kw: object) -> EtcdServer | RaftgateLocal:
        server = new_server(kind, tmp_path / f"{kind}{len(started)}", **kw)
        started.append(server)
        server.start()
        return server

    yield _start
    for server in started:
        server.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Run the test once against real etcd 3.5.1 and once against raftgate."""
    skip_unless_available(request.param)
    return str(request.param)


@pytest.fixture
def fresh(backend: str, start_server: Callable[..., EtcdServer | RaftgateLocal]) -> EtcdServer | RaftgateLocal:
    """A freshly started server of the current backend (function scope: for revision-sensitive scenarios)."""
    return start_server(backend)
