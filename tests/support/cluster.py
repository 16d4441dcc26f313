"""Multi-process fault injection on 127.0.0.1: store clusters whose nodes a test can kill -9,
wipe and restart, a raw gRPC client that records a history, and per-node checks through each
node's internal port.

Two ways to get a cluster:

- :func:`local_cluster` runs ``raftgate local --nodes N`` and reads ``<data-dir>/local.json``;
  a killed node is restarted by the test as its own process (same argv, its own process group).
- :func:`program_cluster` starts N ``raftgate store`` processes and one ``raftgate proxy`` itself,
  with the same flag layout as ``raftgate/local.py`` plus any extra store flags (``raftgate local``
  passes none on, e.g. ``--snapshot-count``).

Every process either way is started by tests/support/processes.py and runs in a process group
that is torn down when the context exits, whatever happened. Every wait is for a condition,
bounded in time.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2
from raftgate.secret_proof import proving_channel
from tests.support.linearizability import CAS, GET, PUT, History, Op, check
from tests.support.processes import (
    Process,
    Program,
    RaftgateLocal,
    free_port,
    stop_in_background,
    stop_together,
    wait_for,
)

STORE_SERVICE = "/raftgate.storepb.Store/"
#: internal responses carry the answer under the request's field number in InternalRaftRequest
RESPONSE_FIELD = {f.number: f.name for f in store_pb2.InternalResponse.DESCRIPTOR.fields}


# ---------------------------------------------------------------------------------------------
# processes


def _pid_dead(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@dataclass
class Node:
    name: str
    argv: list[str]
    data_dir: Path
    internal: str  # host:port of the internal (Store) service
    #: a process started by `raftgate local` (not ours): its pid while it runs
    foreign_pid: int | None = None
    #: a process this test started (after a restart, or in a program cluster)
    program: Program | None = None
    member_id: int = 0
    channel: grpc.Channel | None = None
    #: ``channel`` with the secret's proofs on every call
    proven: grpc.Channel | None = None
    restarts: int = 0

    @property
    def running(self) -> bool:
        if self.program is not None and self.program.proc is not None and self.program.proc.poll() is None:
            return True
        return self.foreign_pid is not None and not _pid_dead(self.foreign_pid)

    def output(self) -> str:
        return self.program.output() if self.program is not None else ""


class Cluster:
    """Store nodes and one proxy endpoint (the etcd API)."""

    def __init__(self, workdir: Path, python: str, secret: str, nodes: list[Node], endpoint: str) -> None:
        self.workdir = workdir
        self.python = python
        self.secret = secret
        self.nodes = nodes
        self.endpoint = endpoint  # host:port of the proxy
        self.extra_programs: list[Program] = []  # e.g. a proxy we started

    # ---- the internal service of one node ----
    def _channel(self, node: Node) -> grpc.Channel:
        """The node's internal port; every call proves the secret (raftgate/secret_proof.py)."""
        if node.channel is None:
            node.channel = grpc.insecure_channel(node.internal)
            node.proven = proving_channel(node.channel, self.secret)
        assert node.proven is not None
        return node.proven

    def leader_info(self, node: Node, timeout: float = 1.0) -> store_pb2.LeaderResponse | None:
        call = self._channel(node).unary_unary(
            STORE_SERVICE + "Leader", request_serializer=store_pb2.LeaderRequest.SerializeToString,
            response_deserializer=store_pb2.LeaderResponse.FromString)
        try:
            resp = call(store_pb2.LeaderRequest(), timeout=timeout)
        except grpc.RpcError:
            return None
        node.member_id = resp.member_id
        return resp

    def do(self, node: Node, req: ipb.InternalRaftRequest, timeout: float = 5.0) -> Any:
        """Store.Do on one node; returns the inner response message (raises grpc.RpcError)."""
        call = self._channel(node).unary_unary(
            STORE_SERVICE + "Do", request_serializer=ipb.InternalRaftRequest.SerializeToString,
            response_deserializer=store_pb2.InternalResponse.FromString)
        resp = call(req, timeout=timeout)
        return getattr(resp, resp.WhichOneof("response"))

    def local_keys(self, node: Node, prefix: bytes, header: ipb.RequestHeader | None = None) -> dict[bytes, bytes]:
        """A serializable range on that node alone: what its own state holds."""
        req = ipb.InternalRaftRequest(header=header or ipb.RequestHeader(username="root"),
                                      range=rpc_pb2.RangeRequest(key=prefix, range_end=prefix_end(prefix),
                                                                 serializable=True))
        return {kv.key: kv.value for kv in self.do(node, req).kvs}

    def sync(self, node: Node) -> None:
        """A linearizable read on that node (AuthStatus: open to anyone): once it answers, the node
        has applied everything committed when it was sent, auth changes included."""
        self.do(node, ipb.InternalRaftRequest(auth_status=rpc_pb2.AuthStatusRequest()))

    def hash_kv(self, node: Node, header: ipb.RequestHeader | None = None) -> tuple[int, int]:
        """(revision, hash) of that node's key space as it is now."""
        req = ipb.InternalRaftRequest(header=header or ipb.RequestHeader(username="root"),
                                      hash_kv=rpc_pb2.HashKVRequest())
        resp = self.do(node, req)
        return resp.header.revision, resp.hash

    def wait_converged(self, timeout: float = 20.0, header: Callable[[], ipb.RequestHeader] | None = None,
                       nodes: list[Node] | None = None) -> tuple[int, int]:
        """Every (given) node reports the same (revision, HashKV): they hold the same key space."""
        nodes = nodes if nodes is not None else self.nodes
        seen: dict[str, Any] = {}

        def same() -> tuple[int, int] | None:
            try:
                for n in nodes:
                    self.sync(n)
                answers = {n.name: self.hash_kv(n, header() if header else None) for n in nodes}
            except grpc.RpcError as exc:
                seen["error"] = exc
                return None
            seen["answers"] = answers
            values = set(answers.values())
            return values.pop() if len(values) == 1 else None

        try:
            return wait_for(same, timeout, "every node to hold the same key space")  # type: ignore[return-value]
        except TimeoutError as exc:
            raise AssertionError(f"nodes did not converge: {seen}") from exc

    # ---- leadership ----
    def leader(self, timeout: float = 15.0, among: list[Node] | None = None) -> Node:
        """The node every running node agrees leads (the leader itself says so too)."""
        candidates = among if among is not None else self.nodes

        def agreed() -> Node | None:
            running = [n for n in candidates if n.running]
            answers = [(n, self.leader_info(n)) for n in running]
            if any(a is None for _, a in answers) or not answers:
                return None
            leaders = {a.leader_id for _, a in answers if a is not None}
            if len(leaders) != 1 or 0 in leaders:
                return None
            (lead,) = leaders
            for n, a in answers:
                if a is not None and a.member_id == lead:
                    return n
            return None

        return wait_for(agreed, timeout, "the running nodes to agree on a leader")  # type: ignore[return-value]

    def followers(self, leader: Node) -> list[Node]:
        return [n for n in self.nodes if n is not leader]

    # ---- faults ----
    def kill(self, node: Node) -> None:
        """kill -9 of the node's process; returns once it is dead."""
        if node.program is not None and node.program.proc is not None:
            node.program.kill9()
        if node.foreign_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.foreign_pid, signal.SIGKILL)
            wait_for(lambda: _pid_dead(node.foreign_pid), 10, f"{node.name} to die")  # type: ignore[arg-type]
            node.foreign_pid = None
        if node.channel is not None:
            node.channel.close()
            node.channel = None

    def terminate(self, node: Node) -> None:
        """SIGTERM (a graceful stop, as Kubernetes does it); returns once the process has exited."""
        pid = node.program.proc.pid if node.program is not None and node.program.proc is not None \
            else node.foreign_pid
        assert pid is not None, f"{node.name} is not running"
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not node.running, 30, f"{node.name} to stop")
        node.foreign_pid = None
        if node.channel is not None:
            node.channel.close()
            node.channel = None

    def restart(self, node: Node, timeout: float = 60.0) -> None:
        """Starts the node again from its argv (same data dir, ports and flags), as our process."""
        assert not node.running, f"{node.name} is still running"
        node.restarts += 1
        node.program = Program(self.workdir / f"{node.name}.{node.restarts}", node.argv, "raftgate store:",
                               name=node.name, python=self.python)
        node.program.start(timeout=timeout)

    def close(self, *others: Process, background: bool = False) -> None:
        """Stops the nodes we started, the extra programs and ``others``, all at once (``background``:
        in a thread of its own, for the end of a test that looks at nothing the stop does)."""
        programs = [*(n.program for n in self.nodes if n.program is not None), *self.extra_programs]
        if background:
            stop_in_background(programs, timeout=5, others=others)
        else:
            stop_together(programs, timeout=5, others=others)
        for node in self.nodes:
            if node.channel is not None:
                node.channel.close()
                node.channel = None


def prefix_end(prefix: bytes) -> bytes:
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"


@contextlib.contextmanager
def local_cluster(workdir: Path, nodes: int = 3) -> Iterator[Cluster]:
    """`raftgate local --nodes N` (bcrypt cost 4), as a Cluster of its store children."""
    local = RaftgateLocal(workdir, bcrypt_cost=4, extra_args=["--nodes", str(nodes)], own_ports=True)
    cluster: Cluster | None = None
    try:
        local.start()
        state = local.local_json()
        assert state is not None
        secret = (Path(str(state["data_dir"])) / "internal-secret").read_text().strip()
        members = [
            Node(name=p["name"], argv=list(p["argv"]), data_dir=Path(p["data_dir"]),
                 internal=f"127.0.0.1:{p['internal_port']}", foreign_pid=int(p["pid"]))
            for p in state["processes"] if p["role"] == "store"  # type: ignore[index,union-attr]
        ]
        assert len(members) == nodes, state
        cluster = Cluster(workdir, str(state["python"]), secret, members, local.target)
        cluster.local = local  # type: ignore[attr-defined]
        yield cluster
    finally:
        if cluster is not None:
            cluster.close(local, background=True)
        else:
            local.stop()


def store_argv(name: str, data_dir: Path, internal_port: int, peer_port: int, secret: Path,
               initial_cluster: str, client_url: str, extra: list[str]) -> list[str]:
    """The flags `raftgate local` gives a store node (raftgate/local.py), plus `extra`."""
    return ["store", "--name", name, "--data-dir", str(data_dir),
            "--listen-internal-urls", f"http://127.0.0.1:{internal_port}", "--internal-secret-file", str(secret),
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}", "--peer-secret-file", str(secret),
            "--initial-cluster", initial_cluster, "--advertise-client-urls", client_url, *extra]


def unstarted_cluster(workdir: Path, nodes: int = 3, store_flags: list[str] | None = None) -> Cluster:
    """N `raftgate store` members laid out as `raftgate local` lays them out, none started (a test
    starts each with ``Cluster.restart``, in the order it needs); the endpoint is the client URL
    they advertise, where `program_cluster` puts its proxy."""
    workdir.mkdir(parents=True, exist_ok=True)
    secret = workdir / "internal-secret"
    secret.write_text(os.urandom(32).hex())
    os.chmod(secret, 0o600)
    client_port = free_port()
    client_url = f"http://127.0.0.1:{client_port}"
    layout = [(f"node{i + 1}", free_port(), free_port()) for i in range(nodes)]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in layout)
    members = [Node(name=name, argv=store_argv(name, workdir / name, internal, peer, secret, initial, client_url,
                                               list(store_flags or [])),
                    data_dir=workdir / name, internal=f"127.0.0.1:{internal}")
               for name, internal, peer in layout]
    return Cluster(workdir, sys.executable, secret.read_text(), members, f"127.0.0.1:{client_port}")


@contextlib.contextmanager
def program_cluster(workdir: Path, nodes: int = 3, store_flags: list[str] | None = None) -> Iterator[Cluster]:
    """N `raftgate store` processes and one `raftgate proxy`, started here with `store_flags`."""
    cluster = unstarted_cluster(workdir, nodes, store_flags)
    members = cluster.nodes
    secret = workdir / "internal-secret"
    client_url = f"http://{cluster.endpoint}"
    try:
        errors: list[BaseException] = []
        proxy = Program(workdir / "proxy",
                        ["proxy", "--listen-client-urls", client_url,
                         "--store-endpoints", ",".join(n.internal for n in members),
                         "--internal-secret-file", str(secret), "--bcrypt-cost", "4"],
                        "raftgate proxy:")
        cluster.extra_programs.append(proxy)

        def start(start_one: Callable[[], None]) -> None:
            try:
                start_one()
            except BaseException as exc:  # reported below
                errors.append(exc)

        # every program at once, the proxy too (it needs no store to start), as `raftgate local` does
        starts: list[Callable[[], None]] = [lambda n=n: cluster.restart(n) for n in members]  # type: ignore[misc]
        threads = [threading.Thread(target=start, args=(s,)) for s in [*starts, proxy.start]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        yield cluster
    finally:
        cluster.close(background=True)


# ---------------------------------------------------------------------------------------------
# the client side: raw etcd v3 gRPC through the proxy, with a recorded history


class Client:
    """KV and Auth stubs on one channel to the proxy, with an optional token."""

    def __init__(self, target: str, token: str | None = None) -> None:
        self.channel = grpc.insecure_channel(target)
        self.kv = rpc_pb2_grpc.KVStub(self.channel)
        self.auth = rpc_pb2_grpc.AuthStub(self.channel)
        self.maintenance = rpc_pb2_grpc.MaintenanceStub(self.channel)
        self.token = token

    @property
    def md(self) -> tuple[tuple[str, str], ...] | None:
        return (("token", self.token),) if self.token else None

    def login(self, name: str, password: str, timeout: float = 10.0) -> str:
        self.token = self.auth.Authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password),
                                            timeout=timeout).token
        return self.token

    def put(self, key: bytes, value: bytes, timeout: float = 5.0) -> rpc_pb2.PutResponse:
        return self.kv.Put(rpc_pb2.PutRequest(key=key, value=value), metadata=self.md, timeout=timeout)

    def get(self, key: bytes, timeout: float = 5.0) -> bytes | None:
        resp = self.kv.Range(rpc_pb2.RangeRequest(key=key), metadata=self.md, timeout=timeout)
        return resp.kvs[0].value if resp.kvs else None

    def cas(self, key: bytes, expected: bytes | None, new: bytes, timeout: float = 5.0) -> bool:
        if expected is None:
            cmp = rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.VERSION, result=rpc_pb2.Compare.EQUAL, version=0)
        else:
            cmp = rpc_pb2.Compare(key=key, target=rpc_pb2.Compare.VALUE, result=rpc_pb2.Compare.EQUAL,
                                  value=expected)
        txn = rpc_pb2.TxnRequest(compare=[cmp],
                                 success=[rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key, value=new))])
        return self.kv.Txn(txn, metadata=self.md, timeout=timeout).succeeded

    def scan(self, prefix: bytes, timeout: float = 10.0) -> dict[bytes, bytes]:
        resp = self.kv.Range(rpc_pb2.RangeRequest(key=prefix, range_end=prefix_end(prefix)), metadata=self.md,
                             timeout=timeout)
        return {kv.key: kv.value for kv in resp.kvs}

    def close(self) -> None:
        self.channel.close()


def describe(exc: grpc.RpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]


def retry_ok(fn: Callable[[], Any], timeout: float = 20.0, what: str = "a request to succeed") -> Any:
    """Calls fn until it does not raise a gRPC error (a cluster recovering); returns its result."""
    last: list[str] = []

    def attempt() -> Any:
        try:
            return (fn(),)
        except grpc.RpcError as exc:
            last[:] = [describe(exc)]
            return None

    try:
        return wait_for(attempt, timeout, what)[0]  # type: ignore[index]
    except TimeoutError as exc:
        raise AssertionError(f"{what}: still failing after {timeout}s ({last})") from exc


@dataclass
class Record:
    op: Op
    started: float
    finished: float | None = None
    error: str | None = None


@dataclass
class Recorder:
    """A linearizability History plus wall-clock times and error texts of every operation."""

    history: History = field(default_factory=History)
    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, client_id: int, kind: str, key: bytes, arg: Any, call: Callable[[], Any]) -> Record:
        """Invokes `call`, recording the outcome. A write that fails has an unknown outcome (it may
        have been applied before the error), so it is recorded as a timeout; a failed read
        constrains nothing and is recorded as failed."""
        with self.lock:
            op = self.history.invoke(client_id, kind, key, arg)
            rec = Record(op, time.monotonic())
            self.records.append(rec)
        try:
            out = call()
        except grpc.RpcError as exc:
            with self.lock:
                rec.finished, rec.error = time.monotonic(), describe(exc)
                if kind == GET:
                    self.history.fail(op)
                else:
                    self.history.timeout(op)
            return rec
        with self.lock:
            self.history.ok(op, out)
            rec.finished = time.monotonic()
        return rec

    def acked_writes(self) -> list[Record]:
        return [r for r in self.records if r.op.kind in (PUT, CAS) and r.op.status == "ok"]

    def first_write_ok_after(self, t: float) -> float | None:
        """Completion time of the first write invoked after t that succeeded."""
        with self.lock:
            done = [r.finished for r in self.records
                    if r.op.kind in (PUT, CAS) and r.op.status == "ok" and r.started > t and r.finished]
        return min(done) if done else None

    def writes_ok_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for r in self.records
                       if r.op.kind in (PUT, CAS) and r.op.status == "ok" and r.started > t)

    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            if r.error:
                out[r.error] = out.get(r.error, 0) + 1
        return out


class Workload:
    """Client threads doing puts, gets and CAS on a few shared keys and puts of write-once keys,
    each through its own channel to the proxy, until stopped (bounded by `max_seconds`)."""

    SHARED = [f"/lin/k{i}".encode() for i in range(4)]
    UNIQUE_PREFIX = b"/once/"

    def __init__(self, target: str, recorder: Recorder, clients: int = 4, op_timeout: float = 4.0,
                 max_seconds: float = 90.0, seed: int = 0, token: str | None = None,
                 unique_only: bool = False) -> None:
        self.target = target
        self.token = token
        self.unique_only = unique_only
        self.rec = recorder
        self.clients = clients
        self.op_timeout = op_timeout
        self.max_seconds = max_seconds
        self.seed = seed
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failures: list[BaseException] = []

    def __enter__(self) -> Workload:
        for c in range(self.clients):
            t = threading.Thread(target=self._loop, args=(c,), name=f"client-{c}", daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=self.op_timeout + 10)
        assert not any(t.is_alive() for t in self.threads), "a client thread did not stop"
        if self.failures:
            raise self.failures[0]

    def _loop(self, c: int) -> None:
        rng = random.Random(self.seed * 1000 + c)
        client = Client(self.target, self.token)
        deadline = time.monotonic() + self.max_seconds
        n = 0
        try:
            while not self.stop_event.is_set() and time.monotonic() < deadline:
                n += 1
                value = f"c{c}-{n}".encode()
                roll = 1.0 if self.unique_only else rng.random()
                t = self.op_timeout
                if roll < 0.30:
                    key = rng.choice(self.SHARED)
                    self.rec.run(c, PUT, key, value, lambda k=key, v=value, t=t: client.put(k, v, t) and None)
                elif roll < 0.55:
                    key = rng.choice(self.SHARED)
                    self.rec.run(c, GET, key, None, lambda k=key, t=t: client.get(k, t))
                elif roll < 0.65:
                    key = rng.choice(self.SHARED)
                    expected = self._last_seen(key)
                    self.rec.run(c, CAS, key, (expected, value),
                                 lambda k=key, e=expected, v=value, t=t: client.cas(k, e, v, t))
                else:
                    key = self.UNIQUE_PREFIX + value
                    self.rec.run(c, PUT, key, value, lambda k=key, v=value, t=t: client.put(k, v, t) and None)
        except BaseException as exc:  # surfaced by stop()
            self.failures.append(exc)
        finally:
            client.close()

    def _last_seen(self, key: bytes) -> bytes | None:
        with self.rec.lock:
            for r in reversed(self.rec.records):
                if r.op.key == key and r.op.status == "ok":
                    if r.op.kind == GET:
                        return r.op.output  # type: ignore[no-any-return]
                    if r.op.kind == PUT:
                        return r.op.arg  # type: ignore[no-any-return]
        return None


def check_acked_present(rec: Recorder, final: dict[bytes, bytes], prefix: bytes = Workload.UNIQUE_PREFIX) -> None:
    """Every acknowledged write of a write-once key is in `final`, with its value."""
    missing = [r.op for r in rec.acked_writes() if r.op.key.startswith(prefix) and final.get(r.op.key) != r.op.arg]
    assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"


def append_final_reads(rec: Recorder, client: Client, keys: list[bytes]) -> None:
    """Reads every shared key once more after the faults, as part of the history."""
    for key in keys:
        r = retry_ok(lambda k=key: client.get(k, 5.0), 20, f"a final read of {key!r}")
        with rec.lock:
            op = rec.history.invoke(99, GET, key)
            rec.history.ok(op, r)


def distribution(label: str, values: list[float]) -> str:
    if not values:
        return f"{label}: no samples"
    vs = sorted(values)
    med = statistics.median(vs)
    return (f"{label}: n={len(vs)} min={vs[0]:.2f}s median={med:.2f}s max={vs[-1]:.2f}s "
            f"all=[{', '.join(f'{v:.2f}' for v in vs)}]")


def root_header(client: Client) -> Callable[[], ipb.RequestHeader]:
    """A header as a proxy would stamp it for root, at the current auth revision."""

    def make() -> ipb.RequestHeader:
        rev = client.auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=5).authRevision
        return ipb.RequestHeader(username="root", auth_revision=rev)

    return make



def setup_auth(client: Client, root_password: str = "rootpw") -> None:
    """root (with the root role), then auth enable; leaves `client` logged in as root."""
    a = client.auth
    a.UserAdd(rpc_pb2.AuthUserAddRequest(name="root", password=root_password), timeout=10)
    a.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="root"), timeout=10)
    a.UserGrantRole(rpc_pb2.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
    a.AuthEnable(rpc_pb2.AuthEnableRequest(), timeout=10)
    client.login("root", root_password)


def auth_state(client: Client) -> dict[str, Any]:
    """Everything the auth store holds that a client can see: enabled flag, revision, users with
    their roles, roles with their permissions (needs a root token)."""
    a, md = client.auth, client.md
    status = a.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)
    users = list(a.UserList(rpc_pb2.AuthUserListRequest(), metadata=md, timeout=10).users)
    roles = list(a.RoleList(rpc_pb2.AuthRoleListRequest(), metadata=md, timeout=10).roles)
    return {
        "enabled": status.enabled,
        "auth_revision": status.authRevision,
        "users": {u: sorted(a.UserGet(rpc_pb2.AuthUserGetRequest(name=u), metadata=md, timeout=10).roles)
                  for u in users},
        "roles": {r: sorted((p.permType, p.key, p.range_end)
                            for p in a.RoleGet(rpc_pb2.AuthRoleGetRequest(role=r), metadata=md, timeout=10).perm)
                  for r in roles},
    }


def kv_state(client: Client, prefix: bytes = b"\x00") -> list[tuple[bytes, bytes, int, int, int]]:
    """Every key (from `prefix` on, default all) with its value, create/mod revision and version."""
    req = rpc_pb2.RangeRequest(key=prefix, range_end=b"\x00")
    resp = client.kv.Range(req, metadata=client.md, timeout=10)
    return [(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version) for kv in resp.kvs]


#: what etcd (and so the proxy, issue 3 item 7) answers a write that fails during a failover,
#: plus the client's own deadline
ETCD_FAILOVER_ERRORS = {
    "UNAVAILABLE: etcdserver: no leader",
    "UNAVAILABLE: etcdserver: request timed out",
    "UNAVAILABLE: etcdserver: request timed out, possibly due to previous leader failure",
    "UNAVAILABLE: etcdserver: request timed out, possibly due to connection lost",
    "UNAVAILABLE: etcdserver: leader changed",
    "DEADLINE_EXCEEDED: Deadline Exceeded",
}


def assert_only_etcd_errors(seen: set[str], allowed: set[str] = ETCD_FAILOVER_ERRORS) -> None:
    """Clients see only etcd's errors during a failover, never a transport error of the proxy's
    own connections to the store (issue 3, item 7)."""
    foreign = sorted(e for e in seen if e not in allowed)
    assert not foreign, f"clients saw errors that are not etcd's: {foreign}"


def verify_after_faults(cluster: Any, rec: Recorder) -> None:
    """What every fault run must show afterwards: clients saw only etcd's errors, every
    acknowledged write is there (through the proxy and on every node, restarted ones included),
    and the recorded history, closed by final reads, is linearizable."""
    assert_only_etcd_errors(set(rec.errors()))
    client = Client(cluster.endpoint)
    try:
        append_final_reads(rec, client, Workload.SHARED)
        final = retry_ok(lambda: client.scan(Workload.UNIQUE_PREFIX), 20, "the final scan")
    finally:
        client.close()
    check_acked_present(rec, final)
    result = check(rec.history.ops)
    assert result.ok, result.describe()
    cluster.wait_converged()
    for node in cluster.nodes:
        check_acked_present(rec, cluster.local_keys(node, Workload.UNIQUE_PREFIX))
