"""The proxy's configuration: one typed object built from flags (etcd's names) and environment
variables (``RAFTGATE_PROXY_<FLAG>``, flags win), validated at start-up by ``load(argv, env)`` in
raftgate's one config idiom (raftgate.config_support).

Every bad value is a ConfigError with a message naming the flag, or the environment variable it
came from; the program exits with code 2.
A bcrypt cost out of range becomes the default, as in etcd; a token TTL <= 0 is an error (etcd
silently uses 300 s).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from proxy.identity_file import JWT as IDENTITY_JWT
from proxy.identity_file import PASSWORD as IDENTITY_PASSWORD
from proxy.identity_file import IdentityFileError, IdentitySpec, read_credential
from proxy.passwords import DEFAULT_COST, MAX_COST, MIN_COST, QUEUE_PER_WORKER
from proxy.sidecar import is_local_listener
from proxy.store_client import InternalTLS
from proxy.tokens.jwt import JwtProvider
from proxy.tokens.options import JWT, SIMPLE, AuthOptionError, AuthTokenSpec, parse_auth_token
from raftgate.config_support import (
    ConfigError,
    FlagParser,
    Flags,
    comma_list,
    host_port,
    integer,
    parse_flags,
    prefixed,
    read_file,
)
from raftgate.observe import ObserveConfig, add_observe_flags, observe_config

log = logging.getLogger(__name__)

ENV_PREFIX = "RAFTGATE_PROXY_"
DEFAULT_LISTEN = "http://127.0.0.1:2379"
DEFAULT_TOKEN_TTL = 300
DEFAULT_MAX_REQUEST_BYTES = 1572864  # etcd's embed.DefaultMaxRequestBytes (1.5 MiB)
GRPC_OVERHEAD_BYTES = 512 * 1024  # etcd: grpc max receive = max-request-bytes + grpcOverheadBytes
MAX_SECRET_BYTES = 4096

__all__ = ["ConfigError", "ProxyConfig", "load"]


@dataclass(frozen=True)
class ProxyConfig:
    #: gRPC bind addresses ("127.0.0.1:2379", "unix:/path").
    listen: tuple[str, ...]
    store_endpoints: tuple[str, ...]
    internal_secret: str | None
    internal_tls: InternalTLS | None
    auth_token: AuthTokenSpec
    #: Built (keys loaded and checked) when --auth-token is jwt.
    jwt: JwtProvider | None
    auth_token_ttl: int
    bcrypt_cost: int
    max_request_bytes: int
    bcrypt_workers: int
    #: --metrics-addr / --health-addr (both off by default).
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    #: Sidecar identity mode (--identity-file / --identity-jwt-file), lent on local listeners only.
    identity: IdentitySpec | None = None
    #: bcrypt jobs that may wait for a worker before `too many requests` (None: 4 per worker).
    bcrypt_queue_limit: int | None = None
    #: --listen-gateway-urls: where the JSON gateway (proxy/gateway.py) listens; empty: off.
    listen_gateway: tuple[str, ...] = ()
    #: --member-store-endpoint: the store node this proxy stands for (None: none)
    member_store_endpoint: str | None = None
    #: --store-reads: Range spread over the store's voters (True) or sent to the leader
    spread_reads: bool = False

    @property
    def grpc_max_receive_bytes(self) -> int:
        return self.max_request_bytes + GRPC_OVERHEAD_BYTES


def _parser() -> FlagParser:
    p = FlagParser(prog="raftgate proxy", description="The raftgate auth proxy: serves the etcd v3 API.")
    p.add_argument("--listen-client-urls", default=DEFAULT_LISTEN,
                   help=f"comma list of http:// or unix:// URLs (default {DEFAULT_LISTEN})")
    p.add_argument("--store-endpoints", help="comma list of every store node's host:port (requests go to the leader)")
    p.add_argument(
        "--member-store-endpoint",
        help="host:port of the one store node this proxy stands for (a member's advertised client URL): "
        "Status, Hash and HashKV go to it, everything else to the leader",
    )
    p.add_argument("--internal-secret-file", help="file holding the shared secret for the store (development)")
    p.add_argument("--internal-cert", help="client certificate (PEM) for mTLS to the store")
    p.add_argument("--internal-key", help="client key (PEM) for mTLS to the store")
    p.add_argument("--internal-ca", help="CA bundle (PEM) that signed the store's certificate")
    p.add_argument("--auth-token", default=SIMPLE,
                   help='"simple" (default), "jwt,pub-key=..,priv-key=..,sign-method=..,ttl=.." or ""')
    p.add_argument("--auth-token-ttl", default=DEFAULT_TOKEN_TTL,
                   help=f"simple token sliding TTL in seconds (default {DEFAULT_TOKEN_TTL})")
    p.add_argument("--bcrypt-cost", default=DEFAULT_COST,
                   help=f"bcrypt cost for new passwords, {MIN_COST}..{MAX_COST} (default {DEFAULT_COST})")
    p.add_argument("--max-request-bytes", default=DEFAULT_MAX_REQUEST_BYTES,
                   help=f"largest request accepted (default {DEFAULT_MAX_REQUEST_BYTES})")
    p.add_argument("--bcrypt-workers", help="threads checking passwords (default: CPU count)")
    p.add_argument(
        "--bcrypt-queue-limit",
        help=f"bcrypt jobs that may wait for a free worker; beyond it Authenticate, UserAdd and "
        f"UserChangePassword get 'too many requests' (default {QUEUE_PER_WORKER} per worker)",
    )
    p.add_argument(
        "--listen-gateway-urls",
        help="comma list of http:// or unix:// URLs serving etcd's JSON gateway (POST /v3/kv/range, ...); "
        "default: off",
    )
    add_observe_flags(p)
    p.add_argument(
        "--identity-file",
        help="sidecar identity mode: a directory with files 'username' and 'password' (a mounted Secret) "
        "or a file of two lines (user name, password); token-less requests from loopback or unix:// "
        "clients are sent as this user",
    )
    p.add_argument(
        "--identity-jwt-file",
        help="sidecar identity mode with an externally minted JWT (etcd claims username/revision; "
        "needs --auth-token jwt with the matching key): a file, or a directory holding 'token'",
    )
    p.add_argument(
        "--store-reads", default="leader", choices=("spread", "leader"),
        help="where Range requests go: 'spread' over every voting store node (each answers a "
        "linearizable read by ReadIndex, as any etcd member does) or the 'leader' only (default: "
        "leader; spreading pays where each node has cores of its own)",
    )
    return p


def load(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProxyConfig:
    """``(argv, env)`` -> ProxyConfig (env: os.environ when None); raises ConfigError (SystemExit(0)
    for --help)."""
    f = parse_flags(_parser(), argv, os.environ if env is None else env, prefixed(ENV_PREFIX))
    listen = _listen_urls(f)
    stores = _store_endpoints(f)
    member = (f["member_store_endpoint"] or "").strip() or None
    if member is not None:
        host_port(f.source("member_store_endpoint"), member)
    secret = _read_secret(f)
    tls = _read_tls(f)
    if secret is None and tls is None:
        raise ConfigError(
            "the store needs an internal credential: --internal-secret-file, "
            "or --internal-cert/--internal-key/--internal-ca"
        )
    spec, jwt = _auth_token(f)
    # etcd swaps a TTL <= 0 for 300 s without a word; a typo that silently changes the TTL is worse.
    ttl = integer(f, "auth_token_ttl", 1)
    cost = integer(f, "bcrypt_cost")
    if not MIN_COST <= cost <= MAX_COST:
        log.warning("%s %d is out of range %d..%d; using %d", f.source("bcrypt_cost"), cost, MIN_COST, MAX_COST,
                    DEFAULT_COST)
        cost = DEFAULT_COST
    max_bytes = integer(f, "max_request_bytes", 1, 2**31 - 1 - GRPC_OVERHEAD_BYTES)
    workers = integer(f, "bcrypt_workers", 1) if f["bcrypt_workers"] is not None else os.cpu_count() or 1
    queue_limit = integer(f, "bcrypt_queue_limit", 0) if f["bcrypt_queue_limit"] is not None \
        else QUEUE_PER_WORKER * workers
    observe = observe_config(
        argparse.Namespace(metrics_addr=f["metrics_addr"], health_addr=f["health_addr"]), ConfigError,
        {dest: f.source(dest) for dest in ("metrics_addr", "health_addr")},
    )
    gateway = _listen_urls(f, "listen_gateway_urls") if f["listen_gateway_urls"] else ()
    identity = _identity(f, listen, spec, jwt)
    return ProxyConfig(
        listen=listen,
        store_endpoints=stores,
        internal_secret=secret,
        internal_tls=tls,
        auth_token=spec,
        jwt=jwt,
        auth_token_ttl=ttl,
        bcrypt_cost=cost,
        max_request_bytes=max_bytes,
        bcrypt_workers=workers,
        observe=observe,
        identity=identity,
        bcrypt_queue_limit=queue_limit,
        listen_gateway=gateway,
        member_store_endpoint=member,
        spread_reads=f["store_reads"] == "spread",
    )


def _listen_urls(f: Flags, dest: str = "listen_client_urls") -> tuple[str, ...]:
    """--listen-client-urls or --listen-gateway-urls: http://host:port or unix://path URLs."""
    source = f.source(dest)
    out: list[str] = []
    for url in comma_list(f[dest] or ""):
        parts = urlsplit(url)
        if parts.scheme == "unix":
            path = (parts.netloc + parts.path) or ""
            if not path:
                raise ConfigError(f"{source}: {url!r} has no socket path")
            out.append(f"unix:{path}")
        elif parts.scheme == "http":
            if parts.path not in ("", "/") or parts.query or parts.fragment:
                raise ConfigError(f"{source}: {url!r} must be http://host:port")
            host_port(source, parts.netloc)
            out.append(parts.netloc)
        elif parts.scheme == "https":
            raise ConfigError(f"{source}: {url!r}: https:// is not supported yet (use http:// or unix://)")
        else:
            raise ConfigError(f"{source}: {url!r} must start with http:// or unix://")
    if not out:
        raise ConfigError(f"{source} is empty")
    return tuple(out)


def _store_endpoints(f: Flags) -> tuple[str, ...]:
    source = f.source("store_endpoints")
    if not f["store_endpoints"]:
        raise ConfigError(f"{source} is required (comma list of host:port)")
    endpoints = tuple(comma_list(f["store_endpoints"]))
    if not endpoints:
        raise ConfigError(f"{source} is empty")
    if any(host_port(source, e)[1] == 0 for e in endpoints):
        raise ConfigError(f"{source}: port 0 is not a store address")
    return endpoints


def _read_secret(f: Flags) -> str | None:
    path = f["internal_secret_file"]
    if not path:
        return None
    source = f.source("internal_secret_file")
    data = read_file(source, path, MAX_SECRET_BYTES).strip()
    if not data:
        raise ConfigError(f"{source}: {path!r} is empty")
    try:
        secret = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: the secret must be printable ASCII") from None
    if not secret.isprintable():
        raise ConfigError(f"{source}: the secret must be printable ASCII")
    return secret


def _read_tls(f: Flags) -> InternalTLS | None:
    dests = ("internal_cert", "internal_key", "internal_ca")
    given = [dest for dest in dests if f[dest]]
    if not given:
        return None
    if len(given) != 3:
        raise ConfigError("--internal-cert, --internal-key and --internal-ca must be given together")
    ca, cert, key = (read_file(f.source(dest), f[dest]) for dest in ("internal_ca", "internal_cert", "internal_key"))
    return InternalTLS(ca=ca, cert=cert, key=key)


def _identity(f: Flags, listen: tuple[str, ...], spec: AuthTokenSpec, jwt: JwtProvider | None) -> IdentitySpec | None:
    """Checks the sidecar identity can work with this configuration, and reads its files once."""
    password_path, jwt_path = f["identity_file"], f["identity_jwt_file"]
    if password_path and jwt_path:
        raise ConfigError("--identity-file and --identity-jwt-file are mutually exclusive")
    if not password_path and not jwt_path:
        return None
    flag = f.source("identity_file" if password_path else "identity_jwt_file")
    if password_path:
        identity = IdentitySpec(IDENTITY_PASSWORD, password_path)
    else:
        identity = IdentitySpec(IDENTITY_JWT, jwt_path or "")
    if not any(is_local_listener(address) for address in listen):
        raise ConfigError(
            f"{flag}: the identity is lent only on loopback or unix:// listeners, and "
            "--listen-client-urls has none"
        )
    if identity.kind == IDENTITY_PASSWORD and (spec.kind not in (SIMPLE, JWT) or (jwt is not None and jwt.verify_only)):
        raise ConfigError(
            f"{flag}: this --auth-token cannot issue tokens; with a verify-only JWT key use --identity-jwt-file"
        )
    if identity.kind == IDENTITY_JWT and jwt is None:
        raise ConfigError(f"{flag}: needs --auth-token jwt,... with the key that verifies the token")
    try:
        read_credential(identity.kind, Path(identity.path))
    except IdentityFileError as e:
        raise ConfigError(f"{flag}: {e}") from None
    return identity


def _auth_token(f: Flags) -> tuple[AuthTokenSpec, JwtProvider | None]:
    try:
        spec = parse_auth_token(f["auth_token"] or "")
        jwt = JwtProvider.from_options(spec.options) if spec.kind == JWT else None
    except AuthOptionError as e:
        raise f.error("auth_token", str(e)) from None
    return spec, jwt
