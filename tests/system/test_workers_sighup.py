"""logrotate's SIGHUP to ``raftgate proxy --workers N --audit-log FILE`` (the pid it knows is the
supervisor's, and ``raftgate local`` passes its SIGHUP on to that pid too): the supervisor must
pass it on to its workers, which reopen their audit logs, and not end the proxy (SIGHUP's
default action) as it did before the fix."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from tests.support.processes import free_port, proxy_program, wait_for

pytestmark = pytest.mark.slow


def test_sighup_to_the_supervisor_reopens_the_workers_audit_logs(tmp_path: Path) -> None:
    """No store is needed: a worker serves its port (and opens its log) before it reaches one."""
    log = tmp_path / "audit.log"
    proxy = proxy_program(tmp_path, f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}",
                          "--workers", "2", "--audit-log", str(log))
    pids: list[int] = []
    try:
        proxy.start()
        ready = next(line for line in proxy.lines if "2 worker processes: pids" in line)
        pids = [int(p) for p in re.search(r"pids ([0-9, ]+)\)", ready).group(1).split(", ")]  # type: ignore[union-attr]
        assert log.exists()
        log.rename(tmp_path / "audit.log.1")
        assert proxy.proc is not None
        os.kill(proxy.proc.pid, signal.SIGHUP)
        wait_for(lambda: log.exists() or proxy.proc is None or proxy.proc.poll() is not None, 30,
                 "the audit log to be reopened")
        assert proxy.proc.poll() is None, proxy.output()[-2000:]
        assert log.exists()
    finally:
        proxy.stop()
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
