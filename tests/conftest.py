"""Shared fixtures: servers under test (`raftgate local`, a real etcd 3.5.1) and their lifecycle.

Fixtures only: the helpers they use live in tests/support/processes.py, which tests import
(no test imports this file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.processes import BACKENDS, EtcdServer, RaftgateLocal, new_server, skip_unless_available


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
