"""Two servers on one port never happen silently (Trust item 14).

gRPC-Python sets SO_REUSEPORT by default, so a second server on a port in use would share it
instead of failing. Every raftgate server turns that off, and a port in use stops start-up with
a clear message; ``raftgate local`` chooses distinct ports and refuses a layout with duplicates;
the test helpers never hand out a port twice, nor one the kernel may hand out to another socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate import local
from tests.support.processes import (
    REPO_ROOT,
    SECRET,
    Program,
    RaftgateLocal,
    free_port,
    proxy_program,
    secret_file,
    stop_together,
    store_program,
    wait_for,
    wait_serving,
)
from tests.support.store_args import _store_args


def _program(tmp_path: Path, which: str, port: int) -> Program:
    """The program whose `which` listener is asked to use `port`."""
    if which == "proxy client":
        secret = tmp_path / "secret"
        secret.write_text(SECRET)
        return Program(tmp_path / "p", ["proxy", "--listen-client-urls", f"http://127.0.0.1:{port}",
                                         "--store-endpoints", f"127.0.0.1:{free_port()}",
                                         "--internal-secret-file", str(secret)], "raftgate proxy:")
    internal = port if which == "store internal" else free_port()
    peer = port if which == "store peer" else free_port()
    extra = ("--health-addr", f"127.0.0.1:{port}") if which == "store health" else ()
    return Program(tmp_path / "s", _store_args(tmp_path, internal=internal, peer=peer, extra=extra),
                    "raftgate store:")


@pytest.fixture(params=["plain", "reuseport"])
def held_port(request: pytest.FixtureRequest) -> Iterator[int]:
    """A port another process listens on: a plain socket, or one that allows sharing as gRPC's do."""
    with socket.socket() as s:
        if request.param == "reuseport":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("which", ["store internal", "store peer", "store health", "proxy client"])
def test_a_port_in_use_stops_start_up_with_a_clear_message(tmp_path: Path, which: str, held_port: int) -> None:
    program = _program(tmp_path, which, held_port)
    try:
        with pytest.raises(RuntimeError, match="exited with 1 before ready"):
            program.start(timeout=60)
    finally:
        program.stop()
    out = program.output()
    assert f"127.0.0.1:{held_port}" in out and "in use" in out, out
    assert "Traceback" not in out, out


class _ReusingKernel:
    """A stand-in for socket.socket whose bind to port 0 gives the lowest port no open socket holds:
    a port freed a moment ago comes straight back, as the kernel may do."""

    def __init__(self) -> None:
        self.held: set[int] = set()

    def __call__(self, *args: object, **kwargs: object) -> _ReusingKernel._Socket:
        return _ReusingKernel._Socket(self)

    class _Socket:
        def __init__(self, kernel: _ReusingKernel) -> None:
            self.kernel = kernel
            self.port = 0

        def setsockopt(self, *args: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            assert address[1] == 0
            self.port = min(p for p in range(40000, 40100) if p not in self.kernel.held)
            self.kernel.held.add(self.port)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

        def close(self) -> None:
            self.kernel.held.discard(self.port)

        def __enter__(self) -> _ReusingKernel._Socket:
            return self

        def __exit__(self, *exc: object) -> None:
            self.close()


def test_raftgate_local_chooses_distinct_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local.socket, "socket", _ReusingKernel())
    layout = local._layout(tmp_path, 5)
    ports = [n[k] for n in layout for k in ("peer_port", "internal_port")]
    assert len(set(ports)) == len(ports) == 10, ports


def test_raftgate_local_keeps_new_ports_off_its_metrics_ports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ports of a new layout are kept for good: one that is also a --metrics-addr port would
    make every later start with the same flags refuse (check_ports names the clash)."""
    monkeypatch.setattr(local.socket, "socket", _ReusingKernel())  # hands out 40000, 40001, ...
    config = local.parse(["--nodes", "3", "--metrics-addr", "127.0.0.1:40000"], {})
    metrics = {addr.port for addr in config.metrics_addrs() if addr is not None}
    layout = local._layout(tmp_path, config.nodes, config.client_port, config.gateway_port, reserved=metrics)
    ports = {n[k] for n in layout for k in ("peer_port", "internal_port", "client_port")}
    assert len(ports) == 9 and not ports & metrics, (sorted(ports), sorted(metrics))


def _run_local(data_dir: Path, client_port: int) -> tuple[int, str]:
    """`raftgate local` expected to refuse at once; its exit code and stderr (its group is always torn down)."""
    proc = subprocess.Popen([sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(data_dir), "--nodes", "3",
                             "--client-port", str(client_port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, err


@pytest.mark.parametrize("clash", ["two nodes", "the client port"])
def test_raftgate_local_refuses_a_layout_with_duplicate_ports(tmp_path: Path, clash: str) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    ports = [free_port() for _ in range(6)]
    client = free_port()
    if clash == "two nodes":
        ports[3] = ports[0]  # node2's internal port is node1's peer port
        dup = ports[0]
    else:
        client = dup = ports[5]
    layout = [{"name": f"node{i + 1}", "data_dir": str(data_dir / f"node{i + 1}"), "peer_port": ports[2 * i],
               "internal_port": ports[2 * i + 1]} for i in range(3)]
    (data_dir / "layout.json").write_text(json.dumps(layout))
    code, err = _run_local(data_dir, client)
    assert code != 0
    assert "layout.json" in err and str(dup) in err, err
    assert not (data_dir / "node1").exists()  # refused before any node started


def test_test_ports_come_from_outside_the_kernels_ephemeral_range() -> None:
    """The kernel hands ephemeral ports to `raftgate local`'s own choices and to outgoing connections:
    a port the helpers give a test must not be one of them."""
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    assert all(not low <= p <= high for p in ports), ports


@pytest.mark.parametrize("nodes", [1, 3, None])
def test_a_test_s_raftgate_local_runs_its_nodes_on_ports_from_the_helpers(tmp_path: Path, nodes: int | None) -> None:
    """Tests kill nodes of `raftgate local` and restart them on the ports of its layout; a port
    `raftgate local` chose itself (a bind to 0, from the kernel's ephemeral range) can meanwhile
    become an outgoing connection's source port (found as tests/faults/test_leader_kill.py's
    restart failing: "cannot listen on 127.0.0.1:37019: the port is in use"). So the helper writes
    the layout of a new data dir from its own ports when asked (``local_cluster``, whose nodes a
    test kills and restarts), as `raftgate local` keeps a layout it finds."""
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    rl = RaftgateLocal(tmp_path, extra_args=[] if nodes is None else ["--nodes", str(nodes)], own_ports=True)
    rl.command()
    layout = json.loads((rl.data_dir / "layout.json").read_text())
    ports = [n[k] for n in layout for k in ("peer_port", "internal_port", "client_port")]
    want = 3 if nodes is None else nodes  # raftgate local's default
    assert len(layout) == want and len(set(ports)) == 3 * want, layout
    assert all(not low <= p <= high for p in ports), ports


def test_two_test_processes_never_get_the_same_port() -> None:
    mine = {free_port() for _ in range(30)}
    code = "from tests.support.processes import free_port; " \
           "print(' '.join(str(free_port()) for _ in range(30)))"
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            cwd=REPO_ROOT, check=True).stdout.split()
    assert len(theirs) == 30 and not mine & {int(p) for p in theirs}


# Found by the attack on gRPC's I/O on its poller thread (issue 22, round 10); each failed with gRPC's
# default I/O as well: gRPC binds what a name resolves to and takes over socket files.
FINDINGS_WAIT = 60.0


def _put_get(target: str, value: bytes) -> bytes | str:
    channel = grpc.insecure_channel(target)
    kv = rpc_pb2_grpc.KVStub(channel)
    try:
        kv.Put(rpc_pb2.PutRequest(key=b"k", value=value), timeout=10)
        return kv.Range(rpc_pb2.RangeRequest(key=b"k"), timeout=10).kvs[0].value
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    finally:
        channel.close()


@pytest.mark.slow
def test_a_second_proxy_on_a_unix_socket_in_use_fails_to_start(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path)
    sock = tmp_path / "client.sock"
    first = proxy_program(tmp_path, internal, f"unix://{sock}", name="first")
    second = proxy_program(tmp_path, internal, f"unix://{sock}", name="second")
    try:
        store.start()
        first.start()
        wait_for(lambda: _put_get(f"unix://{sock}", b"first") == b"first", FINDINGS_WAIT, "the first proxy to serve")
        with pytest.raises(RuntimeError, match="exited with 1 before ready"):
            second.start(timeout=FINDINGS_WAIT)
        assert "in use" in second.output(), second.output()
    finally:
        second.stop()
        served = _put_get(f"unix://{sock}", b"still")
        stop_together([first, store])
    assert served == b"still", f"the first proxy lost its socket: {served}"


@pytest.mark.slow
@pytest.mark.parametrize("held_on", ["127.0.0.1", "::1"])
@pytest.mark.parametrize("program", ["proxy", "proxy --workers 2", "store"])
def test_a_localhost_listener_with_one_of_its_addresses_in_use_fails_to_start(tmp_path: Path, program: str,
                                                                            held_on: str) -> None:
    """gRPC binds every address ``localhost`` resolves to and is content with one; a --workers
    supervisor checked one address only. Either address held by another server: refused."""
    port = free_port()
    with socket.socket(socket.AF_INET6 if ":" in held_on else socket.AF_INET) as held:
        held.bind((held_on, port))
        held.listen()
        if program.startswith("proxy"):
            started = proxy_program(tmp_path, f"127.0.0.1:{free_port()}", f"http://localhost:{port}",
                                    *program.split()[1:])
        else:
            started, _ = store_program(tmp_path, "--listen-internal-urls", f"http://localhost:{port}")
        try:
            with pytest.raises(RuntimeError, match="exited with 1 before ready"):
                started.start(timeout=FINDINGS_WAIT)
        finally:
            started.stop()
    assert "in use" in started.output(), started.output()


@pytest.mark.slow
def test_the_store_listens_on_an_ipv6_loopback_url(tmp_path: Path) -> None:
    secret = secret_file(tmp_path)
    internal, peer = free_port(), free_port()
    store = Program(tmp_path / "store", [
        "store", "--name", "s1", "--data-dir", str(tmp_path / "data"),
        "--listen-internal-urls", f"http://[::1]:{internal}", "--internal-secret-file", str(secret),
        "--listen-peer-urls", f"http://[::1]:{peer}", "--initial-advertise-peer-urls", f"http://[::1]:{peer}",
        "--peer-secret-file", str(secret)], "raftgate store:")
    client = free_port()
    proxy = proxy_program(tmp_path, f"[::1]:{internal}", f"http://127.0.0.1:{client}")
    try:
        store.start(timeout=FINDINGS_WAIT)
        proxy.start()
        wait_serving(f"127.0.0.1:{client}")
        assert _put_get(f"127.0.0.1:{client}", b"v6") == b"v6"
    finally:
        stop_together([proxy, store])


@pytest.mark.slow
def test_a_socket_file_nobody_listens_on_is_taken_over(tmp_path: Path) -> None:
    """What a killed server leaves behind is no server: the proxy replaces the file and serves."""
    sock = tmp_path / "client.sock"
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(sock))  # a socket file, never listened on and closed: as a killed server leaves it
    store, internal = store_program(tmp_path)
    proxy = proxy_program(tmp_path, internal, f"unix://{sock}")
    try:
        store.start()
        proxy.start()
        assert _put_get(f"unix://{sock}", b"taken over") == b"taken over"
    finally:
        stop_together([proxy, store])
