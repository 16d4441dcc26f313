"""`raftgate store` reads etcd's environment variables (ETCD_<FLAG>) for the flags that have
etcd's name, below RAFTGATE_STORE_* and flags, as etcd reads them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from authstore import config

PEER = "http://127.0.0.1:12380"


@pytest.fixture
def secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith(("ETCD_", "RAFTGATE_STORE_"))]:
        monkeypatch.delenv(name)
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef0123")
    return path


def _parse(secret: Path, *extra: str) -> config.StoreConfig:
    return config.parse(["--internal-secret-file", str(secret), "--peer-secret-file", str(secret),
                         "--listen-peer-urls", PEER, *extra])


def test_etcdctl_member_add_lines_configure_the_member(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_NAME", "infra4")
    monkeypatch.setenv("ETCD_INITIAL_CLUSTER", f"infra1=http://127.0.0.1:12381,infra4={PEER}")
    monkeypatch.setenv("ETCD_INITIAL_ADVERTISE_PEER_URLS", PEER)
    monkeypatch.setenv("ETCD_INITIAL_CLUSTER_STATE", "existing")
    cfg = _parse(secret)
    assert cfg.name == "infra4"
    assert cfg.initial_cluster == [("infra1", ["http://127.0.0.1:12381"]), ("infra4", [PEER])]
    assert cfg.peer_urls == [PEER]
    assert cfg.initial_cluster_state == "existing"
    assert cfg.data_dir == Path("infra4.raftgate")


def test_other_etcd_flags_come_from_etcd_names(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_INITIAL_ADVERTISE_PEER_URLS", PEER)
    monkeypatch.setenv("ETCD_DATA_DIR", "/var/lib/etcd")
    monkeypatch.setenv("ETCD_HEARTBEAT_INTERVAL", "50")
    monkeypatch.setenv("ETCD_ELECTION_TIMEOUT", "500")
    monkeypatch.setenv("ETCD_MAX_TXN_OPS", "64")
    monkeypatch.setenv("ETCD_LOG_LEVEL", "warn")
    cfg = _parse(secret)
    assert (cfg.data_dir, cfg.heartbeat_interval_ms, cfg.election_timeout_ms) == (Path("/var/lib/etcd"), 50, 500)
    assert (cfg.max_txn_ops, cfg.log_level) == (64, "warn")


def test_raftgate_names_and_flags_win(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_INITIAL_ADVERTISE_PEER_URLS", PEER)
    monkeypatch.setenv("ETCD_NAME", "from-etcd")
    monkeypatch.setenv("RAFTGATE_STORE_NAME", "from-raftgate")
    monkeypatch.setenv("ETCD_MAX_TXN_OPS", "64")
    assert _parse(secret).name == "from-raftgate"
    assert _parse(secret, "--name", "from-flag", "--max-txn-ops", "32").max_txn_ops == 32


def test_only_flags_with_etcds_name(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """raftgate's own flags are not read from ETCD_* (etcd has no such variable to set)."""
    monkeypatch.setenv("ETCD_INITIAL_ADVERTISE_PEER_URLS", PEER)
    monkeypatch.setenv("ETCD_MAX_WATCHES_PER_STREAM", "7")
    monkeypatch.setenv("ETCD_INTERNAL_SECRET_FILE", "/nonexistent")
    cfg = _parse(secret)
    assert cfg.max_watches_per_stream == 10_000


def test_a_bad_etcd_value_names_the_variable(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ETCD_SNAPSHOT_COUNT", "many")
    with pytest.raises(config.ConfigError,
                       match="ETCD_SNAPSHOT_COUNT: 'many' is not a valid value for --snapshot-count"):
        _parse(secret)


def test_oidc_flags_as_the_proxy_s(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--oidc-*: the store verifies workload tokens sidecars forward; the same required pairs."""
    assert _parse(secret).oidc_issuer is None
    monkeypatch.setenv("RAFTGATE_STORE_OIDC_AUDIENCE", "raftgate")
    cfg = _parse(secret, "--oidc-issuer", "https://k8s.invalid", "--oidc-user-map", "/m.json")
    assert (cfg.oidc_issuer, cfg.oidc_audience, cfg.oidc_user_map) == ("https://k8s.invalid", "raftgate", "/m.json")
    with pytest.raises(config.ConfigError, match="needs --oidc-user-map"):
        _parse(secret, "--oidc-issuer", "https://k8s.invalid")
    monkeypatch.delenv("RAFTGATE_STORE_OIDC_AUDIENCE")
    with pytest.raises(config.ConfigError, match="needs --oidc-issuer"):
        _parse(secret, "--oidc-jwks-file", "/k.json")


def test_initial_election_tick_advance_is_etcds_flag(secret: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On by default; off with --initial-election-tick-advance=false or etcd's variable."""
    monkeypatch.setenv("ETCD_INITIAL_ADVERTISE_PEER_URLS", PEER)
    assert _parse(secret).initial_election_tick_advance is True
    assert _parse(secret, "--initial-election-tick-advance=false").initial_election_tick_advance is False
    assert _parse(secret, "--initial-election-tick-advance").initial_election_tick_advance is True
    monkeypatch.setenv("ETCD_INITIAL_ELECTION_TICK_ADVANCE", "false")
    assert _parse(secret).initial_election_tick_advance is False
    assert _parse(secret, "--initial-election-tick-advance=true").initial_election_tick_advance is True
