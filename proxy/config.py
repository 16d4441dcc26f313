"""The proxy's configuration: one typed object built from flags (etcd's names) and environment
variables (``RAFTGATE_PROXY_<FLAG>``, flags win), validated at start-up.

Every bad value is a ConfigError with a message naming the flag; the program exits with code 2.
Values etcd silently corrects (bcrypt cost out of range, token TTL <= 0) are corrected the same way.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
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
from raftgate.observe import ObserveConfig, add_observe_flags, observe_config

log = logging.getLogger(__name__)

ENV_PREFIX = "RAFTGATE_PROXY_"
DEFAULT_LISTEN = "http://127.0.0.1:2379"
DEFAULT_TOKEN_TTL = 300
DEFAULT_MAX_REQUEST_BYTES = 1572864  # etcd's embed.DefaultMaxRequestBytes (1.5 MiB)
GRPC_OVERHEAD_BYTES = 512 * 1024  # etcd: grpc max receive = max-request-bytes + grpcOverheadBytes
MAX_SECRET_BYTES = 4096
_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.\-]+):(?P<port>[0-9]{1,5})")


class ConfigError(ValueError):
    """A bad flag or environment value; the message says which and why."""


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

    @property
    def grpc_max_receive_bytes(self) -> int:
        return self.max_request_bytes + GRPC_OVERHEAD_BYTES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(message)


def _parser() -> _Parser:
    p = _Parser(prog="raftgate proxy", description="The raftgate auth proxy: serves the etcd v3 API.")
    p.add_argument("--listen-client-urls", help=f"comma list of http:// or unix:// URLs (default {DEFAULT_LISTEN})")
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
    p.add_argument("--auth-token", help='"simple" (default), "jwt,pub-key=..,priv-key=..,sign-method=..,ttl=.." or ""')
    p.add_argument("--auth-token-ttl", help=f"simple token sliding TTL in seconds (default {DEFAULT_TOKEN_TTL})")
    p.add_argument(
        "--bcrypt-cost", help=f"bcrypt cost for new passwords, {MIN_COST}..{MAX_COST} (default {DEFAULT_COST})"
    )
    p.add_argument("--max-request-bytes", help=f"largest request accepted (default {DEFAULT_MAX_REQUEST_BYTES})")
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
    return p


def _env_name(dest: str) -> str:
    return ENV_PREFIX + dest.upper()


def load(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProxyConfig:
    """Parses and validates; raises ConfigError (SystemExit(0) for --help)."""
    env = os.environ if env is None else env
    ns = _parser().parse_args(list(argv))
    raw: dict[str, str | None] = {}
    for dest, value in vars(ns).items():
        raw[dest] = value if value is not None else env.get(_env_name(dest))

    def get(dest: str, default: str | None = None) -> str | None:
        value = raw[dest]
        return default if value is None else value

    listen = _listen_urls(get("listen_client_urls", DEFAULT_LISTEN) or "")
    stores = _store_endpoints(get("store_endpoints"))
    member = get("member_store_endpoint") or None
    if member is not None:
        member = _host_port("--member-store-endpoint", member.strip())
    secret = _read_secret(get("internal_secret_file"))
    tls = _read_tls(get("internal_cert"), get("internal_key"), get("internal_ca"))
    if secret is None and tls is None:
        raise ConfigError(
            "the store needs an internal credential: --internal-secret-file, "
            "or --internal-cert/--internal-key/--internal-ca"
        )
    spec, jwt = _auth_token(get("auth_token", SIMPLE) or "")
    ttl = _int("--auth-token-ttl", get("auth_token_ttl", str(DEFAULT_TOKEN_TTL)))
    if ttl <= 0:
        log.warning("--auth-token-ttl %d is not positive; using %d", ttl, DEFAULT_TOKEN_TTL)
        ttl = DEFAULT_TOKEN_TTL
    cost = _int("--bcrypt-cost", get("bcrypt_cost", str(DEFAULT_COST)))
    if not MIN_COST <= cost <= MAX_COST:
        log.warning("--bcrypt-cost %d is out of range %d..%d; using %d", cost, MIN_COST, MAX_COST, DEFAULT_COST)
        cost = DEFAULT_COST
    max_bytes = _int("--max-request-bytes", get("max_request_bytes", str(DEFAULT_MAX_REQUEST_BYTES)))
    if not 0 < max_bytes <= 2**31 - 1 - GRPC_OVERHEAD_BYTES:
        raise ConfigError(f"--max-request-bytes must be in 1..{2**31 - 1 - GRPC_OVERHEAD_BYTES}, got {max_bytes}")
    workers = _int("--bcrypt-workers", get("bcrypt_workers", str(os.cpu_count() or 1)))
    if workers < 1:
        raise ConfigError(f"--bcrypt-workers must be at least 1, got {workers}")
    queue_limit = _int("--bcrypt-queue-limit", get("bcrypt_queue_limit", str(QUEUE_PER_WORKER * workers)))
    if queue_limit < 0:
        raise ConfigError(f"--bcrypt-queue-limit must not be negative, got {queue_limit}")
    observe = observe_config(
        argparse.Namespace(metrics_addr=get("metrics_addr"), health_addr=get("health_addr")), ConfigError
    )
    gateway_text = get("listen_gateway_urls")
    gateway = _gateway_urls(gateway_text) if gateway_text else ()
    identity = _identity(get("identity_file"), get("identity_jwt_file"), listen, spec, jwt)
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
    )


def _int(flag: str, value: str | None) -> int:
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{flag} must be an integer, got {value!r}") from None


def _listen_urls(text: str) -> tuple[str, ...]:
    out: list[str] = []
    for url in filter(None, (u.strip() for u in text.split(","))):
        parts = urlsplit(url)
        if parts.scheme == "unix":
            path = (parts.netloc + parts.path) or ""
            if not path:
                raise ConfigError(f"--listen-client-urls: {url!r} has no socket path")
            out.append(f"unix:{path}")
        elif parts.scheme == "http":
            if parts.path not in ("", "/") or parts.query or parts.fragment:
                raise ConfigError(f"--listen-client-urls: {url!r} must be http://host:port")
            out.append(_host_port("--listen-client-urls", parts.netloc))
        elif parts.scheme == "https":
            raise ConfigError(f"--listen-client-urls: {url!r}: https:// is not supported yet (use http:// or unix://)")
        else:
            raise ConfigError(f"--listen-client-urls: {url!r} must start with http:// or unix://")
    if not out:
        raise ConfigError("--listen-client-urls is empty")
    return tuple(out)


def _gateway_urls(text: str) -> tuple[str, ...]:
    """--listen-gateway-urls: the same URL forms as --listen-client-urls."""
    try:
        return _listen_urls(text)
    except ConfigError as e:
        raise ConfigError(str(e).replace("--listen-client-urls", "--listen-gateway-urls")) from None


def _host_port(flag: str, text: str) -> str:
    match = _HOST_PORT.fullmatch(text)
    if not match or not 0 <= int(match["port"]) <= 65535:
        raise ConfigError(f"{flag}: {text!r} is not host:port")
    return text


def _store_endpoints(text: str | None) -> tuple[str, ...]:
    if not text:
        raise ConfigError("--store-endpoints is required (comma list of host:port)")
    endpoints = tuple(_host_port("--store-endpoints", e.strip()) for e in text.split(",") if e.strip())
    if not endpoints:
        raise ConfigError("--store-endpoints is empty")
    if any(e.endswith(":0") for e in endpoints):
        raise ConfigError("--store-endpoints: port 0 is not a store address")
    return endpoints


def _read_file(flag: str, path: str, limit: int = 1024 * 1024) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{flag}: cannot read {path!r}: {e.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{flag}: {path!r} is too large")
    return data


def _read_secret(path: str | None) -> str | None:
    if not path:
        return None
    data = _read_file("--internal-secret-file", path, MAX_SECRET_BYTES).strip()
    if not data:
        raise ConfigError(f"--internal-secret-file: {path!r} is empty")
    try:
        secret = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError("--internal-secret-file: the secret must be printable ASCII") from None
    if not secret.isprintable():
        raise ConfigError("--internal-secret-file: the secret must be printable ASCII")
    return secret


def _read_tls(cert: str | None, key: str | None, ca: str | None) -> InternalTLS | None:
    given = [x for x in (cert, key, ca) if x]
    if not given:
        return None
    if len(given) != 3:
        raise ConfigError("--internal-cert, --internal-key and --internal-ca must be given together")
    assert cert and key and ca
    return InternalTLS(
        ca=_read_file("--internal-ca", ca),
        cert=_read_file("--internal-cert", cert),
        key=_read_file("--internal-key", key),
    )


def _identity(
    password_path: str | None,
    jwt_path: str | None,
    listen: tuple[str, ...],
    spec: AuthTokenSpec,
    jwt: JwtProvider | None,
) -> IdentitySpec | None:
    """Checks the sidecar identity can work with this configuration, and reads its files once."""
    if password_path and jwt_path:
        raise ConfigError("--identity-file and --identity-jwt-file are mutually exclusive")
    if not password_path and not jwt_path:
        return None
    flag = "--identity-file" if password_path else "--identity-jwt-file"
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


def _auth_token(text: str) -> tuple[AuthTokenSpec, JwtProvider | None]:
    try:
        spec = parse_auth_token(text)
        jwt = JwtProvider.from_options(spec.options) if spec.kind == JWT else None
    except AuthOptionError as e:
        raise ConfigError(f"--auth-token: {e}") from None
    return spec, jwt
