"""Paths the system refuses (a name too long, a parent that is a file): a message naming the
flag and a non-zero exit, not a Python traceback.

Finding: a path the system refuses ended `raftgate local` and `raftgate proxy` with a traceback
(failed before the fix).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy import config as proxy_config
from raftgate.config_support import ConfigError
from tests.support.processes import REPO_ROOT, free_port


def test_local_names_a_data_dir_it_cannot_make(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    for data_dir in (tmp_path / "file" / "data", tmp_path / ("d" * 300)):
        proc = subprocess.run([sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(data_dir),
                               "--nodes", "1", "--client-port", str(free_port())],
                              capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, stdin=subprocess.DEVNULL)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("raftgate local: --data-dir"), proc.stderr


@pytest.mark.parametrize("flag", ["--identity-file", "--identity-jwt-file"])
def test_proxy_names_an_identity_file_whose_name_is_too_long(tmp_path: Path, flag: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123")
    argv = ["--store-endpoints", "127.0.0.1:1", "--internal-secret-file", str(secret), flag, "x" * 300]
    if flag == "--identity-jwt-file":
        argv += ["--auth-token", "jwt,sign-method=HS256,priv-key=" + str(secret)]
    with pytest.raises(ConfigError, match=f"^{flag}: "):
        proxy_config.load(argv, {})
