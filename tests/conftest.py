"""Shared fixtures: servers under test (`raftgate local`, a real etcd 3.5.1) and their lifecycle.

Fixtures only: the helpers they use live in tests/support/processes.py, which tests import
(no test imports this file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.processes import (
    BACKENDS,
    EtcdServer,
    RaftgateLocal,
    join_background_stops,
    new_server,
    skip_unless_available,
    stop_in_background,
)

#: Raft timing for every store a test starts (read by `raftgate store` from its environment, also
#: through `raftgate local`): half of etcd's defaults (100 ms heartbeats, 1 s election timeout),
#: so each 3-node cluster elects its first leader, and survivors replace a killed one, about half a
#: second sooner (hundreds of cluster starts and kills in the suite). The same ten heartbeats per
#: election timeout, so a busy machine misses no more heartbeats than with the defaults. A module
#: about the default timing itself (etcd's request timeout, the lease TTL floor, failover lease
#: extension) opts out with ``pytestmark = pytest.mark.default_raft_timing``.
TEST_RAFT_TIMING = {"RAFTGATE_STORE_HEARTBEAT_INTERVAL": "50", "RAFTGATE_STORE_ELECTION_TIMEOUT": "500"}
#: in-process tests (no store process), where these variables would only reach config parsing
_IN_PROCESS = ("unit", "raft")


@pytest.fixture(autouse=True, scope="module")
def _test_raft_timing(request: pytest.FixtureRequest) -> Iterator[None]:
    """Module scope and autouse: set before any module-scoped server fixture starts a store."""
    path = Path(str(request.node.path))
    if request.node.get_closest_marker("default_raft_timing") or path.parent.name in _IN_PROCESS:
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        for name, value in TEST_RAFT_TIMING.items():
            if name not in os.environ:  # a value given from outside wins (e.g. to run with the defaults)
                mp.setenv(name, value)
        yield


@pytest.fixture(autouse=True, scope="session")
def _background_stops_joined() -> Iterator[None]:
    """Every server a teardown stopped in the background is gone before the session ends."""
    yield
    join_background_stops()


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
    stop_in_background(started)  # nothing looks at the stop: the next test starts meanwhile


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Run the test once against real etcd 3.5.1 and once against raftgate."""
    skip_unless_available(request.param)
    return str(request.param)


@pytest.fixture
def fresh(backend: str, start_server: Callable[..., EtcdServer | RaftgateLocal]) -> EtcdServer | RaftgateLocal:
    """A freshly started server of the current backend (function scope: for revision-sensitive scenarios)."""
    return start_server(backend)
