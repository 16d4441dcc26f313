"""The store program's configuration: one typed object built from flags and environment.

Flags follow etcd's names where etcd has one; every flag can also come from an environment
variable RAFTGATE_STORE_<FLAG> (upper case, dashes as underscores). Bad values stop start-up with
a message naming the flag.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


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
    peer_urls: list[str] = field(default_factory=list)
    initial_cluster_token: str = "etcd-cluster"
    max_txn_ops: int = 128
    quota_backend_bytes: int = 2 << 30
    log_level: str = "info"


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
    p.add_argument("--initial-advertise-peer-urls", default="http://127.0.0.1:2380", help="peer URLs of this member")
    p.add_argument("--initial-cluster-token", default="etcd-cluster")
    p.add_argument("--max-txn-ops", type=int, default=128)
    p.add_argument("--quota-backend-bytes", type=int, default=2 << 30)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warn", "error"])
    return p


def _env_defaults(p: argparse.ArgumentParser) -> None:
    for action in p._actions:
        if not action.option_strings or action.dest == "help":
            continue
        env = "RAFTGATE_STORE_" + action.dest.upper()
        if env in os.environ:
            action.default = action.type(os.environ[env]) if action.type else os.environ[env]


def _urls(raw: str) -> list[str]:
    return [u.strip() for u in raw.split(",") if u.strip()]


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
                      max_txn_ops=a.max_txn_ops, quota_backend_bytes=a.quota_backend_bytes, log_level=a.log_level)
    if tls:
        for flag in ("cert_file", "key_file", "trusted_ca_file"):
            value = getattr(a, flag)
            if not value or not Path(value).is_file():
                raise ConfigError(f"--{flag.replace('_', '-')}: an https internal URL needs this file (mTLS)")
            setattr(cfg, flag, Path(value))
    if a.internal_secret_file:
        try:
            secret = Path(a.internal_secret_file).read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"--internal-secret-file: {exc.strerror}") from exc
        if len(secret) < 16:
            raise ConfigError("--internal-secret-file: the secret must be at least 16 bytes")
        cfg.secret = secret
    if not tls and cfg.secret is None:
        raise ConfigError("the internal port must be authenticated: use https:// with --cert-file/--key-file/"
                          "--trusted-ca-file (mTLS), or --internal-secret-file in development")
    if cfg.max_txn_ops < 1:
        raise ConfigError("--max-txn-ops must be at least 1")
    if cfg.quota_backend_bytes < 1 << 20:
        raise ConfigError("--quota-backend-bytes must be at least 1 MiB")
    return cfg
