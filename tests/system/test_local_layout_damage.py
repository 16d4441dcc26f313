"""`raftgate local` with a damaged layout.json (a crash while writing it, a hand edit): a message
naming the file and a non-zero exit, never a Python traceback, and no node started.

Finding: a damaged layout.json ended `raftgate local` with a traceback (failed before the fix).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, free_port

DAMAGED = {
    "empty (cut short while written)": "",
    "half written": '[{"name": "node1", "data_dir": "x", "peer_',
    "not a list": '{"nodes": 1}',
    "a port that is not a number": '[{"name": "node1", "data_dir": "x", "peer_port": "x", "internal_port": 1}]',
    "a node without its ports": '[{"name": "node1"}]',
    "a port out of range": '[{"name": "node1", "data_dir": "x", "peer_port": 70000, "internal_port": 1}]',
}


@pytest.mark.parametrize("what", list(DAMAGED))
def test_a_damaged_layout_is_named_not_a_traceback(tmp_path: Path, what: str) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "layout.json").write_text(DAMAGED[what])
    proc = subprocess.Popen([sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(data_dir), "--nodes", "1",
                             "--client-port", str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode != 0
    assert "Traceback" not in err, err
    assert err.startswith("raftgate local: ") and "layout.json" in err, err
    assert not (data_dir / "node1").exists()
