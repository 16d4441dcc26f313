"""``raftgate proxy --workers N``: when the supervisor dies by SIGKILL (the OOM killer, a crash),
its workers must not live on as orphans that keep the client port (a restarted proxy would then
fail with "port in use", and the orphans serve with nobody supervising them or serving their
metrics): each worker stops when its supervisor is gone.

Finding: workers orphaned by a SIGKILLed supervisor kept serving the client port (failed before the
fix).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from pathlib import Path

import pytest

from tests.support.processes import free_port, proxy_program, wait_for

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "zombie" in status


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """No store is needed: a worker serves its port before it reaches one."""
    proxy = proxy_program(tmp_path, f"127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}",
                          "--workers", "2")
    pids: list[int] = []
    try:
        proxy.start()
        ready = next(line for line in proxy.lines if "2 worker processes: pids" in line)
        pids = [int(p) for p in re.search(r"pids ([0-9, ]+)\)", ready).group(1).split(", ")]  # type: ignore[union-attr]
        assert proxy.proc is not None
        os.kill(proxy.proc.pid, signal.SIGKILL)  # the supervisor only, not its process group
        proxy.proc.wait(timeout=10)
        wait_for(lambda: all(_gone(pid) for pid in pids), 30, "the orphaned workers to stop")
    finally:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proxy.stop()
