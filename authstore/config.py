"""The store program's configuration: one typed object built from flags and environment.

Flags follow etcd's names where etcd has one; every flag can also come from an environment
variable RAFTGATE_STORE_<FLAG> (upper case, dashes as underscores), and a flag with etcd's name
from etcd's ETCD_<FLAG> too (flag > RAFTGATE_STORE_* > ETCD_*). Bad values stop start-up with
a message naming the flag.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from authstore.state.auth.initial_root import DEFAULT_COST, MAX_COST, MIN_COST
from raftgate.observe import ObserveConfig, add_observe_flags, observe_config
from raftgate.password_file import PasswordFileError, read_password_file


class ConfigError(Exception):
    pass


@dataclass
class StoreConfig:
    name: str
    data_dir: Path
    listen_host: str
    listen_port: int
    tls: bool = False
    secret: bytes | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    trusted_ca_file: Path | None = None
    advertise_client_urls: list[str] = field(default_factory=list)
    #: where proxies reach this node's internal port; published in the member list they follow
    advertise_internal_urls: list[str] = field(default_factory=list)
    peer_urls: list[str] = field(default_factory=list)
    listen_peer_host: str = "127.0.0.1"
    listen_peer_port: int = 2380
    peer_tls: bool = False
    peer_secret: bytes | None = None
    peer_cert_file: Path | None = None
    peer_key_file: Path | None = None
    peer_trusted_ca_file: Path | None = None
    initial_cluster: list[tuple[str, list[str]]] = field(default_factory=list)
    initial_cluster_state: str = "new"
    initial_cluster_token: str = "etcd-cluster"
    heartbeat_interval_ms: int = 100
    election_timeout_ms: int = 1000
    snapshot_count: int = 10_000
    snapshot_catchup_entries: int = 5_000
    max_txn_ops: int = 128
    quota_backend_bytes: int = 2 << 30
    max_watches_per_stream: int = 10_000
    max_watches_per_user: int = 20_000
    log_level: str = "info"
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    #: root's password for a NEW cluster (hashed at start-up; never logged, never in the log)
    initial_root_password: str | None = field(default=None, repr=False)
    bcrypt_cost: int = DEFAULT_COST


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="raftgate store", description="Run one authstore node.")
    p.add_argument("--name", default="default", help="human-readable name of this member")
    p.add_argument("--data-dir", default=None,
                   help="directory for the log and the LMDB store (default: NAME.raftgate)")
    p.add_argument("--listen-internal-urls", default="http://127.0.0.1:23790",
                   help="where authenticated proxies reach this node (https:// requires mTLS files)")
    p.add_argument("--internal-secret-file", default=None,
                   help="development only: file with a shared secret every proxy must present")
    p.add_argument("--cert-file", default=None, help="server certificate for the internal port (mTLS)")
    p.add_argument("--key-file", default=None, help="server key for the internal port (mTLS)")
    p.add_argument("--trusted-ca-file", default=None, help="CA that signs the proxies' client certificates")
    p.add_argument("--advertise-client-urls", default="", help="client URLs shown by MemberList (the proxies')")
    p.add_argument("--advertise-internal-urls", default="",
                   help="where proxies reach this node's internal port, published to them in the member list "
                        "(default: --listen-internal-urls unless it listens on a wildcard address)")
    p.add_argument("--initial-advertise-peer-urls", default="http://127.0.0.1:2380", help="peer URLs of this member")
    p.add_argument("--listen-peer-urls", default="http://127.0.0.1:2380",
                   help="where other store nodes reach this one (https:// requires the --peer-* files)")
    p.add_argument("--peer-cert-file", default=None, help="certificate for peer traffic (mTLS, both directions)")
    p.add_argument("--peer-key-file", default=None, help="key for peer traffic")
    p.add_argument("--peer-trusted-ca-file", default=None, help="CA that signs every store node's peer certificate")
    p.add_argument("--peer-secret-file", default=None,
                   help="development only: file with a shared secret every store node presents")
    p.add_argument("--initial-cluster", default=None,
                   help="name=peer-url,... of the members a new cluster starts with (default: this member alone)")
    p.add_argument("--initial-cluster-state", default="new", choices=["new", "existing"],
                   help="new: bootstrap a cluster; existing: join one after MemberAdd")
    p.add_argument("--initial-cluster-token", default="etcd-cluster")
    p.add_argument("--heartbeat-interval", type=int, default=100, help="milliseconds between heartbeats")
    p.add_argument("--election-timeout", type=int, default=1000, help="milliseconds before a follower campaigns")
    p.add_argument("--snapshot-count", type=int, default=10_000,
                   help="applied entries between snapshots (log compaction)")
    p.add_argument("--snapshot-catchup-entries", type=int, default=5_000,
                   help="entries kept after a snapshot for slow followers")
    p.add_argument("--max-txn-ops", type=int, default=128)
    p.add_argument("--quota-backend-bytes", type=int, default=2 << 30)
    p.add_argument("--max-watches-per-stream", type=int, default=10_000,
                   help="open watches one watch stream may hold; a create beyond it is refused in-band")
    p.add_argument("--max-watches-per-user", type=int, default=20_000,
                   help="open watches one user may hold on this node, over all streams (anonymous: one user)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])
    p.add_argument("--initial-root-password-file", default=None,
                   help="a NEW cluster starts with user root (role root, this password) and authentication "
                        "enabled as its first log entries; ignored on existing data. Give every initial member "
                        "the same file")
    p.add_argument("--bcrypt-cost", type=int, default=DEFAULT_COST,
                   help=f"bcrypt cost of the initial root password's hash, {MIN_COST}..{MAX_COST} "
                        f"(default and out of range: {DEFAULT_COST})")
    add_observe_flags(p)
    return p


#: The flags etcd has too, with the same meaning: read from etcd's ETCD_<FLAG> as well, so the
#: lines `etcdctl member add` prints (ETCD_NAME=..., ETCD_INITIAL_CLUSTER=...) work as printed.
ETCD_FLAGS = frozenset({
    "name", "data-dir", "cert-file", "key-file", "trusted-ca-file", "advertise-client-urls",
    "initial-advertise-peer-urls", "listen-peer-urls", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file",
    "initial-cluster", "initial-cluster-state", "initial-cluster-token", "heartbeat-interval", "election-timeout",
    "snapshot-count", "snapshot-catchup-entries", "max-txn-ops", "quota-backend-bytes", "log-level", "bcrypt-cost",
})


def _env_names(action: argparse.Action) -> list[str]:
    """The environment variables of a flag, strongest first: RAFTGATE_STORE_<FLAG>, then (a flag
    with etcd's name) etcd's own rule, ETCD_ + the flag upper-cased with dashes as underscores."""
    flag = action.option_strings[0].removeprefix("--")
    names = ["RAFTGATE_STORE_" + action.dest.upper()]
    if flag in ETCD_FLAGS:
        names.append("ETCD_" + flag.upper().replace("-", "_"))
    return names


def _env_defaults(p: argparse.ArgumentParser) -> None:
    for action in p._actions:
        if not action.option_strings or action.dest == "help":
            continue
        env = next((name for name in _env_names(action) if name in os.environ), None)
        if env is None:
            continue
        flag = action.option_strings[0]
        try:
            value = action.type(os.environ[env]) if action.type else os.environ[env]
        except ValueError:
            raise ConfigError(f"{env}: {os.environ[env]!r} is not a valid value for {flag}") from None
        if action.choices is not None and value not in action.choices:  # argparse checks flags only
            raise ConfigError(f"{env}: {os.environ[env]!r} is not one of {', '.join(map(str, action.choices))} "
                              f"({flag})")
        action.default = value


def _urls(raw: str) -> list[str]:
    return [u.strip() for u in raw.split(",") if u.strip()]


def _read_secret(flag: str, path: str) -> bytes:
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"--{flag}: {exc.strerror}") from exc
    if len(secret) < 16:
        raise ConfigError(f"--{flag}: the secret must be at least 16 bytes")
    return secret


def _host_port(flag: str, url: str) -> tuple[str, int, bool]:
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname or not u.port:
        raise ConfigError(f"--{flag}: {url!r} is not http(s)://host:port")
    return u.hostname, u.port, u.scheme == "https"


def parse_initial_cluster(raw: str) -> list[tuple[str, list[str]]]:
    """etcd's ``name=url,name=url`` (a name may repeat, one URL each)."""
    members: dict[str, list[str]] = {}
    for part in raw.split(","):
        name, eq, url = part.strip().partition("=")
        if not eq or not name or not url:
            raise ConfigError(f"--initial-cluster: {part.strip()!r} is not name=url")
        _host_port("initial-cluster", url)
        members.setdefault(name, []).append(url)
    return list(members.items())


def _peer_config(cfg: StoreConfig, a: argparse.Namespace) -> None:
    listen = _urls(a.listen_peer_urls)
    if len(listen) != 1:
        raise ConfigError("--listen-peer-urls: give exactly one URL")
    cfg.listen_peer_host, cfg.listen_peer_port, cfg.peer_tls = _host_port("listen-peer-urls", listen[0])
    for url in cfg.peer_urls:
        _host_port("initial-advertise-peer-urls", url)
    if cfg.peer_tls:
        for flag in ("peer_cert_file", "peer_key_file", "peer_trusted_ca_file"):
            value = getattr(a, flag)
            if not value or not Path(value).is_file():
                raise ConfigError(f"--{flag.replace('_', '-')}: an https peer URL needs this file (mTLS)")
            setattr(cfg, flag, Path(value))
    if a.peer_secret_file:
        cfg.peer_secret = _read_secret("peer-secret-file", a.peer_secret_file)
    if not cfg.peer_tls and cfg.peer_secret is None:
        raise ConfigError("peer traffic must be authenticated: use https:// with --peer-cert-file/--peer-key-file/"
                          "--peer-trusted-ca-file (mTLS), or --peer-secret-file in development")
    cfg.initial_cluster = parse_initial_cluster(a.initial_cluster or f"{cfg.name}={','.join(cfg.peer_urls)}")
    mine = dict(cfg.initial_cluster).get(cfg.name)
    if mine is None:
        raise ConfigError(f"--initial-cluster: has no member named {cfg.name!r} (--name)")
    if sorted(mine) != sorted(cfg.peer_urls):
        raise ConfigError(f"--initial-cluster: {cfg.name}'s URLs {mine} differ from --initial-advertise-peer-urls")
    cfg.initial_cluster_state = a.initial_cluster_state
    cfg.heartbeat_interval_ms, cfg.election_timeout_ms = a.heartbeat_interval, a.election_timeout
    if cfg.heartbeat_interval_ms < 1 or cfg.election_timeout_ms < 5 * cfg.heartbeat_interval_ms:
        raise ConfigError("--election-timeout must be at least 5 times --heartbeat-interval (etcd's rule)")
    cfg.snapshot_count, cfg.snapshot_catchup_entries = a.snapshot_count, a.snapshot_catchup_entries
    if cfg.snapshot_count < 1 or cfg.snapshot_catchup_entries < 0:
        raise ConfigError("--snapshot-count must be positive and --snapshot-catchup-entries not negative")


def parse(argv: list[str]) -> StoreConfig:
    p = _parser()
    _env_defaults(p)
    a = p.parse_args(argv)
    listen = _urls(a.listen_internal_urls)
    if len(listen) != 1:
        raise ConfigError("--listen-internal-urls: give exactly one URL")
    u = urlsplit(listen[0])
    if u.scheme not in ("http", "https") or not u.hostname or not u.port:
        raise ConfigError(f"--listen-internal-urls: {listen[0]!r} is not http(s)://host:port")
    tls = u.scheme == "https"
    cfg = StoreConfig(name=a.name, data_dir=Path(a.data_dir or f"{a.name}.raftgate"), listen_host=u.hostname,
                      listen_port=u.port, tls=tls, advertise_client_urls=_urls(a.advertise_client_urls),
                      peer_urls=_urls(a.initial_advertise_peer_urls), initial_cluster_token=a.initial_cluster_token,
                      max_txn_ops=a.max_txn_ops, quota_backend_bytes=a.quota_backend_bytes, log_level=a.log_level,
                      max_watches_per_stream=a.max_watches_per_stream, max_watches_per_user=a.max_watches_per_user)
    if tls:
        for flag in ("cert_file", "key_file", "trusted_ca_file"):
            value = getattr(a, flag)
            if not value or not Path(value).is_file():
                raise ConfigError(f"--{flag.replace('_', '-')}: an https internal URL needs this file (mTLS)")
            setattr(cfg, flag, Path(value))
    if a.internal_secret_file:
        cfg.secret = _read_secret("internal-secret-file", a.internal_secret_file)
    if not tls and cfg.secret is None:
        raise ConfigError("the internal port must be authenticated: use https:// with --cert-file/--key-file/"
                          "--trusted-ca-file (mTLS), or --internal-secret-file in development")
    cfg.advertise_internal_urls = _urls(a.advertise_internal_urls)
    for url in cfg.advertise_internal_urls:
        _host_port("advertise-internal-urls", url)
    if not cfg.advertise_internal_urls and u.hostname not in ("0.0.0.0", "::", "[::]"):
        cfg.advertise_internal_urls = [listen[0]]
    _peer_config(cfg, a)
    if cfg.max_txn_ops < 1:
        raise ConfigError("--max-txn-ops must be at least 1")
    if cfg.quota_backend_bytes < 1 << 20:
        raise ConfigError("--quota-backend-bytes must be at least 1 MiB")
    for flag in ("max_watches_per_stream", "max_watches_per_user"):
        if getattr(cfg, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1")
    cfg.observe = observe_config(a, ConfigError)
    # Out of range -> the default, as etcd (and the proxy) do for --bcrypt-cost.
    cfg.bcrypt_cost = a.bcrypt_cost if MIN_COST <= a.bcrypt_cost <= MAX_COST else DEFAULT_COST
    if a.initial_root_password_file:
        try:
            cfg.initial_root_password = read_password_file(a.initial_root_password_file)
        except PasswordFileError as exc:
            raise ConfigError(f"--initial-root-password-file: {exc}") from None
    return cfg
