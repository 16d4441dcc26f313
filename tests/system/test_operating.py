"""Operating a cluster: etcdctl's `member add` lines start the new member as printed; a removed
member exits; a data dir is used by one process at a time."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from protos.storepb import store_pb2
from raftgate.secret_proof import proving_channel
from tests.support.processes import REPO_ROOT, RaftgateLocal, etcdctl, free_port, store_program, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaftgateLocal]:
    with RaftgateLocal(tmp_path_factory.mktemp("operating") / "cluster") as local:
        yield local


def _store_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "raftgate.cli", "store", *args]


def _spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _env_lines(out: str) -> dict[str, str]:
    """The ``ETCD_X="..."`` lines etcdctl prints, as a shell would read them."""
    found = {}
    for line in out.splitlines():
        name, eq, raw = line.partition("=")
        if eq and re.fullmatch(r"ETCD_[A-Z_]+", name):
            found[name] = shlex.split(raw)[0] if raw else ""
    return found


def _member_started(ep: str, member_hex: str, name: str) -> bool:
    return f"{member_hex}, started, {name}," in etcdctl(ep, "member", "list")[1]


def _do(internal: str, secret: str, req: ipb.InternalRaftRequest) -> store_pb2.InternalResponse:
    with grpc.insecure_channel(internal) as raw:
        do = proving_channel(raw, secret).unary_unary("/raftgate.storepb.Store/Do",
                                                      request_serializer=ipb.InternalRaftRequest.SerializeToString,
                                                      response_deserializer=store_pb2.InternalResponse.FromString)
        return do(req, timeout=10)


def _put_and_get(internal: str, secret: str, key: bytes, value: bytes) -> list[bytes]:
    _do(internal, secret, ipb.InternalRaftRequest(header=ipb.RequestHeader(),
                                                  put=rpc_pb2.PutRequest(key=key, value=value)))
    answer = _do(internal, secret, ipb.InternalRaftRequest(header=ipb.RequestHeader(),
                                                           range=rpc_pb2.RangeRequest(key=key)))
    return [kv.value for kv in answer.range.kvs]


def test_etcdctl_member_add_lines_start_the_new_member(cluster: RaftgateLocal, tmp_path: Path) -> None:
    """The ETCD_* lines `etcdctl member add` prints, used as the environment, make the new member
    join (with only raftgate's own flags and the listen/data flags etcd would also need)."""
    ep = cluster.endpoint
    state = cluster.local_json()
    assert state is not None
    secret_file = Path(state["data_dir"]) / "internal-secret"  # type: ignore[index]
    peer_url = f"http://127.0.0.1:{free_port()}"
    rc, out, err = etcdctl(ep, "member", "add", "node4", f"--peer-urls={peer_url}")
    assert rc == 0, err
    member_hex = re.match(r"Member +([0-9a-f]+) added", out).group(1)  # type: ignore[union-attr]
    printed = _env_lines(out)
    assert set(printed) == {"ETCD_NAME", "ETCD_INITIAL_CLUSTER", "ETCD_INITIAL_ADVERTISE_PEER_URLS",
                            "ETCD_INITIAL_CLUSTER_STATE"}, out
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "RAFTGATE_STORE_"))} | printed
    argv = _store_argv("--data-dir", str(tmp_path / "node4"), "--listen-peer-urls", peer_url,
                       "--listen-internal-urls", f"http://127.0.0.1:{free_port()}",
                       "--internal-secret-file", str(secret_file), "--peer-secret-file", str(secret_file))
    node4 = _spawn(argv, tmp_path / "node4.log", env)
    try:
        wait_for(lambda: node4.poll() is not None or _member_started(ep, member_hex, "node4"), 60,
                 "the new member to join")
        assert node4.poll() is None, (tmp_path / "node4.log").read_text()
        assert _member_started(ep, member_hex, "node4")
        assert etcdctl(ep, "put", "after-join", "yes")[0] == 0
    finally:
        _kill(node4)
        etcdctl(ep, "member", "remove", member_hex)
    assert member_hex not in etcdctl(ep, "member", "list")[1]


def test_removed_member_exits(cluster: RaftgateLocal, tmp_path: Path) -> None:
    """etcd's member exits once its removal is applied; so does raftgate's, with code 0 and a
    last line that says why."""
    ep = cluster.endpoint
    state = cluster.local_json()
    assert state is not None
    stores = [p for p in state["processes"] if p["role"] == "store"]  # type: ignore[index]
    secret_file = Path(state["data_dir"]) / "internal-secret"  # type: ignore[index]
    peer_url = f"http://127.0.0.1:{free_port()}"
    rc, out, err = etcdctl(ep, "member", "add", "node5", f"--peer-urls={peer_url}", "--learner")
    assert rc == 0, err
    member_hex = re.match(r"Member +([0-9a-f]+) added", out).group(1)  # type: ignore[union-attr]
    initial = ",".join(f"{s['name']}=http://127.0.0.1:{s['peer_port']}" for s in stores)
    argv = _store_argv("--name", "node5", "--data-dir", str(tmp_path / "node5"),
                       "--listen-internal-urls", f"http://127.0.0.1:{free_port()}",
                       "--internal-secret-file", str(secret_file), "--listen-peer-urls", peer_url,
                       "--initial-advertise-peer-urls", peer_url, "--peer-secret-file", str(secret_file),
                       "--initial-cluster", f"{initial},node5={peer_url}", "--initial-cluster-state", "existing")
    log = tmp_path / "node5.log"
    node5 = _spawn(argv, log)
    try:
        wait_for(lambda: node5.poll() is not None or _member_started(ep, member_hex, "node5"), 60,
                 "the learner to join")
        assert node5.poll() is None, log.read_text()
        rc, _, err = etcdctl(ep, "member", "remove", member_hex)
        assert rc == 0, err
        try:
            code = node5.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the removed member is still running:\n" + log.read_text()[-2000:])
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert code == 0, lines[-10:]
        assert re.fullmatch(rf"raftgate store: member {member_hex} was removed from the cluster; exiting", lines[-1]), \
            lines[-10:]
        assert etcdctl(ep, "put", "after-remove", "yes")[0] == 0
    finally:
        _kill(node5)


def test_a_store_data_dir_is_used_by_one_process(tmp_path: Path) -> None:
    """A second store on a running node's --data-dir (other ports) exits 1 naming the data dir;
    the first keeps its leadership and serves."""
    first, internal = store_program(tmp_path)
    with first:
        secret = (tmp_path / "internal-secret").read_text()
        assert _put_and_get(internal, secret, b"k", b"before") == [b"before"]
        data_dir = tmp_path / "store-data"
        peer_url = f"http://127.0.0.1:{free_port()}"
        argv = _store_argv("--name", "s1", "--data-dir", str(data_dir),
                           "--listen-internal-urls", f"http://127.0.0.1:{free_port()}",
                           "--internal-secret-file", str(tmp_path / "internal-secret"),
                           "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                           "--peer-secret-file", str(tmp_path / "internal-secret"))
        log = tmp_path / "second.log"
        second = _spawn(argv, log)
        try:
            wait_for(lambda: second.poll() is not None or "ready on" in log.read_text(), 60,
                     "the second store to exit or start")
            assert second.poll() is not None, "the second store started:\n" + log.read_text()
            assert second.returncode == 1, log.read_text()
            last = log.read_text().strip().splitlines()[-1]
            assert last.startswith("raftgate store: ") and str(data_dir) in last and "in use" in last, last
        finally:
            _kill(second)
        assert first.proc is not None and first.proc.poll() is None
        assert _put_and_get(internal, secret, b"k", b"after") == [b"after"]


def test_a_local_data_dir_is_used_by_one_local(tmp_path: Path) -> None:
    """A second `raftgate local` on a running one's --data-dir exits 1 naming the data dir, and
    leaves the first (and its local.json) alone."""
    with RaftgateLocal(tmp_path / "first", extra_args=["--nodes", "1"]) as first:
        before = first.local_json()
        assert before is not None
        argv = [sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(first.data_dir),
                "--client-port", str(free_port()), "--nodes", "1"]
        log = tmp_path / "second.log"
        second = _spawn(argv, log)
        try:
            code = second.wait(timeout=120)
        finally:
            _kill(second)
        assert code == 1, log.read_text()
        last = log.read_text().strip().splitlines()[-1]
        assert last.startswith("raftgate local: ") and str(first.data_dir.resolve()) in last and "in use" in last, \
            log.read_text()
        assert first.local_json() == before
        assert etcdctl(first.endpoint, "put", "still", "serving")[0] == 0
        assert etcdctl(first.endpoint, "get", "still", "--print-value-only")[1] == "serving\n"


# -- `raftgate local` is an operations tool too (issue 15 item 8) ---------------------------------

def _local_argv(data_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(data_dir),
            "--client-port", str(free_port()), "--nodes", "1", *args]


def _clean_env(**more: str) -> dict[str, str]:
    """This environment without any raftgate or etcd variable, plus ``more``."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "RAFTGATE_"))} | more


def _run_local(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    log = tmp_path / "local.log"
    proc = _spawn(_local_argv(tmp_path / "data", *args), log, env)
    try:
        code = proc.wait(timeout=120)
    finally:
        _kill(proc)
    return code, log.read_text()


@pytest.mark.parametrize("args, env, names", [
    (["--auth-token-ttl", "x"], {}, "--auth-token-ttl"),
    (["--auth-token-ttl", "0"], {}, "--auth-token-ttl"),
    (["--auth-token-ttl=-5"], {}, "--auth-token-ttl"),
    (["--max-request-bytes", "0"], {}, "--max-request-bytes"),
    (["--auth-token", "jwt,sign-method=XX"], {}, "--auth-token"),
    (["--initial-root-password-file", "/nonexistent/pw"], {}, "--initial-root-password-file"),
    ([], {"RAFTGATE_PROXY_BCRYPT_WORKERS": "0"}, "RAFTGATE_PROXY_BCRYPT_WORKERS"),
    ([], {"RAFTGATE_STORE_SNAPSHOT_COUNT": "many"}, "RAFTGATE_STORE_SNAPSHOT_COUNT"),
    ([], {"ETCD_HEARTBEAT_INTERVAL": "0"}, "ETCD_HEARTBEAT_INTERVAL"),
    (["--client-port", "70000"], {}, "--client-port"),
])
def test_local_checks_every_value_before_it_starts_anything(tmp_path: Path, args: list[str], env: dict[str, str],
                                                             names: str) -> None:
    """A bad value for local, or for a store or the proxy it starts (flag or environment), exits 2
    with a message naming the flag or the variable, and no process was started."""
    code, out = _run_local(tmp_path, args, _clean_env(**env))
    assert code == 2, out
    assert names in out, out
    assert "raftgate store:" not in out and "raftgate proxy:" not in out and "exited with code" not in out, out
    assert "Traceback" not in out, out


def _free_run(count: int, avoid: int) -> int:
    """The first of ``count`` consecutive free ports, none of them ``avoid`` (bounded search)."""
    for _ in range(50):
        base = free_port()
        if base <= avoid < base + count:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    pytest.fail(f"no {count} consecutive free ports")


def test_local_metrics_addr_gives_each_process_its_own_port(tmp_path: Path) -> None:
    """--metrics-addr HOST:PORT: store i serves /metrics on PORT+i, the proxy on PORT+nodes, member
    proxy i on PORT+nodes+1+i, each listed in local.json; every one answers."""
    local = RaftgateLocal(tmp_path)
    base = _free_run(7, local.port)
    local.extra_args += ["--metrics-addr", f"127.0.0.1:{base}"]
    with local:
        state = local.local_json()
        assert state is not None
        processes = state["processes"]  # type: ignore[index]
        order = {"store": 0, "proxy": 1, "member-proxy": 2}
        ordered = sorted(processes, key=lambda p: order[p["role"]])  # type: ignore[index]  # stable
        addrs = [p.get("metrics_addr") for p in ordered]  # type: ignore[union-attr]
        assert addrs == [f"127.0.0.1:{base + i}" for i in range(7)], state
        for addr in addrs:
            with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as response:
                assert response.status == 200 and b"# HELP" in response.read()


def test_local_refuses_one_store_metrics_port_for_every_store(tmp_path: Path) -> None:
    """RAFTGATE_STORE_METRICS_ADDR would give every store node the same port (the cluster dies):
    local refuses it, naming the variable and --metrics-addr."""
    code, out = _run_local(tmp_path, [], _clean_env(RAFTGATE_STORE_METRICS_ADDR=f"127.0.0.1:{free_port()}"))
    assert code == 2, out
    assert "RAFTGATE_STORE_METRICS_ADDR" in out and "--metrics-addr" in out, out
    assert "raftgate store:" not in out, out


def test_local_names_layout_json_when_its_port_is_taken(tmp_path: Path) -> None:
    """A port kept in layout.json that another program took since: a message naming layout.json
    and the port, exit non-zero, no traceback."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        (data_dir / "layout.json").write_text(json.dumps([{"name": "node1", "data_dir": str(data_dir / "node1"),
                                                           "peer_port": port, "internal_port": free_port()}]))
        code, out = _run_local(tmp_path, [], _clean_env())
    finally:
        taken.close()
    assert code != 0, out
    assert "layout.json" in out and str(port) in out, out
    assert "Traceback" not in out and "raftgate store:" not in out, out


@pytest.mark.soak  # one Ctrl-C is in `make test` (test_clean_start_stop.py[ctrl-c]); this repeats it
def test_ctrl_c_ends_every_process_with_0_every_time(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group), several times in a row: local and every
    process it runs exit 0, each time (a stop that raced a late signal failed one run in a few)."""
    local = RaftgateLocal(tmp_path)
    for _ in range(5):
        try:
            local.start()
            assert local.proc is not None
            proc = local.proc
            os.killpg(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            local.stop()
        output = local.output()
        assert code == 0, output
        exits = re.findall(r"^raftgate local: (.+) exited with code (-?\d+)$", output, re.M)
        assert [c for _, c in exits if c != "0"] == [], output


def test_a_stop_asked_for_while_local_starts_is_a_clean_stop(tmp_path: Path) -> None:
    """SIGTERM while `raftgate local` is still starting (right after the first store is ready):
    every child stops as asked and local exits 0, not 1 ("exited with code 0 before it was ready")."""
    proc = subprocess.Popen([sys.executable, "-m", "raftgate.cli", "local", "--data-dir", str(tmp_path / "d"),
                             "--client-port", str(free_port())], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded: local prints a few dozen lines, then stops or fails
            if line.startswith("raftgate store:") and " ready on " in line:
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
