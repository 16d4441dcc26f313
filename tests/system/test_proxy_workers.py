"""``raftgate local --proxy-workers 2`` (``raftgate proxy --workers 2``): two proxy processes on one
client port, each serving; a stop ends them all cleanly."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.processes import RaftgateLocal


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` holds a listening socket on (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


@pytest.mark.slow
def test_two_workers_serve_one_port_and_stop_cleanly(tmp_path: Path) -> None:
    rg = RaftgateLocal(tmp_path, extra_args=["--nodes", "1", "--proxy-workers", "2"])
    with rg:
        ready = next(line for line in rg.lines if "2 worker processes: pids" in line)
        pids = [int(p) for p in re.search(r"pids ([0-9, ]+)\)", ready).group(1).split(", ")]  # type: ignore[union-attr]
        assert len(set(pids)) == 2
        for pid in pids:  # each worker holds its own listening socket on the one client port
            assert rg.port in _listening_ports(pid), pid
        for i in range(6):  # each etcdctl is a new connection; the kernel spreads them over the workers
            rc, _, err = rg.ctl("put", f"/w/{i}", "v")
            assert rc == 0, err
        rc, out, err = rg.ctl("get", "/w/", "--prefix", "--keys-only")
        assert rc == 0 and out.split() == [f"/w/{i}" for i in range(6)], err
        code = rg.stop()
    assert code == 0, rg.output()[-3000:]
    assert " ERROR " not in rg.output(), rg.output()[-3000:]
    assert "raftgate local: proxy exited with code 0" in rg.output()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid
