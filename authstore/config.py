"""The store program's configuration: one typed object built from flags and environment.

Flags follow etcd's names where etcd has one; every flag can also come from an environment
variable RAFTGATE_STORE_<FLAG> (upper case, dashes as underscores), and a flag with etcd's name
from etcd's ETCD_<FLAG> too (flag > RAFTGATE_STORE_* > ETCD_*). Built by ``parse(argv, environ)``
in raftgate's one config idiom (raftgate.config_support): a bad value is a ConfigError naming the
flag or the variable it came from.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from authstore.state.auth.initial_root import DEFAULT_COST, MAX_COST, MIN_COST
from raftgate.auth_token import JWT, NOP, SIMPLE, AuthOptionError, AuthTokenSpec, parse_auth_token
from raftgate.config_support import (
    ConfigError,
    FlagParser,
    Flags,
    boolean,
    comma_list,
    integer,
    parse_flags,
    read_file,
)
from raftgate.crl import CRLError, RevocationList
from raftgate.go_duration import parse_go_duration
from raftgate.jwt_keys import KeyLoadError
from raftgate.observe import ObserveConfig, add_observe_flags, observe_config
from raftgate.password_file import PasswordFileError, read_password_file
from raftgate.token_verifier import JwtKeys

__all__ = ["ConfigError", "StoreConfig", "parse", "parse_initial_cluster"]


DEFAULT_LOCKOUT_ATTEMPTS = 5
DEFAULT_LOCKOUT_DURATION = "15m"
DEFAULT_LOCKOUT_DURATION_MS = 15 * 60 * 1000
#: the longest lockout: a year (a longer one is a typo, and times stay far from int64's ends)
MAX_LOCKOUT_DURATION_MS = 366 * 24 * 3600 * 1000


@dataclass(frozen=True)
class StoreConfig:
    name: str
    data_dir: Path
    listen_host: str
    listen_port: int
    tls: bool = False
    secret: bytes | None = field(default=None, repr=False)
    cert_file: Path | None = None
    key_file: Path | None = None
    trusted_ca_file: Path | None = None
    advertise_client_urls: list[str] = field(default_factory=list)
    #: where proxies reach this node's internal port; published in the member list they follow
    advertise_internal_urls: list[str] = field(default_factory=list)
    #: --advertise-gateway-urls: where this member's proxy serves the JSON gateway
    advertise_gateway_urls: list[str] = field(default_factory=list)
    peer_urls: list[str] = field(default_factory=list)
    listen_peer_host: str = "127.0.0.1"
    listen_peer_port: int = 2380
    peer_tls: bool = False
    peer_secret: bytes | None = field(default=None, repr=False)
    peer_cert_file: Path | None = None
    peer_key_file: Path | None = None
    peer_trusted_ca_file: Path | None = None
    initial_cluster: list[tuple[str, list[str]]] = field(default_factory=list)
    initial_cluster_state: str = "new"
    initial_cluster_token: str = "etcd-cluster"
    heartbeat_interval_ms: int = 100
    election_timeout_ms: int = 1000
    #: etcd's --initial-election-tick-advance: a member of several fast-forwards its first
    #: election once its peers are connected (a single member always does)
    initial_election_tick_advance: bool = True
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
    #: lockout (authstore/state/auth/lockout.py): failed Authenticate calls of one name within
    #: the duration that lock it for the duration; 0 attempts: off
    auth_lockout_attempts: int = DEFAULT_LOCKOUT_ATTEMPTS
    auth_lockout_duration_ms: int = DEFAULT_LOCKOUT_DURATION_MS
    #: sidecar-class callers (THREAT_MODEL.md): their own secret, or the CA of their certificates
    sidecar_secret: bytes | None = field(default=None, repr=False)
    sidecar_trusted_ca_file: Path | None = None
    #: --client-crl-file: proxy and sidecar certificates it lists are refused (raftgate/crl.py)
    client_crl_file: Path | None = None
    #: how the store verifies and issues tokens for sidecar-class callers (etcd's --auth-token,
    #: parsed by the proxy's parser: raftgate/auth_token.py)
    auth_token: AuthTokenSpec = field(default_factory=lambda: AuthTokenSpec(SIMPLE))
    #: --auth-token jwt,...: the keys, loaded (and checked) while the flags are read
    jwt: JwtKeys | None = field(default=None, repr=False, compare=False)
    auth_token_ttl: int = 300
    bcrypt_workers: int = 2
    #: --oidc-*: Kubernetes workload tokens sidecars forward are verified here (None: off)
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_file: str | None = None
    oidc_ca_file: str | None = None
    oidc_user_map: str | None = None


#: etcd's maxElectionMs: a longer election timeout is refused
MAX_ELECTION_MS = 50_000
#: the store maps 2 x quota of address space (main.py); 64-bit Linux gives a process 128 TiB
MAX_QUOTA_BYTES = 16 << 40


def _parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="raftgate store",
        description="Run one authstore node.",
        epilog="Replication, cluster flags and membership, backup, the data dir: docs/operations.md. "
        "TLS, tokens, lockout: docs/configuration.md.",
    )
    p.add_argument("--name", default="default", help="human-readable name of this member")
    p.add_argument("--data-dir", default=None,
                   help="directory for the log and the LMDB store (default: NAME.raftgate)")
    p.add_argument("--listen-internal-urls", default="http://127.0.0.1:23790",
                   help="where authenticated proxies reach this node (https:// requires mTLS files)")
    p.add_argument("--internal-secret-file", default=None,
                   help="development only: file with a shared secret every proxy must prove (it is never sent)")
    p.add_argument("--cert-file", default=None, help="server certificate for the internal port (mTLS)")
    p.add_argument("--key-file", default=None, help="server key for the internal port (mTLS)")
    p.add_argument("--trusted-ca-file", default=None, help="CA that signs the proxies' client certificates")
    p.add_argument("--client-crl-file", default=None,
                   help="certificate revocation list (PEM or DER) signed by --trusted-ca-file or "
                        "--sidecar-trusted-ca-file: proxy and sidecar certificates it lists are refused on the "
                        "internal port, open streams included; re-read when it changes")
    p.add_argument("--advertise-client-urls", default="", help="client URLs shown by MemberList (the proxies')")
    p.add_argument("--advertise-internal-urls", default="",
                   help="where proxies reach this node's internal port, published to them in the member list "
                        "(default: --listen-internal-urls unless it listens on a wildcard address)")
    p.add_argument("--advertise-gateway-urls", default="",
                   help="where this member's proxy serves etcd's JSON gateway (its --listen-gateway-urls): the "
                        "gateway's MemberList names these as the member's clientURLs, so HTTP clients that "
                        "discover members reach a gateway (gRPC's MemberList keeps --advertise-client-urls)")
    p.add_argument("--initial-advertise-peer-urls", default="http://127.0.0.1:2380", help="peer URLs of this member")
    p.add_argument("--listen-peer-urls", default="http://127.0.0.1:2380",
                   help="where other store nodes reach this one (https:// requires the --peer-* files)")
    p.add_argument("--peer-cert-file", default=None, help="certificate for peer traffic (mTLS, both directions)")
    p.add_argument("--peer-key-file", default=None, help="key for peer traffic")
    p.add_argument("--peer-trusted-ca-file", default=None, help="CA that signs every store node's peer certificate")
    p.add_argument("--peer-secret-file", default=None,
                   help="development only: file with a shared secret every store node proves (it is never sent)")
    p.add_argument("--initial-cluster", default=None,
                   help="name=peer-url,... of the members a new cluster starts with (default: this member alone)")
    p.add_argument("--initial-cluster-state", default="new", choices=["new", "existing"],
                   help="new: bootstrap a cluster; existing: join one after MemberAdd")
    p.add_argument("--initial-cluster-token", default="etcd-cluster")
    p.add_argument("--heartbeat-interval", type=int, default=100, help="milliseconds between heartbeats")
    p.add_argument("--election-timeout", type=int, default=1000, help="milliseconds before a follower campaigns")
    p.add_argument("--initial-election-tick-advance", nargs="?", const="true", default="true", type=boolean,
                   help="whether to fast-forward initial election ticks on boot for faster election (etcd's flag: "
                        "once more than one peer is connected, all but two ticks of the first election timeout; "
                        "a single-member cluster always advances all but one)")
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
    p.add_argument("--auth-lockout-attempts", default=DEFAULT_LOCKOUT_ATTEMPTS,
                   help="failed Authenticate calls for one user name within --auth-lockout-duration that lock "
                        f"the name for that duration; 0: no lockout (default {DEFAULT_LOCKOUT_ATTEMPTS})")
    p.add_argument("--auth-lockout-duration", default=DEFAULT_LOCKOUT_DURATION,
                   help=f"Go duration: the counting window and the lock's length (default {DEFAULT_LOCKOUT_DURATION})")
    p.add_argument("--sidecar-trusted-ca-file", default=None,
                   help="CA that signs the sidecars' client certificates: their requests carry the client's "
                        "token, which the store verifies itself (no stamped user, no password hashes)")
    p.add_argument("--sidecar-secret-file", default=None,
                   help="development only: file with the shared secret sidecar-class proxies prove (never sent)")
    p.add_argument("--auth-token", default="simple",
                   help="tokens the store verifies for sidecars and issues at their Authenticate: simple, or "
                        "jwt,pub-key=PATH[,priv-key=PATH],sign-method=ALG[,ttl=5m] (etcd's syntax, checked as the "
                        "proxy checks it; ttl a Go duration; priv-key: the store mints JWTs for sidecars, the "
                        "sidecars hold no key; no jwks-url)")
    p.add_argument("--auth-token-ttl", type=int, default=300,
                   help="seconds a simple token issued to a sidecar's Authenticate lives while unused")
    p.add_argument("--bcrypt-workers", type=int, default=2,
                   help="threads checking the passwords of sidecars' Authenticate calls")
    p.add_argument("--oidc-issuer",
                   help="verify Kubernetes workload tokens (projected ServiceAccount tokens) of this issuer that "
                        "sidecars forward, as the proxy's flag of the same name does")
    p.add_argument("--oidc-audience", help="the audience workload tokens must name (required with --oidc-issuer)")
    p.add_argument("--oidc-jwks-file", help="the issuer's keys as a JWKS file (default: OIDC discovery)")
    p.add_argument("--oidc-ca-file", help="CA bundle (PEM) for https to the issuer (discovery and jwks_uri)")
    p.add_argument("--oidc-user-map", help="JSON rules mapping a token's sub to a raftgate user (required with "
                                            "--oidc-issuer); the user must exist in the auth store")
    add_observe_flags(p)
    return p


#: The flags etcd has too, with the same meaning: read from etcd's ETCD_<FLAG> as well, so the
#: lines `etcdctl member add` prints (ETCD_NAME=..., ETCD_INITIAL_CLUSTER=...) work as printed.
ETCD_FLAGS = frozenset({
    "name", "data-dir", "cert-file", "key-file", "trusted-ca-file", "advertise-client-urls",
    "initial-advertise-peer-urls", "listen-peer-urls", "peer-cert-file", "peer-key-file", "peer-trusted-ca-file",
    "initial-cluster", "initial-cluster-state", "initial-cluster-token", "heartbeat-interval", "election-timeout",
    "initial-election-tick-advance",
    "snapshot-count", "snapshot-catchup-entries", "max-txn-ops", "quota-backend-bytes", "log-level", "bcrypt-cost",
    "auth-token", "auth-token-ttl", "client-crl-file",
})


def _env_names(action: argparse.Action) -> list[str]:
    """The environment variables of a flag, strongest first: RAFTGATE_STORE_<FLAG>, then (a flag
    with etcd's name) etcd's own rule, ETCD_ + the flag upper-cased with dashes as underscores."""
    flag = action.option_strings[0].removeprefix("--")
    names = ["RAFTGATE_STORE_" + action.dest.upper()]
    if flag in ETCD_FLAGS:
        names.append("ETCD_" + flag.upper().replace("-", "_"))
    return names


def _env_names(action: argparse.Action) -> list[str]:
    """The environment variables of a flag, strongest first: RAFTGATE_STORE_<FLAG>, then (a flag
    with etcd's name) etcd's own rule, ETCD_ + the flag upper-cased with dashes as underscores."""
    flag = action.option_strings[0].removeprefix("--")
    names = ["RAFTGATE_STORE_" + action.dest.upper()]
    if flag in ETCD_FLAGS:
        names.append("ETCD_" + flag.upper().replace("-", "_"))
    return names


def _read_secret(f: Flags, dest: str) -> bytes | None:
    if not f[dest]:
        return None
    secret = read_file(f.source(dest), f[dest]).strip()
    if len(secret) < 16:
        raise f.error(dest, "the secret must be at least 16 bytes")
    return secret


def _host_port(source: str, url: str) -> tuple[str, int, bool]:
    """``(host, port, https)`` of an http(s)://host:port URL. A control character is refused as Go's
    url.Parse refuses it (etcd): urlsplit drops newlines and tabs before it looks, and URLs the
    store keeps newline-joined (internal, gateway) would be read back as other URLs."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ConfigError(f"{source}: {url!r}: invalid control character in URL")
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:  # a port that is no number or out of range, a broken [IPv6] host
        raise ConfigError(f"{source}: {url!r} is not http(s)://host:port") from None
    if u.scheme not in ("http", "https") or not u.hostname or not port:
        raise ConfigError(f"{source}: {url!r} is not http(s)://host:port")
    return u.hostname, port, u.scheme == "https"


#: --advertise-gateway-urls: at most this many (each checked as http(s)://host:port)
MAX_GATEWAY_URLS = 16


def _gateway_urls(f: Flags) -> list[str]:
    urls = comma_list(f["advertise_gateway_urls"])
    if len(urls) > MAX_GATEWAY_URLS:
        raise f.error("advertise_gateway_urls", f"at most {MAX_GATEWAY_URLS} URLs")
    for url in urls:
        _host_port(f.source("advertise_gateway_urls"), url)
    return urls


def _one_url(f: Flags, dest: str) -> tuple[str, int, bool]:
    urls = comma_list(f[dest])
    if len(urls) != 1:
        raise f.error(dest, "give exactly one URL")
    return _host_port(f.source(dest), urls[0])


def _tls_files(f: Flags, dests: tuple[str, ...], what: str) -> dict[str, Path]:
    """The mTLS files an https URL needs, each an existing file."""
    for dest in dests:
        if not f[dest] or not Path(f[dest]).is_file():
            raise f.error(dest, f"an https {what} URL needs this file (mTLS)")
    return {dest: Path(f[dest]) for dest in dests}


def _sidecars_are_no_peers(f: Flags, values: Mapping[str, object]) -> None:
    """A sidecar's credential (held by whoever reads an application namespace's Secrets) must
    not open the peer port, whose callers are trusted as store nodes (their Raft messages are
    applied unchecked): neither the same secret nor a sidecar CA whose key is a peer CA's."""
    if values.get("sidecar_secret") is not None and values["sidecar_secret"] == values.get("peer_secret"):
        raise f.error("sidecar_secret_file", "must differ from --peer-secret-file (every sidecar would be a "
                      "store peer)")
    sidecar_ca, peer_ca = values.get("sidecar_trusted_ca_file"), values.get("peer_trusted_ca_file")
    if isinstance(sidecar_ca, Path) and isinstance(peer_ca, Path):
        shared = _ca_keys(f, "sidecar_trusted_ca_file", sidecar_ca) & _ca_keys(f, "peer_trusted_ca_file", peer_ca)
        if shared:
            raise f.error("sidecar_trusted_ca_file", f"holds a CA of {f.source('peer_trusted_ca_file')} (every "
                          "sidecar certificate would be a store peer's): give sidecars a CA of their own")


def _ca_keys(f: Flags, dest: str, path: Path) -> set[bytes]:
    """The public keys (DER SubjectPublicKeyInfo) of the CA certificates in a PEM file."""
    try:
        cas = x509.load_pem_x509_certificates(read_file(f.source(dest), path))
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise
        raise f.error(dest, f"{str(path)!r} holds no PEM certificate") from None
    return {ca.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            for ca in cas}


def parse_initial_cluster(raw: str, source: str = "--initial-cluster") -> list[tuple[str, list[str]]]:
    """etcd's ``name=url,name=url`` (a name may repeat, one URL each)."""
    members: dict[str, list[str]] = {}
    for part in raw.split(","):
        name, eq, url = part.strip().partition("=")
        if not eq or not name or not url:
            raise ConfigError(f"{source}: {part.strip()!r} is not name=url")
        _host_port(source, url)
        members.setdefault(name, []).append(url)
    # A member's ID comes from its sorted peer URLs (and the token): the same URLs, the same ID.
    seen: dict[tuple[str, ...], str] = {}
    for name, urls in members.items():
        other = seen.setdefault(tuple(sorted(urls)), name)
        if other != name:
            raise ConfigError(f"{source}: member exists with identical ID ({other} and {name} have the same peer "
                              f"URLs {sorted(urls)})")
    return list(members.items())


def _peer_config(f: Flags, name: str, peer_urls: list[str]) -> dict[str, object]:
    host, port, peer_tls = _one_url(f, "listen_peer_urls")
    out: dict[str, object] = {"listen_peer_host": host, "listen_peer_port": port, "peer_tls": peer_tls}
    for url in peer_urls:
        _host_port(f.source("initial_advertise_peer_urls"), url)
    if peer_tls:
        out.update(_tls_files(f, ("peer_cert_file", "peer_key_file", "peer_trusted_ca_file"), "peer"))
    out["peer_secret"] = _read_secret(f, "peer_secret_file")
    if not peer_tls and out["peer_secret"] is None:
        raise ConfigError("peer traffic must be authenticated: use https:// with --peer-cert-file/--peer-key-file/"
                          "--peer-trusted-ca-file (mTLS), or --peer-secret-file in development")
    cluster_source = f.source("initial_cluster")
    initial_cluster = parse_initial_cluster(f["initial_cluster"] or f"{name}={','.join(peer_urls)}", cluster_source)
    mine = dict(initial_cluster).get(name)
    if mine is None:
        raise ConfigError(f"{cluster_source}: has no member named {name!r} ({f.source('name')})")
    if sorted(mine) != sorted(peer_urls):
        raise ConfigError(f"{cluster_source}: {name}'s URLs {mine} differ from "
                          f"{f.source('initial_advertise_peer_urls')}")
    out["initial_cluster"] = initial_cluster
    out["initial_cluster_state"] = f["initial_cluster_state"]
    heartbeat = integer(f, "heartbeat_interval", 1)
    election = integer(f, "election_timeout")
    if election < 5 * heartbeat:
        raise ConfigError(f"{f.source('election_timeout')} must be at least 5 times "
                          f"{f.source('heartbeat_interval')} (etcd's rule)")
    if election > MAX_ELECTION_MS:  # etcd's bound and words
        raise f.error("election_timeout", f"--election-timeout[{election}ms] is too long, and should be set less "
                      f"than {MAX_ELECTION_MS}ms")
    out["heartbeat_interval_ms"], out["election_timeout_ms"] = heartbeat, election
    out["initial_election_tick_advance"] = f["initial_election_tick_advance"]
    out["snapshot_count"] = integer(f, "snapshot_count", 1)
    out["snapshot_catchup_entries"] = integer(f, "snapshot_catchup_entries", 0)
    return out


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> StoreConfig:
    """``(argv, environ)`` -> StoreConfig (environ: os.environ when None); raises ConfigError."""
    f = parse_flags(_parser(), argv, os.environ if environ is None else environ, _env_names)
    host, port, tls = _one_url(f, "listen_internal_urls")
    name = f["name"]
    peer_urls = comma_list(f["initial_advertise_peer_urls"])
    values: dict[str, object] = {}
    if tls:
        values.update(_tls_files(f, ("cert_file", "key_file", "trusted_ca_file"), "internal"))
    values["secret"] = _read_secret(f, "internal_secret_file")
    if not tls and values["secret"] is None:
        raise ConfigError("the internal port must be authenticated: use https:// with --cert-file/--key-file/"
                          "--trusted-ca-file (mTLS), or --internal-secret-file in development")
    values["sidecar_secret"] = _read_secret(f, "sidecar_secret_file")
    if values["sidecar_secret"] is not None and values["sidecar_secret"] == values["secret"]:
        raise f.error("sidecar_secret_file", "must differ from --internal-secret-file")
    if f["sidecar_trusted_ca_file"]:
        if not tls:
            raise f.error("sidecar_trusted_ca_file", "needs an https:// --listen-internal-urls (mTLS)")
        if not Path(f["sidecar_trusted_ca_file"]).is_file():
            raise f.error("sidecar_trusted_ca_file", "no such file")
        values["sidecar_trusted_ca_file"] = Path(f["sidecar_trusted_ca_file"])
    values.update(_crl(f, tls, values))
    values.update(_auth_token(f))
    values["auth_token_ttl"] = integer(f, "auth_token_ttl", 1)
    values["bcrypt_workers"] = integer(f, "bcrypt_workers", 1)
    values.update(_oidc(f))
    values.update(_peer_config(f, name, peer_urls))
    _sidecars_are_no_peers(f, values)
    advertise_internal = comma_list(f["advertise_internal_urls"])
    for url in advertise_internal:
        _host_port(f.source("advertise_internal_urls"), url)
    if not advertise_internal and host not in ("0.0.0.0", "::"):
        advertise_internal = comma_list(f["listen_internal_urls"])  # exactly one (checked above)
    values["advertise_internal_urls"] = advertise_internal
    values["advertise_gateway_urls"] = _gateway_urls(f)
    observe = observe_config(argparse.Namespace(metrics_addr=f["metrics_addr"], health_addr=f["health_addr"]),
                             ConfigError, {dest: f.source(dest) for dest in ("metrics_addr", "health_addr")})
    # Out of range -> the default, as etcd (and the proxy) do for --bcrypt-cost.
    cost = f["bcrypt_cost"]
    password = None
    if f["initial_root_password_file"]:
        try:
            password = read_password_file(f["initial_root_password_file"])
        except PasswordFileError as exc:
            raise f.error("initial_root_password_file", str(exc)) from None
    return StoreConfig(
        name=name, data_dir=Path(f["data_dir"] or f"{name}.raftgate"), listen_host=host, listen_port=port, tls=tls,
        advertise_client_urls=comma_list(f["advertise_client_urls"]), peer_urls=peer_urls,
        initial_cluster_token=f["initial_cluster_token"], max_txn_ops=integer(f, "max_txn_ops", 1),
        quota_backend_bytes=_quota(f), log_level=f["log_level"],
        max_watches_per_stream=integer(f, "max_watches_per_stream", 1),
        max_watches_per_user=integer(f, "max_watches_per_user", 1), observe=observe,
        bcrypt_cost=cost if MIN_COST <= cost <= MAX_COST else DEFAULT_COST, initial_root_password=password,
        auth_lockout_attempts=integer(f, "auth_lockout_attempts", 0, 1_000_000),
        auth_lockout_duration_ms=_lockout_duration(f),
        **values,  # type: ignore[arg-type]
    )


def _auth_token(f: Flags) -> dict[str, object]:
    """--auth-token with the proxy's parser, and a JWT key loaded now: a string one program refuses the
    other refuses too, with the flag named and exit 2, before anything starts."""
    try:
        spec = parse_auth_token(f["auth_token"] or "")
    except AuthOptionError as e:
        raise f.error("auth_token", str(e)) from None
    if spec.kind == NOP:
        raise f.error("auth_token", "is empty: the store issues the tokens of sidecars' Authenticate calls "
                      f"({SIMPLE} or {JWT},...)")
    if spec.jwt is None:
        return {"auth_token": spec}
    if spec.jwt.jwks_url:
        raise f.error("auth_token", "jwks-url is for a proxy: the store verifies sidecars' JWTs with the "
                      "pub-key files")
    try:
        keys = JwtKeys.from_files(spec.jwt.sign_method, spec.jwt.priv_key, spec.jwt.pub_key,
                                  ttl_seconds=spec.jwt.ttl_seconds)
    except KeyLoadError as e:
        raise f.error("auth_token", str(e)) from None
    return {"auth_token": spec, "jwt": keys}


def _crl(f: Flags, tls: bool, values: dict[str, object]) -> dict[str, Path]:
    """--client-crl-file: loadable now, each CRL signed by a CA of the internal port's bundles."""
    if f["client_crl_file"] is None:
        return {}
    if not str(f["client_crl_file"]).strip():
        raise f.error("client_crl_file", "is empty (a CRL file)")
    if not tls:
        raise f.error("client_crl_file", "needs an https:// --listen-internal-urls (mTLS): it revokes client "
                      "certificates")
    path = Path(f["client_crl_file"])
    try:
        revocation_list(path, values, source=f.source("client_crl_file"))
    except CRLError as exc:
        raise ConfigError(str(exc)) from None
    return {"client_crl_file": path}


def revocation_list(crl: Path, values: Mapping[str, object], *, source: str = "--client-crl-file") -> RevocationList:
    """The internal port's CRL, verified against the central and sidecar CA files (raises CRLError)."""
    cas = [str(values[dest]) for dest in ("trusted_ca_file", "sidecar_trusted_ca_file") if values.get(dest)]
    return RevocationList(str(crl), cas, source=source, ca_source="--trusted-ca-file/--sidecar-trusted-ca-file")


_OIDC = ("oidc_issuer", "oidc_audience", "oidc_jwks_file", "oidc_ca_file", "oidc_user_map")


def _oidc(f: Flags) -> dict[str, str | None]:
    """--oidc-*: the same rules as the proxy's flags (the files are read at start-up, in main)."""
    values = {dest: (str(f[dest]).strip() or None) if f[dest] else None for dest in _OIDC}
    if values["oidc_issuer"] is None:
        given = [dest for dest in _OIDC if values[dest] is not None]
        if given:
            raise ConfigError(f"{f.source(given[0])} needs --oidc-issuer")
        return values
    for dest in ("oidc_audience", "oidc_user_map"):
        if values[dest] is None:
            raise ConfigError(f"{f.source('oidc_issuer')} needs {f.source(dest)}")
    return values


def _lockout_duration(f: Flags) -> int:
    try:
        ns = parse_go_duration(str(f["auth_lockout_duration"]).strip())
    except ValueError as exc:
        raise f.error("auth_lockout_duration", str(exc)) from None
    ms = ns // 1_000_000
    if not 0 < ms <= MAX_LOCKOUT_DURATION_MS:
        raise f.error("auth_lockout_duration", "must be at least 1ms and at most 8784h (a year)")
    return ms


def _quota(f: Flags) -> int:
    if f["quota_backend_bytes"] < 1 << 20:
        raise f.error("quota_backend_bytes", "must be at least 1 MiB")
    if f["quota_backend_bytes"] > MAX_QUOTA_BYTES:
        raise f.error("quota_backend_bytes", f"must be at most {MAX_QUOTA_BYTES} (16 TiB: the store maps twice "
                      "its quota, and a larger map fails at start-up)")
    return int(f["quota_backend_bytes"])
