"""``raftgate local``: a store node and a proxy on this machine, in the foreground.

Each runs as its own process (the same programs ``raftgate store`` and ``raftgate proxy`` start),
so a test or an operator can inspect or kill one of them: ``<data-dir>/local.json`` lists their
pids and ports while they run. Every value is checked before any process starts: local's own flags,
and the flags and environment variables (``RAFTGATE_STORE_*``, ``ETCD_*``, ``RAFTGATE_PROXY_*``)
each store node and the proxy will read, with their own parsers.

Besides the proxy on ``--client-port``, each store node has a member proxy of its own (its
``--member-store-endpoint``), whose URL is the client URL the node advertises: as with etcd,
``etcdctl endpoint status --cluster`` reaches every member through it and each row is that
member's own answer. With ``--gateway-port`` each member proxy also serves etcd's JSON gateway on
a port of its own (``gateway_port`` in layout.json), which its node advertises
(``--advertise-gateway-urls``): the gateway's member list names those, so an HTTP client that
discovers members reaches a gateway, as on etcd's client URLs.

With ``--audit-log PATH`` every proxy keeps its own file (one writer per file): the client proxy
PATH, member proxy i ``PATH.<node name>``; with ``-`` each writes to its stdout, which local passes
on line by line. SIGHUP to local is passed on to the proxies (they reopen their files).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raftgate import event_loop
from raftgate.config_support import MAX_PROXY_WORKERS, ConfigError, FlagParser, boolean, integer, parse_flags
from raftgate.observe import ListenAddr, parse_listen_addr
from raftgate.private_files import private_dir, wider_than_private, write_private
from raftgate.process import STOPPED_BY_SIGNAL, DataDirInUse, check_listenable, lock_data_dir, on_sighup, pass_on
from raftgate.process import Child as Process
from raftgate.stop_signals import stop_on_signals

#: A program's config parser, ``(argv, environ) -> config`` raising ConfigError: the store's and the
#: proxy's are given by raftgate.cli (the shared package imports neither program), so local can
#: check a child's values without starting it.
CheckStore = Callable[[Sequence[str], Mapping[str, str]], object]
CheckProxy = CheckStore
#: The default --host-whitelist: local's gateway listens on 127.0.0.1 only
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")



#: Per-process addresses a store reads from its environment: every node would get the same one.
SHARED_STORE_ADDRS = {"RAFTGATE_STORE_METRICS_ADDR": "--metrics-addr", "RAFTGATE_STORE_HEALTH_ADDR": None}
#: The same for the proxies (the client proxy and each member proxy read the environment too).
SHARED_PROXY_ADDRS = {"RAFTGATE_PROXY_METRICS_ADDR": "--metrics-addr", "RAFTGATE_PROXY_HEALTH_ADDR": None,
                      "RAFTGATE_PROXY_LISTEN_GATEWAY_URLS": "--gateway-port"}
#: The flags passed on to the proxy as they are (``--auth-token-ttl`` -> ``--auth-token-ttl``).
PROXY_FLAGS = ("auth_token", "auth_token_ttl", "bcrypt_cost", "max_request_bytes", "audit_level", "audit_fail_closed",
               "auth_rate_limit", "cert_file", "key_file", "trusted_ca_file", "client_cert_auth",
               "client_crl_file")
#: Read by every proxy: one file with several writers. local gives each proxy a file of its own.
SHARED_PROXY_FILES = {"RAFTGATE_PROXY_AUDIT_LOG": "--audit-log"}
#: The flags passed on to every store node as they are (lockout is decided by the store).
STORE_FLAGS = ("auth_lockout_attempts", "auth_lockout_duration")
#: the proxies' client-port certificate from the environment (as the flag, it makes the client URLs https://)
CERT_FILE_ENV = "RAFTGATE_PROXY_CERT_FILE"


@dataclass(frozen=True)
class LocalConfig:
    data_dir: Path
    client_port: int
    nodes: int
    #: the proxy flags given (dest -> value as text), passed on to the proxy
    proxy_flags: tuple[tuple[str, str], ...] = ()
    #: the store flags given (dest -> value as text), passed on to every store node
    store_flags: tuple[tuple[str, str], ...] = ()
    initial_root_password_file: Path | None = None
    bcrypt_cost: str | None = None
    #: --metrics-addr: the first port; store i gets PORT+i, the proxy PORT+nodes, member proxy i
    #: PORT+nodes+1+i
    metrics_addr: ListenAddr | None = None
    #: --gateway-port: the proxy also serves etcd's JSON gateway there (None: off)
    gateway_port: int | None = None
    #: --audit-log: the client proxy's audit log ("-": stdout); member proxy i writes PATH.<name>
    audit_log: str | None = None
    #: --cert-file (or RAFTGATE_PROXY_CERT_FILE) given: every proxy serves https:// client URLs
    tls: bool = False
    #: --proxy-workers: processes of the client proxy (``raftgate proxy --workers``)
    proxy_workers: int = 1
    #: --cors: the origins whose web pages may call the gateway (None: none)
    cors: str | None = None
    #: --host-whitelist: the Host names the gateway answers (default: loopback names only)
    host_whitelist: str = ",".join(LOOPBACK_HOSTS)

    def audit_log_of(self, member: str | None) -> str | None:
        """The audit log of the client proxy (None) or of a member proxy: one writer per file."""
        if self.audit_log is None or self.audit_log == "-" or member is None:
            return self.audit_log
        return f"{self.audit_log}.{member}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def metrics_addrs(self) -> list[ListenAddr | None]:
        """One address per process (the stores in order, the proxy, then the member proxies in
        order), or None each."""
        base = self.metrics_addr
        return [None if base is None else ListenAddr(base.host, base.port + i) for i in range(2 * self.nodes + 1)]


def _parser() -> FlagParser:
    p = FlagParser(
        prog="raftgate local",
        description="Run a local raftgate (store + proxy) serving the etcd v3 API.",
        epilog="Flags: docs/configuration.md. The data dir, local.json and the cluster it runs: "
        "docs/operations.md.",
    )
    p.add_argument("--data-dir", default="./raftgate-data", help="where all state lives (default ./raftgate-data)")
    p.add_argument("--client-port", type=int, default=2379, help="etcd API port on 127.0.0.1 (default 2379)")
    p.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5], help="store nodes (default 3)")
    p.add_argument(
        "--auth-token", default=None, help="simple (default) or jwt,pub-key=…,priv-key=…,sign-method=…,ttl=…"
    )
    p.add_argument("--auth-token-ttl", default=None, help="simple token TTL in seconds (default 300)")
    p.add_argument("--bcrypt-cost", default=None, help="bcrypt cost for new passwords (default 10)")
    p.add_argument("--max-request-bytes", default=None, help="largest client request (default 1572864)")
    p.add_argument("--auth-lockout-attempts", default=None,
                   help="failed Authenticate calls of one user name that lock it (default 5; 0: no lockout)")
    p.add_argument("--auth-lockout-duration", default=None,
                   help="Go duration: the lockout's counting window and length (default 15m)")
    p.add_argument("--auth-rate-limit", default=None,
                   help="Authenticate calls a second per client address (default 0: no limit)")
    p.add_argument("--cert-file", default=None,
                   help="TLS certificate (PEM) of the client port and the member proxies: they serve https://")
    p.add_argument("--key-file", default=None, help="its private key (PEM)")
    p.add_argument("--trusted-ca-file", default=None,
                   help="CA bundle (PEM): clients then need a certificate it signed")
    p.add_argument("--client-cert-auth", nargs="?", const="true", default=None, type=boolean,
                   help="a verified client certificate's CN is the user of requests without a token")
    p.add_argument("--client-crl-file", default=None,
                   help="certificate revocation list (PEM or DER) of --trusted-ca-file: client certificates it "
                        "lists are refused; re-read when it changes")
    p.add_argument("--gateway-port", type=int, default=None,
                   help="also serve etcd's JSON gateway (POST /v3/kv/range, ..., GET /health) on this 127.0.0.1 "
                        "port; each member proxy serves one too (its port in local.json), which the gateway's "
                        "member list names")
    p.add_argument("--cors", default=None,
                   help="with --gateway-port: comma list of origins (scheme://host[:port]) whose web pages may call "
                        "the gateway, or '*' for every origin; default: none (no CORS headers; a request with "
                        "an Origin header is refused)")
    p.add_argument("--host-whitelist", default=None,
                   help="with --gateway-port: comma list of host names a request's Host header may name (any port), "
                        "or '*'; default: localhost, 127.0.0.1 and ::1 (DNS rebinding)")
    p.add_argument("--audit-log", default=None,
                   help="the client proxy's audit log (JSON lines; '-': stdout); member proxy i writes "
                        "PATH.<node name> (default: off)")
    p.add_argument("--audit-level", default=None, help="auth, denials (default) or all")
    p.add_argument("--audit-fail-closed", nargs="?", const="true", default=None,
                   help="refuse requests while an audit log cannot be written (true/false)")
    p.add_argument("--proxy-workers", default=1,
                   help="processes serving --client-port together (raftgate proxy --workers; default 1); "
                        "the member proxies stay one process each")
    p.add_argument("--initial-root-password-file", default=None,
                   help="a new cluster starts with root (this password) and authentication enabled")
    p.add_argument("--metrics-addr", default=None,
                   help="HOST:PORT: Prometheus /metrics of store i on PORT+i, of the proxy on PORT+nodes, of member "
                        "proxy i on PORT+nodes+1+i "
                        "(listed in local.json; default: off)")
    return p


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> LocalConfig:
    """``(argv, environ)`` -> LocalConfig. local's own flags come from the command line only; the
    environment is its children's (checked in ``check_children``)."""
    f = parse_flags(_parser(), argv, environ, lambda action: ())
    password_file = f["initial_root_password_file"]
    nodes = f["nodes"]
    try:
        metrics = parse_listen_addr("--metrics-addr", f["metrics_addr"])
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if metrics is not None and not 0 < metrics.port <= 65535 - 2 * nodes:
        raise ConfigError(f"--metrics-addr: the port must be in 1..{65535 - 2 * nodes} (ports "
                          f"PORT..PORT+{2 * nodes} are used: one per store node, the proxy, one per member proxy)")
    client_port = integer(f, "client_port", 1, 65535)
    gateway_port = None if f["gateway_port"] is None else integer(f, "gateway_port", 1, 65535)
    if gateway_port == client_port:
        raise ConfigError("--gateway-port: must differ from --client-port")
    proxy_workers = integer(f, "proxy_workers", 1, MAX_PROXY_WORKERS)
    if proxy_workers > 1 and gateway_port is not None:
        raise ConfigError("--proxy-workers: the JSON gateway (--gateway-port) is served by one process; "
                          "use --proxy-workers 1 with it")
    for dest in ("cors", "host_whitelist"):
        if f[dest] is not None and gateway_port is None:
            raise ConfigError(f"{f.source(dest)}: is for the JSON gateway; give --gateway-port too")
    return LocalConfig(
        data_dir=Path(f["data_dir"]),
        client_port=client_port,
        nodes=nodes,
        proxy_flags=tuple((dest, _flag_text(f[dest])) for dest in PROXY_FLAGS if f[dest] is not None),
        store_flags=tuple((dest, str(f[dest])) for dest in STORE_FLAGS if f[dest] is not None),
        initial_root_password_file=Path(password_file).resolve() if password_file else None,
        bcrypt_cost=None if f["bcrypt_cost"] is None else str(f["bcrypt_cost"]),
        metrics_addr=metrics,
        gateway_port=gateway_port,
        audit_log=_audit_path(f["audit_log"]),
        tls=f["cert_file"] is not None or bool(environ.get(CERT_FILE_ENV, "").strip()),
        proxy_workers=proxy_workers,
        cors=f["cors"],
        host_whitelist=f["host_whitelist"] if f["host_whitelist"] is not None else ",".join(LOOPBACK_HOSTS),
    )


def _audit_path(path: str | None) -> str | None:
    """An absolute path (the children run elsewhere), or "-"."""
    return path if path in (None, "-") or not path.strip() else str(Path(path).resolve())


def _flag_text(value: object) -> str:
    """A flag value as the proxy parses it (booleans as etcd spells them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_children(a: LocalConfig, store_argvs: list[list[str]], proxy_argv: list[str],
                   environ: Mapping[str, str], check_store: CheckStore | None,
                   check_proxy: CheckProxy | None = None) -> None:
    """Parses what each child will parse (its argv and this environment), so a bad value stops
    local before anything starts, named as the child would name it; raises ConfigError."""
    for var, flag in SHARED_STORE_ADDRS.items():
        if environ.get(var, "").strip() and not (flag == "--metrics-addr" and a.metrics_addr is not None):
            instead = "use raftgate local --metrics-addr (one port per process), or unset it" if flag else "unset it"
            raise ConfigError(f"{var}: every store node would listen on {environ[var]!r}; {instead}")
    for var, flag in SHARED_PROXY_ADDRS.items():
        if environ.get(var, "").strip() and not (flag == "--metrics-addr" and a.metrics_addr is not None):
            instead = f"use raftgate local {flag}, or unset it" if flag else "unset it"
            raise ConfigError(f"{var}: every proxy (the client proxy and each member proxy) would listen on "
                              f"{environ[var]!r}; {instead}")
    for var, flag in SHARED_PROXY_FILES.items():
        if environ.get(var, "").strip() and getattr(a, flag.removeprefix("--").replace("-", "_")) is None:
            raise ConfigError(f"{var}: every proxy (the client proxy and each member proxy) would append to "
                              f"{environ[var]!r}; use raftgate local {flag} (one file per proxy), or unset it")
    if check_store is not None:
        for argv in store_argvs:
            check_store(argv[1:], environ)
    if check_proxy is not None:
        check_proxy(proxy_argv[1:], environ)


def check_ports(a: LocalConfig, layout_file: Path, layout: list[dict[str, Any]]) -> None:
    """Every port about to be listened on is free now: a port kept in layout.json that another
    program took since gets a message naming it (not a gRPC traceback from a child). Raises OSError."""
    wanted: list[tuple[str, str, int]] = [(f"--client-port {a.client_port}", "127.0.0.1", a.client_port)]
    if a.gateway_port is not None:
        wanted.append((f"--gateway-port {a.gateway_port}", "127.0.0.1", a.gateway_port))
    for n in layout:
        wanted += [(f"port {n[key]} ({n['name']} {key}, kept in {layout_file})", "127.0.0.1", int(n[key]))
                   for key in _PORT_KEYS if key in n and (key != "gateway_port" or a.gateway_port is not None)]
    roles = [n["name"] for n in layout] + ["the proxy"] + [f"{n['name']}'s member proxy" for n in layout]
    wanted += [(f"--metrics-addr: port {addr.port} (for {role})", addr.host, addr.port)
               for role, addr in zip(roles, a.metrics_addrs(), strict=True) if addr is not None]
    users: dict[int, str] = {}
    for what, _, port in wanted:
        if port in users:
            raise OSError(f"{what} and {users[port]} are the same port; choose another --client-port or "
                          "--metrics-addr")
        users[port] = what
    for what, host, port in wanted:
        try:
            check_listenable(host, port)
        except OSError as exc:
            hint = (" (a member's peer URL is part of its identity: free the port, or start from an empty "
                    "--data-dir)") if "layout" in what else ""
            raise OSError(f"{what} cannot be listened on: {exc.strerror}{hint}") from None


def _free_ports(count: int, avoid: set[int]) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1, none in ``avoid``.

    Every socket stays bound until all are chosen: a port freed a moment ago may come straight back
    from the kernel, and two nodes on one port stall the cluster for good (the layout is kept).
    """
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        while len(chosen) < count:  # ends: a held port never comes back, so at most len(avoid) misses
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in avoid:
                chosen.append(port)
        return chosen
    finally:
        for s in held:
            s.close()


def _lock(data_dir: Path) -> int | None:
    """An exclusive lock on the data dir for the life of the process, taken before anything in it
    is read or written: a second ``raftgate local`` would start nodes on the same logs and, when
    they fail, delete the first one's local.json. None if another process holds it."""
    try:
        return lock_data_dir(data_dir, "raftgate local")
    except DataDirInUse as exc:
        print(f"raftgate local: {exc}", file=sys.stderr, flush=True)
        return None


def _secret_file(data_dir: Path) -> Path:
    path = data_dir / "internal-secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def _layout(data_dir: Path, nodes: int, client_port: int = 2379, gateway_port: int | None = None,
            reserved: Iterable[int] = ()) -> list[dict[str, Any]]:
    """Names, ports and directories of the store nodes, kept in the data dir across restarts
    (a member's peer URL is part of its identity). New ports avoid ``reserved`` (the metrics
    ports): a kept port that clashes with one would refuse every later start."""
    path = data_dir / "layout.json"
    if path.exists():
        layout = _read_layout(path)
        if len(layout) != nodes:
            raise SystemExit(f"raftgate local: {data_dir} holds a {len(layout)}-node cluster, not --nodes {nodes}")
        _check_distinct(path, layout, client_port, gateway_port)
        # a layout from before member proxies, or before their gateways (chosen once, then kept)
        missing = [(n, "client_port") for n in layout if "client_port" not in n]
        if gateway_port is not None:
            missing += [(n, "gateway_port") for n in layout if "gateway_port" not in n]
        if missing:
            used = {client_port, *reserved} | {int(n[k]) for n in layout for k in _PORT_KEYS if k in n}
            if gateway_port is not None:
                used.add(gateway_port)
            for (n, key), port in zip(missing, _free_ports(len(missing), used), strict=True):
                n[key] = port
            _write_layout(path, layout)
        return layout
    avoid = {client_port, *reserved} | (set() if gateway_port is None else {gateway_port})
    per_node = 3 if gateway_port is None else 4
    ports = _free_ports(per_node * nodes, avoid)
    layout = [{"name": f"node{i + 1}", "data_dir": str(data_dir / f"node{i + 1}"), "peer_port": ports[per_node * i],
               "internal_port": ports[per_node * i + 1], "client_port": ports[per_node * i + 2]}
              for i in range(nodes)]  # fmt: skip
    if gateway_port is not None:
        for i, n in enumerate(layout):
            n["gateway_port"] = ports[per_node * i + 3]
    _write_layout(path, layout)
    return layout


def _read_layout(path: Path) -> list[dict[str, Any]]:
    """layout.json as local wrote it; anything else (cut short, edited by hand) is refused with
    its name, not a traceback: guessing the ports again would give members new identities."""

    def damaged(why: str) -> SystemExit:
        return SystemExit(f"raftgate local: {path} is damaged ({why}); put it back as it was, or start from an "
                          "empty --data-dir")

    try:
        layout = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise damaged(str(exc)) from None
    if not isinstance(layout, list):
        raise damaged("not a list of nodes")
    for n in layout:
        if not isinstance(n, dict) or not isinstance(n.get("name"), str) or not isinstance(n.get("data_dir"), str):
            raise damaged("a node without its name or data_dir")
        for key in _PORT_KEYS:
            port = n.get(key)
            if key in _LATER_KEYS and port is None:
                continue  # a layout from before member proxies (or their gateways): chosen when needed
            if type(port) is not int or not 0 < port <= 65535:
                raise damaged(f"{n['name']} {key} is {port!r}, not a port")
    return layout


def _write_layout(path: Path, layout: list[dict[str, Any]]) -> None:
    """Written whole or not at all (a crash mid-write must not leave half a file)."""
    write_private(path, json.dumps(layout, indent=2).encode())


#: the ports a node of the layout uses: Raft peers, the internal service, its member proxy, and
#: the member proxy's JSON gateway (with --gateway-port)
_PORT_KEYS = ("peer_port", "internal_port", "client_port", "gateway_port")
#: keys an older layout may lack
_LATER_KEYS = ("client_port", "gateway_port")


def _check_distinct(path: Path, layout: list[dict[str, Any]], client_port: int, gateway_port: int | None = None
                    ) -> None:
    """Refuses a layout that puts two servers on one port (an older raftgate could write one)."""
    users: dict[int, list[str]] = {client_port: ["the proxy (--client-port)"]}
    if gateway_port is not None:
        users.setdefault(gateway_port, []).append("the proxy's gateway (--gateway-port)")
    for n in layout:
        for key in _PORT_KEYS:
            if key in n:
                users.setdefault(int(n[key]), []).append(f"{n['name']} {key}")
    clashes = {port: who for port, who in users.items() if len(who) > 1}
    if clashes:
        detail = "; ".join(f"port {port}: {', '.join(who)}" for port, who in sorted(clashes.items()))
        raise SystemExit(f"raftgate local: {path} puts two servers on one port ({detail}); refusing to start. "
                         "Choose another --client-port if the proxy is one of them; otherwise start from an empty "
                         "--data-dir")


class Child(Process):
    """A store node or a proxy (``raftgate.cli`` with ``args``), its exit code reported once."""

    def __init__(self, role: str, args: list[str], ready_prefix: str) -> None:
        super().__init__(role, ["-m", "raftgate.cli", *args], ready_prefix=ready_prefix)
        self.role = role
        self.reported = False
        self.died_serving = False  # exited before a stop was asked for (reported, not a failed stop)

    def report_exit(self) -> None:
        """Prints the child's exit code once, whichever of its watcher and the stop sees it first."""
        if self.proc is None or self.proc.returncode is None or self.reported:
            return
        self.reported = True
        print(f"raftgate local: {self.role} exited with code {self.proc.returncode}", file=sys.stderr, flush=True)


async def run(a: LocalConfig, check_store: CheckStore | None = None, check_proxy: CheckProxy | None = None) -> int:
    data_dir = Path(a.data_dir).resolve()
    try:
        # It holds the internal secret and every node's data: a new one is made 0700; an existing
        # wider one is named in one warning and left as it is, as etcd and the store do. The
        # umask is not narrowed here: the proxies local starts keep theirs (unix:// sockets).
        if private_dir(data_dir) and (wider := wider_than_private(data_dir)) is not None:
            print(f"raftgate local: WARNING: {wider}", file=sys.stderr, flush=True)
        lock = _lock(data_dir)
    except OSError as exc:
        print(f"raftgate local: --data-dir {str(data_dir)!r}: {exc.strerror}", file=sys.stderr, flush=True)
        return 1
    if lock is None:  # kept open (and locked) until the process ends
        return 1
    secret = _secret_file(data_dir)
    client_url = f"{a.scheme}://127.0.0.1:{a.client_port}"
    layout = _layout(data_dir, a.nodes, a.client_port, a.gateway_port,
                     reserved=[addr.port for addr in a.metrics_addrs() if addr is not None])
    initial_cluster = ",".join(f"{n['name']}=http://127.0.0.1:{n['peer_port']}" for n in layout)
    for n in layout:
        n["argv"] = [
            "store", "--name", n["name"], "--data-dir", n["data_dir"],
            "--listen-internal-urls", f"http://127.0.0.1:{n['internal_port']}", "--internal-secret-file", str(secret),
            "--listen-peer-urls", f"http://127.0.0.1:{n['peer_port']}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{n['peer_port']}", "--peer-secret-file", str(secret),
            "--initial-cluster", initial_cluster, "--advertise-client-urls", f"{a.scheme}://127.0.0.1:{n['client_port']}",
        ]  # fmt: skip
        if a.gateway_port is not None:  # the member proxy's gateway: what the gateway's member list names
            n["argv"] += ["--advertise-gateway-urls", f"http://127.0.0.1:{n['gateway_port']}"]
        for dest, value in a.store_flags:
            n["argv"] += ["--" + dest.replace("_", "-"), value]
        if a.initial_root_password_file:
            n["argv"] += ["--initial-root-password-file", str(a.initial_root_password_file)]
            if a.bcrypt_cost is not None:
                n["argv"] += ["--bcrypt-cost", str(a.bcrypt_cost)]
    metrics = a.metrics_addrs()
    for n, addr in zip(layout, metrics, strict=False):
        if addr is not None:
            n["metrics_addr"] = str(addr)
            n["argv"] += ["--metrics-addr", str(addr)]
    stores = [Child(f"store {n['name']}", n["argv"], "raftgate store:") for n in layout]
    endpoints = ",".join(f"127.0.0.1:{n['internal_port']}" for n in layout)
    common = ["--store-endpoints", endpoints, "--internal-secret-file", str(secret)]
    for dest, value in a.proxy_flags:
        common += ["--" + dest.replace("_", "-"), value]
    proxy_args = ["proxy", "--listen-client-urls", client_url, *common]
    if a.audit_log is not None:
        proxy_args += ["--audit-log", a.audit_log]
    if a.gateway_port is not None:
        proxy_args += ["--listen-gateway-urls", f"http://127.0.0.1:{a.gateway_port}",
                       "--host-whitelist", a.host_whitelist]
        if a.cors is not None:
            proxy_args += ["--cors", a.cors]
    if metrics[a.nodes] is not None:
        proxy_args += ["--metrics-addr", str(metrics[a.nodes])]
    if a.proxy_workers > 1:
        proxy_args += ["--workers", str(a.proxy_workers)]
    try:
        check_children(a, [n["argv"] for n in layout], proxy_args, os.environ, check_store, check_proxy)
    except ConfigError as exc:
        print(f"raftgate local: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        check_ports(a, data_dir / "layout.json", layout)
    except OSError as exc:
        print(f"raftgate local: {exc}", file=sys.stderr, flush=True)
        return 1
    proxy = Child("proxy", proxy_args, "raftgate proxy:")
    for n, addr in zip(layout, metrics[a.nodes + 1:], strict=True):
        n["proxy_argv"] = ["proxy", "--listen-client-urls", f"{a.scheme}://127.0.0.1:{n['client_port']}", *common,
                           "--member-store-endpoint", f"127.0.0.1:{n['internal_port']}"]  # fmt: skip
        if addr is not None:
            n["proxy_argv"] += ["--metrics-addr", str(addr)]
        if a.gateway_port is not None:
            n["proxy_argv"] += ["--listen-gateway-urls", f"http://127.0.0.1:{n['gateway_port']}",
                                "--host-whitelist", a.host_whitelist]
            if a.cors is not None:
                n["proxy_argv"] += ["--cors", a.cors]
        member_audit = a.audit_log_of(n["name"])
        if member_audit is not None:
            n["proxy_argv"] += ["--audit-log", member_audit]
    members = [Child(f"proxy {n['name']}", n["proxy_argv"], "raftgate proxy:") for n in layout]
    children = [*stores, proxy, *members]
    state_file = data_dir / "local.json"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    stop_on_signals(stop)
    if a.audit_log not in (None, "-"):
        # logrotate's SIGHUP: every proxy reopens its audit log (one not serving yet is left alone)
        on_sighup(lambda: pass_on(signal.SIGHUP, (proxy, *members)))
    code = 0
    stopped_starting = False
    try:
        await asyncio.gather(*(store.start() for store in stores))
        await asyncio.gather(proxy.start(), *(m.start() for m in members))
        processes: list[dict[str, Any]] = [
            {"role": "store", "pid": s.proc.pid if s.proc else None,
             **{k: v for k, v in n.items() if k != "proxy_argv"}} for s, n in zip(stores, layout, strict=True)
        ]
        processes += [{"role": "member-proxy", "pid": m.proc.pid if m.proc else None, "member": n["name"],
                       "client_port": n["client_port"], "argv": n["proxy_argv"]}
                      | ({"gateway_port": n["gateway_port"]} if a.gateway_port is not None else {})
                      | ({} if addr is None else {"metrics_addr": str(addr)})
                      for m, n, addr in zip(members, layout, metrics[a.nodes + 1:], strict=True)]  # fmt: skip
        processes.append({"role": "proxy", "pid": proxy.proc.pid if proxy.proc else None,
                          "client_port": a.client_port, "gateway_port": a.gateway_port,
                          "argv": proxy_args})  # fmt: skip
        if metrics[a.nodes] is not None:
            processes[-1]["metrics_addr"] = str(metrics[a.nodes])
        state = {"client_url": client_url, "data_dir": str(data_dir), "python": sys.executable,
                 "processes": processes}  # fmt: skip
        write_private(state_file, json.dumps(state, indent=2).encode())
        print(f"raftgate local: ready on 127.0.0.1:{a.client_port}", flush=True)
        # A store node (or a member proxy) that dies is reported but does not stop the others: the
        # cluster keeps serving while a quorum lives. The proxy is the endpoint: if it dies,
        # everything stops.
        for child in [*stores, *members]:
            loop.create_task(_report_exit(child, stop))
        assert proxy.proc is not None
        proxy_exit = asyncio.ensure_future(proxy.proc.wait())
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait([stopped, proxy_exit], return_when=asyncio.FIRST_COMPLETED)
        if stopped not in done:
            print("raftgate local: the proxy exited; stopping", file=sys.stderr)
            code = 1
        stopped.cancel()
    except RuntimeError as exc:
        if stop.is_set():  # SIGTERM/SIGINT while starting: the children stop as asked, a clean stop
            print("raftgate local: stopped while starting", file=sys.stderr)
            stopped_starting = True
        else:
            print(f"raftgate local: {exc}", file=sys.stderr)
            code = 1
    finally:
        # Each child's exit code is printed; one that does not stop cleanly fails the stop. The
        # proxies go first (no request meets a stopping store), then the store nodes together.
        await asyncio.gather(proxy.stop(), *(m.stop() for m in members))
        await asyncio.gather(*(store.stop() for store in stores))
        for child in children:
            child.report_exit()
        # a child the stop reached before its own signal handler was set ends by the signal itself
        if any(c.proc is not None and c.proc.returncode != 0 and not c.died_serving
               and not (stopped_starting and c.proc.returncode in STOPPED_BY_SIGNAL) for c in children):
            code = 1
        state_file.unlink(missing_ok=True)
    return code


async def _report_exit(child: Child, stop: asyncio.Event) -> None:
    assert child.proc is not None
    await child.proc.wait()
    child.died_serving = not stop.is_set()
    child.report_exit()


def main(argv: list[str], check_store: CheckStore | None = None, check_proxy: CheckProxy | None = None) -> int:
    """``check_store``, ``check_proxy``: the store's and the proxy's config parsers (raftgate.cli
    passes them), to check every child's values before any starts."""
    try:
        config = parse(argv, os.environ)
        event_loop.chosen(os.environ)  # every child reads it: a wrong value is local's start-up error
    except (ConfigError, ValueError) as exc:
        print(f"raftgate local: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(run(config, check_store, check_proxy))
