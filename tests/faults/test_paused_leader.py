"""A leader that is paused (SIGSTOP: a stalled VM, a long GC pause, a frozen container) keeps its
TCP connections open, so nothing tells the proxy it is gone. A request already sent to it must
still get etcd's answer at etcd's request timeout (5 s + 2 election timeouts, 7 s by default):
`etcdserver: request timed out, possibly due to previous leader failure`, not silence until the
client's own deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import Client, describe, program_cluster, retry_ok

pytestmark = [pytest.mark.slow, pytest.mark.default_raft_timing]  # about the default timing

#: etcd's request timeout with default flags (5 s + 2 x 1 s election timeout)
ETCD_REQUEST_TIMEOUT = 7.0
#: a fail-safe only: the test is that etcd's error arrives, not how fast
SLACK = 8.0
#: the client's own deadline, far beyond etcd's request timeout
CLIENT_DEADLINE = 60.0


def test_a_write_to_a_paused_leader_gets_etcds_timeout(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3) as cluster:
        client = Client(cluster.endpoint)
        paused: int | None = None
        try:
            retry_ok(lambda: client.put(b"/warm", b"up", timeout=10), 30, "a first write")
            leader = cluster.leader()
            assert leader.program is not None and leader.program.proc is not None
            paused = os.getpgid(leader.program.proc.pid)
            os.killpg(paused, signal.SIGSTOP)
            sent = time.monotonic()
            try:
                client.put(b"/during-pause", b"x", timeout=CLIENT_DEADLINE)
                answer = "OK"
            except grpc.RpcError as exc:
                answer = describe(exc)
            took = time.monotonic() - sent
            print(f"\nwrite to a paused leader answered after {took:.2f}s: {answer}")
            assert answer == "UNAVAILABLE: etcdserver: request timed out, possibly due to previous leader failure"
            assert took < ETCD_REQUEST_TIMEOUT + SLACK, f"answered only after {took:.1f}s"
            # the others elected a leader meanwhile: writes go on
            retry_ok(lambda: client.put(b"/after-pause", b"y", timeout=10), 30, "a write after the pause")
        finally:
            if paused is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(paused, signal.SIGCONT)
            client.close()
