"""Trust item 16: a healthy ``raftgate local`` prints no ERROR and no traceback, and every process
it runs exits 0 when it is stopped (SIGTERM to ``raftgate local``, or Ctrl-C: SIGINT to the whole
process group). A store node killed -9 and restarted makes no surviving process print an error
either: a lost peer is an expected event, worth a warning at most.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import local_cluster
from tests.support.processes import REPO_ROOT, RaftgateLocal, wait_for

EXIT_LINE = re.compile(r"^raftgate local: (.+) exited with code (-?\d+)$", re.M)


def _bad_lines(output: str) -> list[str]:
    """Lines a healthy run must not print: errors, criticals and tracebacks."""
    return [line for line in output.splitlines()
            if re.search(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)", line)]


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _use(local: RaftgateLocal) -> None:
    for i in range(3):
        rc, out, err = local.ctl("put", f"k{i}", f"v{i}")
        assert rc == 0 and out.strip() == "OK", (rc, out, err)
    rc, out, err = local.ctl("get", "k", "--prefix")
    assert rc == 0 and out.split() == ["k0", "v0", "k1", "v1", "k2", "v2"], (rc, out, err)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_a_healthy_start_use_and_stop_print_no_error_and_every_process_exits_0(tmp_path: Path, how: str) -> None:
    local = RaftgateLocal(tmp_path)
    try:
        local.start()
        state = local.local_json()
        assert state is not None
        pids = [int(p["pid"]) for p in state["processes"]]  # type: ignore[index,union-attr]
        _use(local)
        assert local.proc is not None
        proc = local.proc
        if how == "sigterm":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        code = proc.wait(timeout=60)
        wait_for(lambda: all(_dead(pid) for pid in pids), 30, "every child to be gone")
    finally:
        local.stop()
    output = local.output()
    assert _bad_lines(output) == [], output
    assert code == 0, output
    exits = dict(EXIT_LINE.findall(output))
    nodes = ("node1", "node2", "node3")  # each store node, and its member proxy (endpoint status --cluster)
    assert exits == {**{f"store {n}": "0" for n in nodes}, **{f"proxy {n}": "0" for n in nodes}, "proxy": "0"}, output


@pytest.mark.slow
def test_a_store_killed_and_restarted_makes_no_survivor_print_an_error(tmp_path: Path) -> None:
    with local_cluster(tmp_path, nodes=3) as cluster:
        local: RaftgateLocal = cluster.local  # type: ignore[attr-defined]
        _use(local)
        victim = cluster.leader()
        cluster.kill(victim)
        wait_for(lambda: local.ctl("put", "after-kill", "1")[0] == 0, 60, "a write without the killed node")
        cluster.restart(victim)
        cluster.wait_converged()
        wait_for(lambda: local.ctl("put", "after-restart", "1")[0] == 0, 60, "a write after the restart")
        assert victim.program is not None
        restarted = victim.program
        cluster.close()
        assert restarted.last_exit_code == 0, restarted.output()
        assert _bad_lines(restarted.output()) == [], restarted.output()
        assert local.proc is not None
        proc = local.proc
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    output = local.output()
    assert _bad_lines(output) == [], output
    exits = dict(EXIT_LINE.findall(output))
    assert exits.pop(f"store {victim.name}") == "-9", output
    assert set(exits.values()) == {"0"}, output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_a_program_starts_ends_it_quietly(sig: signal.Signals) -> None:
    """A signal that arrives before the program set up its graceful stop (while it imports and
    starts) ends it with the shell's code for the signal and nothing on stderr: no traceback, no -15."""
    code = ("import os, signal, sys\n"
            "import authstore.main, raftgate.cli\n"
            "def starting(argv):  # the store, before it set up its own handlers\n"
            f"    os.kill(os.getpid(), {int(sig)})\n"
            "    while True:\n"
            "        signal.pause()\n"
            "authstore.main.main = starting\n"
            "sys.exit(raftgate.cli.main(['store']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=str(REPO_ROOT))
    assert (proc.returncode, proc.stderr) == (128 + sig, "")
