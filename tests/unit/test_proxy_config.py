"""Proxy configuration: defaults, env vars, etcd's silent corrections, and a clear error per bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, load


@pytest.fixture
def secret(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_text("dev-secret\n")
    return str(path)


def base(secret: str, *more: str) -> list[str]:
    return ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}", *more]


def test_defaults(secret: str) -> None:
    cfg = load(base(secret), env={})
    assert cfg.listen == ("127.0.0.1:2379",)
    assert cfg.store_endpoints == ("127.0.0.1:7000",)
    assert cfg.internal_secret == "dev-secret"
    assert cfg.auth_token.kind == "simple" and cfg.jwt is None
    assert (cfg.auth_token_ttl, cfg.bcrypt_cost, cfg.max_request_bytes) == (300, 10, 1572864)
    assert cfg.grpc_max_receive_bytes == 1572864 + 512 * 1024
    assert cfg.bcrypt_workers >= 1


def test_env_and_flag_precedence(secret: str) -> None:
    env = {
        "RAFTGATE_PROXY_BCRYPT_COST": "12",
        "RAFTGATE_PROXY_AUTH_TOKEN_TTL": "7",
        "RAFTGATE_PROXY_LISTEN_CLIENT_URLS": "http://127.0.0.1:1,unix:///tmp/x.sock",
    }
    cfg = load(base(secret, "--auth-token-ttl=9"), env=env)
    assert (cfg.bcrypt_cost, cfg.auth_token_ttl) == (12, 9)
    assert cfg.listen == ("127.0.0.1:1", "unix:/tmp/x.sock")


def test_etcd_corrections(secret: str) -> None:
    assert load(base(secret, "--bcrypt-cost=3"), env={}).bcrypt_cost == 10
    assert load(base(secret, "--bcrypt-cost=32"), env={}).bcrypt_cost == 10


@pytest.mark.parametrize("ttl", ["0", "-5"])
def test_a_token_ttl_that_is_not_positive_is_an_error(secret: str, ttl: str) -> None:
    """Not a silent 300 (etcd's simple token provider swaps in 300 s; a typo should not)."""
    with pytest.raises(ConfigError, match="--auth-token-ttl"):
        load(base(secret, f"--auth-token-ttl={ttl}"), env={})
    with pytest.raises(ConfigError, match=r"RAFTGATE_PROXY_AUTH_TOKEN_TTL \(--auth-token-ttl\)"):
        load(base(secret), env={"RAFTGATE_PROXY_AUTH_TOKEN_TTL": ttl})


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--bcrypt-cost=ten"], "--bcrypt-cost"),
        (["--auth-token-ttl=1.5"], "--auth-token-ttl"),
        (["--max-request-bytes=0"], "--max-request-bytes"),
        (["--bcrypt-workers=0"], "--bcrypt-workers"),
        (["--listen-client-urls=https://127.0.0.1:2379"], "https"),
        (["--listen-client-urls=tcp://127.0.0.1:2379"], "http://"),
        (["--listen-client-urls=http://127.0.0.1"], "host:port"),
        (["--listen-client-urls=http://127.0.0.1:99999"], "host:port"),
        (["--store-endpoints=nope"], "--store-endpoints"),
        (["--auth-token=opaque"], "auth: invalid auth options"),
        (["--auth-token=jwt,sign-method=RS256"], "auth: missing key data"),
        (["--auth-token=jwt,sign-method=XX"], "auth: invalid auth signature method"),
        (["--internal-cert=/x"], "together"),
        (["--no-such-flag"], "unrecognized"),
    ],
)
def test_bad_values(secret: str, args: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(base(secret, *args), env={})
    assert needle in str(e.value)


def test_credentials_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="internal credential"):
        load(["--store-endpoints=127.0.0.1:7000"], env={})
    with pytest.raises(ConfigError, match="--store-endpoints"):
        load([f"--internal-secret-file={tmp_path / 'x'}"], env={})
    with pytest.raises(ConfigError, match="cannot read"):
        load(["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={tmp_path / 'x'}"], env={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        load(["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={tmp_path / 'empty'}"], env={})


def test_mtls_files_loaded(tmp_path: Path) -> None:
    for name in ("ca", "cert", "key"):
        (tmp_path / name).write_bytes(name.encode())
    cfg = load(
        [
            "--store-endpoints=127.0.0.1:7000",
            f"--internal-ca={tmp_path / 'ca'}",
            f"--internal-cert={tmp_path / 'cert'}",
            f"--internal-key={tmp_path / 'key'}",
        ],
        env={},
    )
    assert cfg.internal_tls is not None and cfg.internal_tls.key == b"key" and cfg.internal_secret is None


def test_sidecar_mode_holds_no_signing_key(secret: str, tmp_path: Path) -> None:
    """--sidecar (or RAFTGATE_PROXY_SIDECAR=true): tokens and passwords go to the store; a JWT
    private key is refused (the store signs sidecars' tokens), identity mode needs no key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert not load(base(secret), env={}).sidecar
    assert load(base(secret, "--sidecar"), env={}).sidecar
    assert load(base(secret), env={"RAFTGATE_PROXY_SIDECAR": "true"}).sidecar
    key = tmp_path / "jwt.key"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    with pytest.raises(ConfigError, match="holds no JWT private key"):
        load(base(secret, "--sidecar", f"--auth-token=jwt,priv-key={key},sign-method=ES256"), env={})
    identity = tmp_path / "identity"
    identity.write_text("app\napppw\n")
    cfg = load(base(secret, "--sidecar", "--auth-token=", f"--identity-file={identity}"), env={})
    assert cfg.identity is not None and cfg.jwt is None


def test_workers_default_one_and_a_fixed_tcp_port_to_share(secret: str) -> None:
    """--workers N shares one fixed TCP port: a Unix socket, port 0 or the gateway cannot be shared."""
    assert load(base(secret), env={}).workers == 1
    assert load(base(secret, "--workers=2", "--listen-client-urls=http://127.0.0.1:23790"), env={}).workers == 2
    assert load(base(secret), env={"RAFTGATE_PROXY_WORKERS": "3"}).workers == 3
    for more, needle in [
        (["--workers=0"], "--workers: must be in 1..64"),
        (["--workers=2", "--listen-client-urls=unix:///tmp/x.sock"], "unix:// listeners cannot be shared"),
        (["--workers=2", "--listen-client-urls=http://127.0.0.1:0"], "has port 0"),
        (["--workers=2", "--listen-gateway-urls=http://127.0.0.1:23791"], "--listen-gateway-urls is served by one"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            load(base(secret, *more), env={})


def test_workers_refuse_a_port_someone_holds(secret: str) -> None:
    """The supervisor checks the port before any worker binds it with SO_REUSEPORT: a port in use
    stays an error, in the words of a single proxy's failed bind."""
    import socket

    from proxy.workers import check_ports_free

    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        config = load(base(secret, "--workers=2", f"--listen-client-urls=http://127.0.0.1:{port}"), env={})
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: the port is in use"):
            check_ports_free(config)


def test_bcrypt_workers_and_proxy_workers_are_separate(secret: str) -> None:
    """--bcrypt-workers (threads) and --workers (processes) do not overwrite each other."""
    cfg = load(base(secret, "--bcrypt-workers=2", "--workers=3", "--listen-client-urls=http://127.0.0.1:23790"),
               env={})
    assert (cfg.bcrypt_workers, cfg.workers) == (2, 3)
    assert load(base(secret, "--bcrypt-workers=2"), env={}).bcrypt_workers == 2


def test_sidecar_refuses_client_certificate_auth(secret: str) -> None:
    """--client-cert-auth names the user by a certificate only the proxy sees; a sidecar's requests
    carry identities the store verifies itself, and the store never sees that certificate."""
    with pytest.raises(ConfigError, match="--client-cert-auth cannot be used with --sidecar"):
        load(base(secret, "--sidecar", "--client-cert-auth"), env={})


def test_a_request_size_the_store_could_not_take_is_refused_at_start(secret: str) -> None:
    """The store takes messages of up to 64 MiB on each of its ports (a request on its way in, an
    entry replicated to a follower). A proxy started with a larger --max-request-bytes let one
    client's request over that reach the store, which refused the whole stream carrying it, and
    with it every other client's call on the stream (and every watch on a shared watch stream,
    again at each resume). Refused at start instead, naming the flag; up to 62 MiB is taken."""
    with pytest.raises(ConfigError, match=r"--max-request-bytes.*at most 65011712"):
        load(base(secret, "--max-request-bytes=65011713"), env={})
    assert load(base(secret, "--max-request-bytes=65011712"), env={}).max_request_bytes == 65011712
