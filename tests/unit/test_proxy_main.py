"""main(argv): exit code 2 on bad config; serves, prints its line, and exits 0 on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.main import main


def test_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    assert main(["--store-endpoints=127.0.0.1:1", f"--internal-secret-file={secret}", "--bcrypt-cost=x"]) == 2
    assert "--bcrypt-cost" in capsys.readouterr().err
    assert main(["--store-endpoints=127.0.0.1:1"]) == 2
    assert "internal credential" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    code = "import sys; from proxy.main import main; sys.exit(main(sys.argv[1:]))"
    args = [
        "--listen-client-urls=http://127.0.0.1:0",
        "--store-endpoints=127.0.0.1:1",
        f"--internal-secret-file={secret}",
        "--bcrypt-cost=4",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("raftgate proxy: serving the etcd v3 API on 127.0.0.1:"), (
            proc.stderr.read() if proc.stderr else ""
        )
        port = int(line.rsplit(":", 1)[1])
        assert port > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
