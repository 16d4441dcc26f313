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

from protos.internal import MAX_REQUEST_BYTES_LIMIT
from proxy.audit.writer import DEFAULT_LEVEL as AUDIT_DEFAULT_LEVEL
from proxy.audit.writer import LEVELS as AUDIT_LEVELS
from proxy.gateway_access import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    Access,
    AccessError,
    Limits,
    default_max_connections,
    parse_hosts,
    parse_origins,
)
from proxy.identity_file import JWT as IDENTITY_JWT
from proxy.identity_file import OIDC as IDENTITY_OIDC
from proxy.identity_file import PASSWORD as IDENTITY_PASSWORD
from proxy.identity_file import IdentityFileError, IdentitySpec, read_credential
from proxy.passwords import DEFAULT_COST, MAX_COST, MIN_COST, QUEUE_PER_WORKER
from proxy.sidecar import is_local_listener
from proxy.store_client import InternalTLS
from proxy.tls import ClientTLS, TLSFileError, revocation_list
from proxy.tls import load as load_tls
from proxy.tokens.jwt import JwtProvider
from raftgate.auth_token import JWT, SIMPLE, AuthOptionError, AuthTokenSpec, parse_auth_token
from raftgate.config_support import (
    MAX_PROXY_WORKERS,
    ConfigError,
    FlagParser,
    Flags,
    boolean,
    comma_list,
    host_port,
    integer,
    parse_flags,
    prefixed,
    read_file,
)
from raftgate.crl import CRLError
from raftgate.go_duration import parse_go_duration
from raftgate.observe import ObserveConfig, add_observe_flags, observe_config
from raftgate.workload_identity import WorkloadConfigError, WorkloadVerifier
from raftgate.workload_identity import build as build_workload

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
    #: --oidc-*: Kubernetes workload tokens are verified and mapped to users (None: off)
    workload: WorkloadVerifier | None = None
    #: --audit-log: a file, or "-" for stdout (None: no audit log); proxy/audit/
    audit_log: str | None = None
    #: --audit-level: auth, denials or all
    audit_level: str = AUDIT_DEFAULT_LEVEL
    #: --audit-fail-closed: refuse requests the audit log cannot record
    audit_fail_closed: bool = False
    #: --auth-rate-limit: Authenticate calls a second per client address (0: no limit)
    auth_rate_limit: float = 0.0
    #: --cert-file/--key-file/--trusted-ca-file/--client-cert-auth (None: no TLS files given)
    client_tls: ClientTLS | None = None
    #: the listen addresses (of ``listen``) served with TLS: the https:// client URLs
    tls_listen: tuple[str, ...] = ()
    #: --sidecar: this proxy holds a sidecar-class credential (THREAT_MODEL.md): it forwards tokens
    #: and passwords for the store to check, and needs no token key and no password hashes
    sidecar: bool = False
    #: --workers: processes sharing the client port (SO_REUSEPORT), each its own store stream
    workers: int = 1
    #: --store-reads: Range spread over the store's voters (True) or sent to the leader
    spread_reads: bool = False
    #: --cors and --host-whitelist: which web pages and Host names the JSON gateway answers
    gateway_access: Access = field(default_factory=Access)
    #: --gateway-header-timeout, --gateway-body-timeout, --gateway-max-connections
    gateway_limits: Limits = field(default_factory=Limits)

    @property
    def grpc_max_receive_bytes(self) -> int:
        return self.max_request_bytes + GRPC_OVERHEAD_BYTES


def _parser() -> FlagParser:
    p = FlagParser(
        prog="raftgate proxy",
        description="The raftgate auth proxy: serves the etcd v3 API.",
        epilog="Flags, TLS, tokens, lockout, the audit log, worker processes, sidecars: docs/configuration.md. "
        "Identity mode and Kubernetes workload identity: docs/kubernetes.md.",
    )
    p.add_argument("--listen-client-urls", default=DEFAULT_LISTEN,
                   help=f"comma list of http://, https:// or unix:// URLs (default {DEFAULT_LISTEN})")
    p.add_argument("--cert-file", help="server certificate (PEM) of the https:// client URLs (etcd's flag)")
    p.add_argument("--key-file", help="its private key (PEM)")
    p.add_argument("--trusted-ca-file", help="CA bundle (PEM): the https:// client URLs then require a client "
                   "certificate it signed")
    p.add_argument("--client-cert-auth", nargs="?", const="true", default="false", type=boolean,
                   help="a verified client certificate's CN is the user of requests without a token (etcd's flag)")
    p.add_argument("--client-crl-file",
                   help="certificate revocation list (PEM or DER) signed by a CA of --trusted-ca-file: client "
                   "certificates it lists are refused (UNAVAILABLE), streams included; re-read when it changes "
                   "(etcd's flag)")
    p.add_argument("--store-endpoints", help="comma list of every store node's host:port (requests go to the leader)")
    p.add_argument(
        "--member-store-endpoint",
        help="host:port of the one store node this proxy stands for (a member's advertised client URL): "
        "Status, Hash and HashKV go to it, everything else to the leader",
    )
    p.add_argument("--internal-secret-file",
                   help="file holding the shared secret the proxy proves to the store, never sends (development)")
    p.add_argument("--internal-cert", help="client certificate (PEM) for mTLS to the store")
    p.add_argument("--internal-key", help="client key (PEM) for mTLS to the store")
    p.add_argument("--internal-ca", help="CA bundle (PEM) that signed the store's certificate")
    p.add_argument("--auth-token", default=SIMPLE,
                   help='"simple" (default), "jwt,pub-key=..,priv-key=..,sign-method=..,ttl=.." or ""; jwt also '
                        'takes jwks-url=.. (and jwks-ca=..) to follow another proxy\'s /.well-known/jwks.json')
    p.add_argument("--auth-token-ttl", default=DEFAULT_TOKEN_TTL,
                   help=f"simple token sliding TTL in seconds (default {DEFAULT_TOKEN_TTL})")
    p.add_argument("--bcrypt-cost", default=DEFAULT_COST,
                   help=f"bcrypt cost for new passwords, {MIN_COST}..{MAX_COST} (default {DEFAULT_COST})")
    p.add_argument("--max-request-bytes", default=DEFAULT_MAX_REQUEST_BYTES,
                   help=f"largest request accepted (default {DEFAULT_MAX_REQUEST_BYTES})")
    p.add_argument("--bcrypt-workers", help="threads checking passwords (default: CPU count)")
    p.add_argument(
        "--bcrypt-queue-limit",
        help=f"bcrypt jobs that may wait for a free worker, per lane (checks, hashing), served by turns "
        f"between client addresses; when that many wait, Authenticate, UserAdd and UserChangePassword "
        f"get 'too many requests', unless the caller's address waits with fewer than the busiest one "
        f"(whose newest waiting job is refused instead) (default {QUEUE_PER_WORKER} per worker)",
    )
    p.add_argument(
        "--listen-gateway-urls",
        help="comma list of http:// or unix:// URLs serving etcd's JSON gateway (POST /v3/kv/range, ...); "
        "default: off",
    )
    p.add_argument(
        "--cors",
        help="JSON gateway: comma list of origins (scheme://host[:port]) whose web pages may call it, or '*' for "
        "every origin (etcd's default); default: none, and a request with another Origin header is refused",
    )
    p.add_argument(
        "--host-whitelist",
        help="JSON gateway: comma list of host names (or addresses) a request's Host header may name, any port, "
        "or '*' for every name (etcd's default); default: localhost and IP addresses (a DNS-rebinding web "
        "page needs a name of its own); others get 421",
    )
    p.add_argument("--gateway-header-timeout", default=f"{DEFAULT_HEADER_TIMEOUT:g}s",
                   help="JSON gateway: a connection whose request header is not complete this long after the "
                   f"connection (or the request's first byte) is closed (Go duration, default "
                   f"{DEFAULT_HEADER_TIMEOUT:g}s)")
    p.add_argument("--gateway-body-timeout", default=f"{DEFAULT_BODY_TIMEOUT:g}s",
                   help="JSON gateway: a unary request's whole body (and a stream's first request) must arrive "
                   f"within this, else 408 (Go duration, default {DEFAULT_BODY_TIMEOUT:g}s); streams are not cut")
    p.add_argument("--gateway-max-connections",
                   help="JSON gateway: open connections; one more closes the oldest that is not in a request, "
                   f"or is refused (default {DEFAULT_MAX_CONNECTIONS}, at most half the open-file limit)")
    p.add_argument(
        "--auth-rate-limit", default="0",
        help="Authenticate calls a second one client address may make; beyond it 'too many requests' "
        "(a token bucket, bursts of one second's worth; default 0: no limit)",
    )
    p.add_argument(
        "--workers", default=1,
        help="processes serving the client port together (SO_REUSEPORT), each with its own store stream, "
        "supervised by this one: the client-facing gRPC cost spreads over cores (default 1; with more, "
        "http:// listeners with a fixed port only, no gateway; --metrics-addr and --health-addr are "
        "served by the supervisor, metrics summed over the workers)",
    )
    add_observe_flags(p)
    p.add_argument("--audit-log",
                   help="write an audit record (a JSON line) per auditable request to this file, or '-' for "
                   "stdout; SIGHUP reopens the file (default: off)")
    p.add_argument("--audit-level", default=AUDIT_DEFAULT_LEVEL, choices=AUDIT_LEVELS,
                   help="auth: Authenticate and auth administration; denials (default): those and every refused "
                   "request; all: every request")
    p.add_argument("--audit-fail-closed", nargs="?", const="true", default="false",
                   help="refuse requests ('raftgate: audit log unavailable') while the audit log cannot be "
                   "written, instead of serving them unaudited (true/false, default false)")
    p.add_argument(
        "--sidecar", nargs="?", const="true", default="false", choices=["true", "false"],
        help="sidecar mode, for a sidecar-class internal credential: clients' tokens are forwarded to the store, "
        "which verifies them, and Authenticate's password is checked by the store; --auth-token is not used "
        "(the store's decides) and no JWT private key is needed",
    )
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
        "--identity-oidc-token-file",
        help="sidecar identity mode with the pod's projected ServiceAccount token (re-read when kubelet "
        "rotates it; needs --oidc-issuer): a file, or a directory holding 'token'",
    )
    p.add_argument("--oidc-issuer",
                   help="accept Kubernetes workload tokens (projected ServiceAccount tokens) of this issuer "
                   "(its URL, exactly as in the tokens' iss)")
    p.add_argument("--oidc-audience", help="the audience workload tokens must name (required with --oidc-issuer)")
    p.add_argument("--oidc-jwks-file",
                   help="the issuer's keys (JWKS file, re-read when it changes); default: OIDC discovery at "
                   "the issuer's /.well-known/openid-configuration")
    p.add_argument("--oidc-ca-file", help="CA bundle (PEM) for https to the issuer (discovery and jwks_uri)")
    p.add_argument("--oidc-user-map",
                   help='JSON file mapping a token\'s sub to a raftgate user: [{"match": "system:serviceaccount:'
                   'NS:NAME or a glob", "user": "NAME"}, ...], first match wins (required with --oidc-issuer)')
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
    listen, tls_listen = _client_urls(f)
    sidecar = f["sidecar"] == "true"
    if sidecar and f["client_cert_auth"]:
        # the CN would be the user, but the store verifies a sidecar's identities itself and never
        # sees the client's certificate (THREAT_MODEL.md): there is nothing it could check
        raise ConfigError(f"{f.source('client_cert_auth')} cannot be used with {f.source('sidecar')}: the store "
                          "verifies a sidecar's clients by their tokens and never sees a client certificate; "
                          "use tokens, or a central proxy for certificate identities")
    client_tls = _client_tls(f, tls_listen)
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
    if sidecar and jwt is not None and not jwt.verify_only:
        raise f.error("auth_token", "a --sidecar proxy holds no JWT private key (the store signs its tokens)")
    # etcd swaps a TTL <= 0 for 300 s without a word; a typo that silently changes the TTL is worse.
    ttl = integer(f, "auth_token_ttl", 1)
    cost = integer(f, "bcrypt_cost")
    if not MIN_COST <= cost <= MAX_COST:
        log.warning("%s %d is out of range %d..%d; using %d", f.source("bcrypt_cost"), cost, MIN_COST, MAX_COST,
                    DEFAULT_COST)
        cost = DEFAULT_COST
    max_bytes = integer(f, "max_request_bytes", 1)
    if max_bytes > MAX_REQUEST_BYTES_LIMIT:
        raise f.error("max_request_bytes", f"must be at most {MAX_REQUEST_BYTES_LIMIT} (62 MiB: the store takes "
                      f"messages of up to 64 MiB), got {max_bytes}")
    workers = integer(f, "bcrypt_workers", 1) if f["bcrypt_workers"] is not None else os.cpu_count() or 1
    queue_limit = integer(f, "bcrypt_queue_limit", 0) if f["bcrypt_queue_limit"] is not None \
        else QUEUE_PER_WORKER * workers
    observe = observe_config(
        argparse.Namespace(metrics_addr=f["metrics_addr"], health_addr=f["health_addr"]), ConfigError,
        {dest: f.source(dest) for dest in ("metrics_addr", "health_addr")},
    )
    gateway = _listen_urls(f, "listen_gateway_urls") if f["listen_gateway_urls"] else ()
    access, limits = _gateway_access(f), _gateway_limits(f)
    if not gateway:
        for dest in ("cors", "host_whitelist", "gateway_max_connections"):
            if f.given(dest):
                log.warning("%s is for the JSON gateway, which is off (no --listen-gateway-urls)", f.source(dest))
    workload = _workload(f)
    identity = _identity(f, listen, spec, jwt, workload, sidecar=sidecar)
    audit_log, fail_closed = _audit(f)
    rate_limit = _rate(f, "auth_rate_limit")
    proxy_workers = integer(f, "workers", 1, MAX_PROXY_WORKERS)
    if proxy_workers > 1:
        _check_workers(f, listen, gateway)
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
        workload=workload,
        audit_log=audit_log,
        audit_level=f["audit_level"],
        audit_fail_closed=fail_closed,
        auth_rate_limit=rate_limit,
        client_tls=client_tls,
        tls_listen=tls_listen,
        sidecar=sidecar,
        workers=proxy_workers,
        spread_reads=f["store_reads"] == "spread",
        gateway_access=access,
        gateway_limits=limits,
    )


def _gateway_access(f: Flags) -> Access:
    """--cors (default none) and --host-whitelist (default None: localhost and IP addresses)."""
    try:
        origins = parse_origins(f["cors"]) if f["cors"] is not None else frozenset()
    except AccessError as e:
        raise f.error("cors", str(e)) from None
    try:
        hosts = parse_hosts(f["host_whitelist"]) if f["host_whitelist"] is not None else None
    except AccessError as e:
        raise f.error("host_whitelist", str(e)) from None
    return Access(origins=origins, hosts=hosts)


def _gateway_limits(f: Flags) -> Limits:
    def seconds(dest: str) -> float:
        raw = str(f[dest]).strip()
        try:
            ns = parse_go_duration(raw)
        except ValueError as e:
            raise f.error(dest, str(e)) from None
        if not 0 < ns <= 24 * 3600 * 10**9:
            raise f.error(dest, f"must be in (0s, 24h], got {raw!r}")
        return ns / 1e9

    limit = integer(f, "gateway_max_connections", 1, 1 << 20) if f["gateway_max_connections"] is not None \
        else default_max_connections()
    return Limits(header_timeout=seconds("gateway_header_timeout"), body_timeout=seconds("gateway_body_timeout"),
                  max_connections=limit)


#: Go's strconv.ParseBool, as etcd reads its boolean flags
_GO_TRUE, _GO_FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")


def _audit(f: Flags) -> tuple[str | None, bool]:
    """--audit-log and --audit-fail-closed (which needs a log to be closed on)."""
    raw = str(f["audit_fail_closed"]).strip()
    if raw not in _GO_TRUE + _GO_FALSE:
        raise f.error("audit_fail_closed", f"must be true or false, got {raw!r}")
    fail_closed = raw in _GO_TRUE
    path = f["audit_log"]
    if path is not None and not path.strip():
        raise f.error("audit_log", "is empty (a file, or '-' for stdout)")
    if fail_closed and path is None:
        raise f.error("audit_fail_closed", "needs --audit-log")
    return path, fail_closed


def _rate(f: Flags, dest: str) -> float:
    """A rate a second: a finite number >= 0 (0: off)."""
    raw = str(f[dest]).strip()
    try:
        value = float(raw)
    except ValueError:
        raise f.error(dest, f"must be a number of calls a second, got {raw!r}") from None
    if not 0 <= value <= 1e9:  # also refuses nan and inf
        raise f.error(dest, f"must be in 0..1e9 (0: no limit), got {raw!r}")
    return value


def _client_urls(f: Flags) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """--listen-client-urls -> (every listen address, those served with TLS: the https:// ones)."""
    listen = _listen_urls(f, tls=True)
    secure = tuple(address for url, address in zip(comma_list(f["listen_client_urls"] or ""), listen, strict=True)
                   if urlsplit(url).scheme == "https")
    return listen, secure


def _client_tls(f: Flags, tls_listen: tuple[str, ...]) -> ClientTLS | None:
    """The client port's TLS files, checked now (the key matches the certificate, the CA parses).

    As in etcd: an https:// URL needs --cert-file and --key-file; --client-cert-auth needs a CA
    (raftgate trusts no system CA for client certificates); TLS files with only http:// URLs are
    not used (etcd serves those plainly too), which is logged.
    """
    cert, key, ca = f["cert_file"], f["key_file"], f["trusted_ca_file"]
    cert_auth = bool(f["client_cert_auth"])
    crl = f["client_crl_file"]
    if crl is not None and not crl.strip():
        raise f.error("client_crl_file", "is empty (a CRL file)")
    if crl and not ca:
        raise ConfigError(f"{f.source('client_crl_file')} needs {f.source('trusted_ca_file')}: the CA that signs "
                          "client certificates, and the CRL")
    if not (cert or key or ca or cert_auth):
        if tls_listen:
            raise f.error("listen_client_urls", f"https:// needs --cert-file and --key-file (TLS server "
                          f"certificate and key) for {', '.join(tls_listen)}")
        return None
    if not cert or not key:
        given = [f.source(d) for d in ("cert_file", "key_file", "trusted_ca_file", "client_cert_auth",
                                       "client_crl_file") if f.given(d)]
        missing = f.source("cert_file" if not cert else "key_file")
        raise ConfigError(f"{missing} is required with {', '.join(given)}: the client port's TLS certificate and "
                          "key go together")
    if cert_auth and not ca:
        raise ConfigError(f"{f.source('client_cert_auth')} needs {f.source('trusted_ca_file')}: the CA that signs "
                          "client certificates")
    spec = ClientTLS(cert, key, ca or None, cert_auth,
                     sources=(f.source("cert_file"), f.source("key_file"), f.source("trusted_ca_file")),
                     crl_file=crl or None, crl_source=f.source("client_crl_file"))
    try:
        load_tls(spec)
        revocation_list(spec)
    except (TLSFileError, CRLError) as e:
        raise ConfigError(str(e)) from None
    if not tls_listen:
        log.warning("%s is given but no client URL is https://: the client port serves plaintext (as etcd does)",
                    f.source("cert_file"))
    return spec


def _check_workers(f: Flags, listen: tuple[str, ...], gateway: tuple[str, ...]) -> None:
    """Several processes share only a fixed TCP port: a Unix socket or port 0 cannot be shared,
    and the JSON gateway runs in one process."""
    source = f.source("workers")
    for address in listen:
        if address.startswith("unix:"):
            raise ConfigError(f"{source} {f['workers']}: unix:// listeners cannot be shared by several processes "
                              f"({address}); use http:// or --workers 1")
        if address.rsplit(":", 1)[1] == "0":
            raise ConfigError(f"{source} {f['workers']}: every worker must listen on the same port; "
                              f"{address} has port 0")
    if gateway:
        raise ConfigError(f"{source} {f['workers']}: --listen-gateway-urls is served by one process; "
                          "run the gateway with --workers 1")


def _listen_urls(f: Flags, dest: str = "listen_client_urls", *, tls: bool = False) -> tuple[str, ...]:
    """--listen-client-urls or --listen-gateway-urls: http://host:port or unix://path URLs (and
    https://host:port with ``tls``)."""
    source = f.source(dest)
    out: list[str] = []
    for url in comma_list(f[dest] or ""):
        parts = urlsplit(url)
        if parts.scheme == "unix":
            path = (parts.netloc + parts.path) or ""
            if not path:
                raise ConfigError(f"{source}: {url!r} has no socket path")
            out.append(f"unix:{path}")
        elif parts.scheme == "http" or (tls and parts.scheme == "https"):
            if parts.path not in ("", "/") or parts.query or parts.fragment:
                raise ConfigError(f"{source}: {url!r} must be {parts.scheme}://host:port")
            host_port(source, parts.netloc)
            out.append(parts.netloc)
        elif parts.scheme == "https":
            raise ConfigError(f"{source}: {url!r}: https:// is not served here (use http:// or unix://)")
        else:
            schemes = "http://, https:// or unix://" if tls else "http:// or unix://"
            raise ConfigError(f"{source}: {url!r} must start with {schemes}")
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


def _workload(f: Flags) -> WorkloadVerifier | None:
    """--oidc-*: the workload token verifier (a JWKS file and the user map are read now)."""
    issuer = (f["oidc_issuer"] or "").strip()
    others = [dest for dest in ("oidc_audience", "oidc_jwks_file", "oidc_ca_file", "oidc_user_map") if f[dest]]
    if not issuer:
        if others:
            raise ConfigError(f"{f.source(others[0])} needs --oidc-issuer")
        return None
    for dest in ("oidc_audience", "oidc_user_map"):
        if not (f[dest] or "").strip():
            raise ConfigError(f"{f.source('oidc_issuer')} needs {f.source(dest)}")
    try:
        return build_workload(issuer, f["oidc_audience"].strip(), jwks_file=f["oidc_jwks_file"] or None,
                              ca_file=f["oidc_ca_file"] or None, user_map_file=f["oidc_user_map"])
    except WorkloadConfigError as e:
        raise ConfigError(f"{f.source('oidc_issuer')}: {e}") from None


_IDENTITY_FLAGS = {"identity_file": IDENTITY_PASSWORD, "identity_jwt_file": IDENTITY_JWT,
                   "identity_oidc_token_file": IDENTITY_OIDC}


def _identity(f: Flags, listen: tuple[str, ...], spec: AuthTokenSpec, jwt: JwtProvider | None,
              workload: WorkloadVerifier | None = None, *, sidecar: bool = False) -> IdentitySpec | None:
    """Checks the sidecar identity can work with this configuration, and reads its files once."""
    given = [dest for dest in _IDENTITY_FLAGS if f[dest]]
    if len(given) > 1:
        raise ConfigError(f"{f.source(given[0])} and {f.source(given[1])} are mutually exclusive")
    if not given:
        return None
    flag = f.source(given[0])
    identity = IdentitySpec(_IDENTITY_FLAGS[given[0]], f[given[0]])
    if not any(is_local_listener(address) for address in listen):
        raise ConfigError(
            f"{flag}: the identity is lent only on loopback or unix:// listeners, and "
            "--listen-client-urls has none"
        )
    if sidecar:
        pass  # the store logs the identity in and verifies its tokens: no key needed here
    elif identity.kind == IDENTITY_PASSWORD and (spec.kind not in (SIMPLE, JWT)
                                                 or (jwt is not None and jwt.verify_only)):
        raise ConfigError(
            f"{flag}: this --auth-token cannot issue tokens; with a verify-only JWT key use --identity-jwt-file"
        )
    elif identity.kind == IDENTITY_JWT and jwt is None:
        raise ConfigError(f"{flag}: needs --auth-token jwt,... with the key that verifies the token")
    if identity.kind == IDENTITY_OIDC and workload is None:
        raise ConfigError(f"{flag}: needs --oidc-issuer (with --oidc-audience and --oidc-user-map) to verify the token")
    try:
        read_credential(identity.kind, Path(identity.path))
    except IdentityFileError as e:
        raise ConfigError(f"{flag}: {e}") from None
    return identity


def _auth_token(f: Flags) -> tuple[AuthTokenSpec, JwtProvider | None]:
    try:
        spec = parse_auth_token(f["auth_token"] or "")
        jwt = JwtProvider.from_options(spec.jwt) if spec.jwt is not None else None
    except AuthOptionError as e:
        raise f.error("auth_token", str(e)) from None
    return spec, jwt
