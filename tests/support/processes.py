"""The one place tests start programs: free ports, condition waits, etcdctl, and every process a
test runs (`raftgate local`, a real etcd, `raftgate store` / `raftgate proxy` with any flags).

Every helper waits for a condition (a ready line, a file, a successful command), never for a fixed
time. Every process runs in its own process group that is always torn down: by the test, and at the
latest when the interpreter exits (a process still running then is stopped by an atexit hook).

- :class:`Process`: the lifecycle (start until ready or dead, output capture, stop, kill -9).
- :class:`RaftgateLocal`, :class:`EtcdServer`: the two servers the side-by-side tests compare;
  :func:`new_server` builds either by name (``BACKENDS``).
- :class:`Program`: ``raftgate store`` or ``raftgate proxy`` with any flags; :func:`store_program`,
  :func:`proxy_program` and :func:`store_and_proxy` build the usual one-node layout.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from raftgate.process import stop_group

T = TypeVar("T")

VENV_BIN = Path(sys.executable).parent
ETCD = str(VENV_BIN / "etcd")
ETCDCTL = str(VENV_BIN / "etcdctl")
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Ports handed out by this process; never hand the same one out twice even if it is free again.
_handed_out: set[int] = set()
_port_lock = threading.Lock()
#: One lock file per port handed out, locked for the life of this process: another test process
#: using these helpers skips the port (the kernel drops the lock when the process ends).
_PORT_LOCKS = Path(tempfile.gettempdir()) / "raftgate-test-ports"
_held_locks: list[int] = []
_cursor: int | None = None


def _test_ports() -> range:
    """Ports below the kernel's ephemeral range: bind-to-0 (``raftgate local``'s own choices, etcd's)
    and outgoing connections take ports from that range, so they never take one handed out here."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - 12000), low)


def _claim(port: int) -> bool:
    _PORT_LOCKS.mkdir(exist_ok=True)
    fd = os.open(_PORT_LOCKS / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held_locks.append(fd)
    return True


def _bindable(port: int) -> bool:
    """Stricter than the product's check (raftgate/process.py check_listenable, with SO_REUSEADDR as
    the servers bind): tests bind ports of their own without SO_REUSEADDR, and such a bind fails on
    a port still in TIME_WAIT, so a port handed out must take a plain bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, that this process has not handed out
    before, that no other test process holds, and that the kernel does not hand out by itself."""
    global _cursor
    with _port_lock:
        ports = _test_ports()
        if _cursor is None:
            _cursor = (os.getpid() * 7919) % len(ports)  # processes start apart, fewer lock misses
        for _ in range(len(ports)):
            port = ports[_cursor % len(ports)]
            _cursor += 1
            if port in _handed_out or not _claim(port):
                continue
            _handed_out.add(port)  # claimed: even if it is busy now, never try it again
            if _bindable(port):
                return port
    raise RuntimeError("no free port found")


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.02) -> object:
    """Poll `predicate` until it returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = interval
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)  # polling interval of a condition wait, not a fixed sleep
        delay = min(delay * 1.5, 0.25)


def etcdctl(
    endpoint: str,
    *args: str,
    user: str | None = None,
    stdin: str | None = None,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    dial_timeout: str = "5s",
) -> tuple[int, str, str]:
    """Run etcdctl (API v3) against `endpoint`; return (exit code, stdout, stderr)."""
    cmd = [ETCDCTL, f"--endpoints={endpoint}", f"--dial-timeout={dial_timeout}"]
    if user is not None:
        cmd.append(f"--user={user}")
    cmd.extend(args)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    full_env["ETCDCTL_API"] = "3"
    if env:
        full_env.update(env)
    proc = subprocess.run(
        cmd,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _kill_group(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The product's stop of a child in its own session (raftgate/process.py): SIGTERM to the group,
    SIGKILL to what is left after `timeout`. Returns the leader's exit code."""
    stop_group(proc, timeout)
    return proc.returncode


#: Every process started here and not yet stopped; stopped at the latest when the interpreter exits
#: (e.g. on Ctrl-C, or a test that raised before its own cleanup).
_running: set[Process] = set()
_running_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _running_lock:
        left = list(_running)
    for process in left:
        with contextlib.suppress(Exception):
            process.stop(timeout=5)


class Process:
    """Common lifecycle of a server subprocess: output capture, readiness, teardown."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._ready_line: str | None = None
        self._ready = threading.Event()
        #: notified when the output may have made the process ready (its ready line, any line of a
        #: program that is ready by a line) and when the output ends (the process is gone)
        self._output_changed = threading.Condition()
        self._output_events = 0
        self._reader: threading.Thread | None = None
        self.starts = 0
        self.last_exit_code: int | None = None

    # -- to override
    def command(self) -> list[str]:
        raise NotImplementedError

    def is_ready(self) -> bool:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        raise NotImplementedError

    # -- lifecycle
    def start(self, timeout: float = 60.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        self._ready.clear()
        log = self.workdir / f"{self.name}.{self.starts}.log"
        self.lines = []
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(REPO_ROOT),
            start_new_session=True,
        )
        with _running_lock:
            _running.add(self)
        self._reader = threading.Thread(target=self._pump, args=(self.proc, log), daemon=True)
        self._reader.start()
        try:
            self._wait_ready_or_dead(timeout)
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode} before ready:\n" + "".join(self.lines[-40:])
                )
        except BaseException:
            self.stop()
            raise

    def _ready_or_dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None or self.is_ready()

    #: wake on every line of output, not only the ready line (a cheap, line-based ``is_ready``)
    wake_on_every_line = False

    def _wait_ready_or_dead(self, timeout: float) -> None:
        """As :func:`wait_for` polls, but the pump wakes it at the line that makes the process ready
        and at the end of its output, so a start is not left waiting out a polling interval."""
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            with self._output_changed:
                seen = self._output_events
            if self._ready_or_dead():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting for {self.name} to become ready")
            with self._output_changed:
                if self._output_events == seen:  # nothing new since the check: wait for news or the interval
                    self._output_changed.wait(min(delay, left))
            delay = min(delay * 1.5, 0.25)

    def _output_event(self) -> None:
        with self._output_changed:
            self._output_events += 1
            self._output_changed.notify_all()

    def _pump(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        assert proc.stdout is not None
        with open(log, "w", encoding="utf-8", errors="replace") as fh:
            for raw in proc.stdout:
                line = raw.decode("utf-8", errors="replace")
                self.lines.append(line)
                fh.write(line)
                fh.flush()
                if self._ready_line is not None and line.strip() == self._ready_line:
                    self._ready.set()
                    self._output_event()
                elif self.wake_on_every_line:
                    self._output_event()
        self._output_event()  # the output ended: the process is gone (or closed its stdout)

    def stop(self, timeout: float = 15.0) -> int | None:
        """Stop the whole process group: SIGTERM, then SIGKILL after `timeout`. Returns the exit code."""
        if self.proc is None:
            return self.last_exit_code
        code = _kill_group(self.proc, timeout)
        self._reaped(code)
        return code

    def kill9(self) -> None:
        """SIGKILL the whole process group and reap it: nothing gets to flush or clean up."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reaped(self.proc.returncode)

    def _reaped(self, code: int | None) -> None:
        if self._reader is not None:
            self._reader.join(timeout=5)
        self.last_exit_code = code
        self.proc = None
        with _running_lock:
            _running.discard(self)

    def restart(self, timeout: float = 60.0) -> int | None:
        code = self.stop()
        self.start(timeout=timeout)
        return code

    def output(self) -> str:
        """What the process wrote so far; once it has died, all of it (the pump thread may still
        be reading the pipe's last lines when a test sees the process gone)."""
        reader = self._reader
        if self.proc is not None and self.proc.poll() is not None and reader is not None and reader.is_alive():
            reader.join(timeout=10)  # the pipe reaches EOF once the process (and its group) is gone
        return "".join(self.lines)

    def __enter__(self) -> Process:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- conveniences
    def ctl(self, *args: str, user: str | None = None, stdin: str | None = None, **kw: object) -> tuple[int, str, str]:
        return etcdctl(self.endpoint, *args, user=user, stdin=stdin, **kw)  # type: ignore[arg-type]

    @property
    def target(self) -> str:
        """host:port for gRPC channels."""
        return self.endpoint.removeprefix("http://")


def stop_together(processes: Sequence[Process], timeout: float = 15.0,
                  others: Sequence[Process] = ()) -> None:
    """Stops every process at once, as :meth:`Process.stop` does (``others`` with their own
    default timeout): a cluster's members stopped one by one wait on each other (a leader hands
    over, peers retry the stopped one); all at once they stop in about the time of one."""
    stops = [(p, timeout) for p in processes if p.proc is not None]
    stops += [(p, None) for p in others if p.proc is not None]
    threads = [threading.Thread(target=p.stop, kwargs={} if t is None else {"timeout": t}, daemon=True)
               for p, t in stops]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


#: stops handed over by :func:`stop_in_background` and not yet joined
_background_stops: list[threading.Thread] = []


def stop_in_background(processes: Sequence[Process], timeout: float = 15.0, others: Sequence[Process] = ()) -> None:
    """:func:`stop_together` in a thread of its own, for a teardown that looks at nothing the stop
    does: the next test starts meanwhile (a cluster's stop is mostly waiting: a store node waits up
    to a second for its peers' streams to close). :func:`join_background_stops` waits for them."""
    thread = threading.Thread(target=stop_together, args=(list(processes), timeout, list(others)), daemon=True)
    thread.start()
    with _running_lock:
        _background_stops[:] = [t for t in _background_stops if t.is_alive()]
        _background_stops.append(thread)


def join_background_stops() -> None:
    """Waits for every stop :func:`stop_in_background` handed over (each is bounded: SIGKILL after its timeout)."""
    with _running_lock:
        pending = list(_background_stops)
        _background_stops.clear()
    for thread in pending:
        thread.join()


class RaftgateLocal(Process):
    """`raftgate local` in its own data dir; restartable on the same dir and port."""

    name = "raftgate"

    def __init__(
        self,
        workdir: Path,
        *,
        auth_token: str | None = None,
        auth_token_ttl: int | None = None,
        bcrypt_cost: int = 4,
        extra_args: Sequence[str] = (),
        own_ports: bool = False,
    ) -> None:
        """``own_ports``: a new data dir's node ports come from ``free_port`` (``_own_layout``), for
        a test that kills nodes and restarts them."""
        super().__init__(workdir)
        self.own_ports = own_ports
        self.data_dir = self.workdir / "data"
        self.port = free_port()
        self.auth_token = auth_token
        self.auth_token_ttl = auth_token_ttl
        self.bcrypt_cost = bcrypt_cost
        self.extra_args = list(extra_args)
        self._ready_line = f"raftgate local: ready on 127.0.0.1:{self.port}"

    def _own_layout(self) -> None:
        """A new data dir gets a layout of ports from ``free_port``, which `raftgate local` keeps:
        tests kill its nodes and restart them on those ports, and a port it chose itself (a bind to
        0, from the kernel's ephemeral range) can meanwhile become an outgoing connection's source
        port (a restart then fails: the port is in use). Gateway ports it still chooses itself."""
        path = self.data_dir / "layout.json"
        if not self.own_ports or path.exists():
            return
        args = self.extra_args
        nodes = int(args[args.index("--nodes") + 1]) if "--nodes" in args else 3  # raftgate local's default
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        layout = [{"name": f"node{i + 1}", "data_dir": str(self.data_dir / f"node{i + 1}"), "peer_port": free_port(),
                   "internal_port": free_port(), "client_port": free_port()} for i in range(nodes)]  # fmt: skip
        path.write_text(json.dumps(layout))

    def command(self) -> list[str]:
        self._own_layout()
        exe = VENV_BIN / "raftgate"
        base = [str(exe)] if exe.exists() else [sys.executable, "-m", "raftgate.cli"]
        cmd = base + ["local", "--data-dir", str(self.data_dir), "--client-port", str(self.port)]
        if self.auth_token is not None:
            cmd += ["--auth-token", self.auth_token]
        if self.auth_token_ttl is not None:
            cmd += ["--auth-token-ttl", str(self.auth_token_ttl)]
        cmd += ["--bcrypt-cost", str(self.bcrypt_cost)]
        return cmd + self.extra_args

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def local_json(self) -> dict[str, object] | None:
        path = self.data_dir / "local.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def is_ready(self) -> bool:
        if not (self._ready.is_set() or self.local_json() is not None):
            return False
        # 3.7 semantics: AuthStatus needs no credentials, so this works whether or not auth is enabled.
        rc, out, _ = etcdctl(self.endpoint, "auth", "status", timeout=10, dial_timeout="1s")
        return rc == 0 and out.startswith("Authentication Status:")


class EtcdServer(Process):
    """A single-member real etcd (3.5.1) on free 127.0.0.1 ports, for side-by-side comparisons."""

    name = "etcd"

    def __init__(self, workdir: Path, *, extra_args: Sequence[str] = (), bcrypt_cost: int = 4) -> None:
        super().__init__(workdir)
        self.data_dir = self.workdir / "data"
        self.client_port = free_port()
        self.peer_port = free_port()
        self.extra_args = list(extra_args)
        self.bcrypt_cost = bcrypt_cost

    @staticmethod
    def available() -> bool:
        return shutil.which(ETCD) is not None

    def command(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        return [
            ETCD,
            "--name=m1",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=m1={peer}",
            "--initial-cluster-state=new",
            "--initial-cluster-token=raftgate-tests",
            f"--bcrypt-cost={self.bcrypt_cost}",
            "--log-level=warn",
            *self.extra_args,
        ]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def is_ready(self) -> bool:
        # etcd 3.5.1 serves Maintenance.Status without credentials even when auth is enabled.
        rc, _, _ = etcdctl(self.endpoint, "endpoint", "status", timeout=10, dial_timeout="1s")
        return rc == 0


BACKENDS = ("etcd", "raftgate")


def side_by_side(kinds: Sequence[str], run: Callable[[str], T]) -> dict[str, T]:
    """``run(kind)`` for each kind at once, in threads: the two sides of a comparison each wait on
    their own server (watches left open, timeouts), so together they take the time of one."""
    with ThreadPoolExecutor(max(1, len(kinds))) as pool:
        futures = {kind: pool.submit(run, kind) for kind in kinds}
        return {kind: future.result() for kind, future in futures.items()}


def skip_unless_available(kind: str) -> None:
    if kind == "etcd" and not EtcdServer.available():
        pytest.skip("real etcd binary not installed")


def new_server(kind: str, workdir: Path, **kw: object) -> EtcdServer | RaftgateLocal:
    """Build (not start) a server of `kind`; kw: auth_token, auth_token_ttl (raftgate), extra_args."""
    skip_unless_available(kind)
    if kind == "etcd":
        extra = list(kw.pop("extra_args", ()))  # type: ignore[call-overload]
        if kw.get("auth_token") is not None:
            extra.append(f"--auth-token={kw.pop('auth_token')}")
        kw.pop("auth_token", None)
        if kw.get("auth_token_ttl") is not None:
            extra.append(f"--auth-token-ttl={kw.pop('auth_token_ttl')}")
        kw.pop("auth_token_ttl", None)
        return EtcdServer(workdir, extra_args=extra, **kw)  # type: ignore[arg-type]
    return RaftgateLocal(workdir, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# `raftgate store` and `raftgate proxy` started alone, with any flags (`raftgate local` passes only
# some on: --metrics-addr, --identity-file, --snapshot-count, fail points, ... need the programs)

SECRET = "s3cret-for-tests-only-0123456789"


class Program(Process):
    """One raftgate program (``python -m raftgate.cli *args``), ready once it prints its ready line:
    ``<ready_prefix> ... ready on ...`` (a store) or ``<ready_prefix> serving ...`` (a proxy)."""

    wake_on_every_line = True

    def __init__(self, workdir: Path, args: list[str], ready_prefix: str, *, name: str | None = None,
                 python: str = sys.executable) -> None:
        super().__init__(workdir)
        self.name = name or args[0]
        self.args = list(args)
        self.ready_prefix = ready_prefix
        self.python = python

    def command(self) -> list[str]:
        return [self.python, "-m", "raftgate.cli", *self.args]

    def is_ready(self) -> bool:
        return any(line.startswith(self.ready_prefix) and (" ready on " in line or " serving " in line)
                   for line in list(self.lines))


def secret_file(directory: Path) -> Path:
    path = directory / "internal-secret"
    if not path.exists():
        path.write_text(SECRET)
    return path


def store_program(workdir: Path, *extra: str) -> tuple[Program, str]:
    """A one-node store cluster; returns it (not started) and its internal host:port."""
    secret = secret_file(workdir)
    port, peer = free_port(), free_port()
    args = ["store", "--name", "s1", "--data-dir", str(workdir / "store-data"),
            "--listen-internal-urls", f"http://127.0.0.1:{port}", "--internal-secret-file", str(secret),
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--peer-secret-file", str(secret), *extra]
    return Program(workdir / "store", args, "raftgate store:"), f"127.0.0.1:{port}"


def proxy_program(workdir: Path, store: str, listen: str, *extra: str, name: str = "proxy") -> Program:
    args = ["proxy", "--listen-client-urls", listen, "--store-endpoints", store,
            "--internal-secret-file", str(secret_file(workdir)), "--bcrypt-cost", "4", *extra]
    return Program(workdir / name, args, "raftgate proxy:")


def wait_serving(endpoint: str, timeout: float = 60.0) -> None:
    """Until the proxy answers AuthStatus through the store (the store has elected itself leader)."""
    def ok() -> bool:
        rc, out, _ = etcdctl(endpoint, "auth", "status", timeout=10, dial_timeout="1s")
        return rc == 0 and out.startswith("Authentication Status:")

    wait_for(ok, timeout, f"{endpoint} to serve through the store")


@contextlib.contextmanager
def store_and_proxy(workdir: Path) -> Iterator[str]:
    """A one-node store and a proxy in front of it, serving; yields the proxy's host:port."""
    store, internal = store_program(workdir)
    started: list[Program] = [store]
    store.start()
    try:
        port = free_port()
        proxy = proxy_program(workdir, internal, f"http://127.0.0.1:{port}")
        proxy.start()
        started.append(proxy)
        wait_serving(f"http://127.0.0.1:{port}")
        yield f"127.0.0.1:{port}"
    finally:
        stop_together(started)


# ---------------------------------------------------------------------------------------------
# what programs are started with


def pem_rsa_keypair(directory: Path) -> tuple[Path, Path]:
    """Write an RSA private key and its public key (PEM) for JWT tests; returns (priv, pub)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = Path(directory) / "jwt.key"
    pub = Path(directory) / "jwt.pub"
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


def write_test_pki(directory: Path, clients: Sequence[str], *, ca_name: str = "raftgate-test-ca") -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and one client certificate per CN in
    ``clients`` (ECDSA P-256, PEM), for TLS tests. Returns paths: ``ca``, ``ca.key`` (to sign
    CRLs: :func:`write_test_crl`), ``server.crt``, ``server.key``, ``<cn>.crt``, ``<cn>.key``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    later = now + datetime.timedelta(days=2)

    def write_key(name: str, key: ec.EllipticCurvePrivateKey) -> Path:
        path = directory / name
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        return path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_subject).issuer_name(ca_subject)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(later)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    out = {"ca": directory / "ca.crt"}
    out["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    out["ca.key"] = write_key("ca.key", ca_key)

    def issue(name: str, cn: str, server: bool) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                   .issuer_name(ca_subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(later)
                   .add_extension(x509.ExtendedKeyUsage(
                       [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server
                       else [ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        out[f"{name}.crt"] = directory / f"{name}.crt"
        out[f"{name}.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        out[f"{name}.key"] = write_key(f"{name}.key", key)

    issue("server", "server", True)
    for cn in clients:
        issue(cn, cn, False)
    return out


def write_test_crl(path: Path, pki: dict[str, Path], revoked: Sequence[str] = (), *, der: bool = False) -> Path:
    """A CRL signed by ``pki``'s CA (:func:`write_test_pki`) listing the certificates of the CNs in
    ``revoked``, PEM or DER, written as a mounted Secret changes: a new file renamed over the old."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
    key = serialization.load_pem_private_key(pki["ca.key"].read_bytes(), None)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca.subject).last_update(now)
               .next_update(now + datetime.timedelta(days=1)))
    for cn in revoked:
        serial = x509.load_pem_x509_certificate(pki[f"{cn}.crt"].read_bytes()).serial_number
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(now).build())
    crl = builder.sign(key, hashes.SHA256())  # type: ignore[arg-type]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.DER if der else serialization.Encoding.PEM))
    os.replace(tmp, path)
    return path


def client_script_env() -> dict[str, str]:
    """Environment for tests/clients scripts: python protobuf runtime (etcd3 0.12's generated code needs it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    env.pop("PYTHONPATH", None)
    return env
