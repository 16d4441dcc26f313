"""`raftgate local` passes its environment to its children, RAFTGATE_EVENT_LOOP included: an unknown
loop is refused by local itself before it creates or starts anything (exit 2, the variable named
once, no traceback), as the store and the proxy refuse it.

Finding (attack on the uvloop change): local made its data directory, its secret and its layout,
started the store, and exited 1 with "store node1 exited with code 2 before it was ready"
(failed before the fix).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import REPO_ROOT, free_port


def test_local_refuses_an_unknown_event_loop_before_starting_anything(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "RAFTGATE_"))}
    env["RAFTGATE_EVENT_LOOP"] = "tokio"
    data_dir = tmp_path / "data"
    done = subprocess.run([sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(data_dir), "--nodes", "1",
                           "--client-port", str(free_port())], capture_output=True, text=True, cwd=REPO_ROOT,
                          stdin=subprocess.DEVNULL, env=env, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-2000:]
    assert "raftgate local: RAFTGATE_EVENT_LOOP: 'tokio' is not one of uvloop, asyncio" in out, out[-2000:]
    assert "Traceback" not in out and "raftgate store:" not in out and "raftgate proxy:" not in out, out[-2000:]
    assert not data_dir.exists()
