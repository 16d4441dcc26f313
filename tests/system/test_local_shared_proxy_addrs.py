"""`raftgate local` starts several proxies (the client proxy and one member proxy per node): a
RAFTGATE_PROXY_* variable that sets a listen address would give all of them the same port, so
every proxy but one fails. local refuses it before starting anything, naming the variable, as it
does for RAFTGATE_STORE_METRICS_ADDR.

Finding: a RAFTGATE_PROXY_* listen address gave every proxy of `raftgate local` the same port
(failed before the fix).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, free_port


@pytest.mark.parametrize("var", ["RAFTGATE_PROXY_METRICS_ADDR", "RAFTGATE_PROXY_HEALTH_ADDR",
                                 "RAFTGATE_PROXY_LISTEN_GATEWAY_URLS"])
def test_local_refuses_one_proxy_address_for_every_proxy(tmp_path: Path, var: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "RAFTGATE_"))}
    env[var] = f"http://127.0.0.1:{free_port()}" if var.endswith("_URLS") else f"127.0.0.1:{free_port()}"
    data_dir = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(data_dir), "--nodes", "1",
                             "--client-port", str(free_port())], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"raftgate local started with {var} set:\n{out[-2000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 2, out[-2000:]
    assert var in out and "Traceback" not in out, out[-2000:]
    assert "raftgate store:" not in out and "raftgate proxy:" not in out, out[-2000:]
