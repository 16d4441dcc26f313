"""Trust item 16: a healthy ``raftgate local`` prints no ERROR and no traceback, and every process
it runs exits 0 when it is stopped (SIGTERM to ``raftgate local``, or Ctrl-C: SIGINT to the whole
process group). A store node killed -9 and restarted makes no surviving process print an error
either: a lost peer is an expected event, worth a warning at most.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.cluster import local_cluster
from tests.support.processes import REPO_ROOT, RaftgateLocal, wait_for
from tests.support.raw_h2 import RawH2

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


STUCK_WAIT = 60.0


@pytest.mark.slow
@pytest.mark.parametrize("port", ["proxy client", "store internal"])
def test_a_client_that_stops_reading_does_not_get_killed_at_stop(tmp_path: Path, port: str) -> None:
    """A client that stopped reading its socket never answers the PING of a graceful GOAWAY: gRPC
    waited 20 s for it, past ``raftgate local``'s 10 s, which killed the proxy (a proxy that stopped
    reading held its store the same way), until every server bounded that wait
    (raftgate/stop_signals.py ``STOP_PING_TIMEOUT``)."""
    local = RaftgateLocal(tmp_path, extra_args=["--nodes", "1"])
    local.start()
    reader: RawH2 | None = None
    big = rpc_pb2.RangeRequest(key=b"big/", range_end=b"big0")
    try:
        channel = grpc.insecure_channel(local.target)
        kv = rpc_pb2_grpc.KVStub(channel)
        for i in range(8):
            kv.Put(rpc_pb2.PutRequest(key=b"big/%d" % i, value=b"v" * (1 << 20)), timeout=STUCK_WAIT)
        channel.close()
        if port == "proxy client":
            reader = RawH2("127.0.0.1", local.port, rcvbuf=4096)
            reader.handshake()
            reader.call("/etcdserverpb.KV/Range", big.SerializeToString())
        else:
            store = next(p for p in json.loads((local.data_dir / "local.json").read_text())["processes"]
                         if p["role"] == "store")
            reader = RawH2("127.0.0.1", int(store["internal_port"]), rcvbuf=4096)
            reader.handshake()
            secret = (local.data_dir / "internal-secret").read_text().strip().encode()
            reader.call("/raftgate.storepb.Store/Do", ipb.InternalRaftRequest(
                header=ipb.RequestHeader(username="root"), range=big).SerializeToString(), extra=reader.prove(secret))
        wait_for(lambda: reader.pending_at_server() > 0, STUCK_WAIT,  # type: ignore[union-attr]
                 "the server's writes of the Range's answer to wait on the reader")
    finally:
        code = local.stop(timeout=60)
        if reader is not None:
            reader.close()
    out = local.output()
    exits = EXIT_LINE.findall(out)
    assert code == 0 and exits and all(c == "0" for _, c in exits), out[-2000:]
