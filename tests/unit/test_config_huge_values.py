"""Huge numbers in `raftgate store`'s flags and environment: a config error naming the flag or
the variable (exit code 2), as etcd refuses them, not a store that starts and never elects, nor
a traceback from LMDB at start-up.

Finding: an election timeout over 50 s or a quota LMDB cannot map started a store that never elects,
or failed in LMDB (failed before the fix).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from authstore import config
from raftgate.config_support import ConfigError

PEER = "http://127.0.0.1:12380"


@pytest.fixture
def secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith(("ETCD_", "RAFTGATE_STORE_"))]:
        monkeypatch.delenv(name)
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef0123")
    return path


def _parse(secret: Path, *extra: str, env: dict[str, str] | None = None) -> config.StoreConfig:
    return config.parse(["--internal-secret-file", str(secret), "--peer-secret-file", str(secret),
                         "--listen-peer-urls", PEER, *extra], env or {})


def test_an_election_timeout_over_etcds_bound_is_refused(secret: Path) -> None:
    """etcd: `--election-timeout[60000ms] is too long, and should be set less than 50000ms`."""
    with pytest.raises(ConfigError, match=r"--election-timeout.*is too long, and should be set less than 50000ms"):
        _parse(secret, "--election-timeout", "60000", "--heartbeat-interval", "10000")
    with pytest.raises(ConfigError, match=r"^ETCD_ELECTION_TIMEOUT .*too long"):
        _parse(secret, env={"ETCD_ELECTION_TIMEOUT": "999999999999999999999999",
                            "ETCD_HEARTBEAT_INTERVAL": "99999999999999999999"})
    assert _parse(secret, "--election-timeout", "50000").election_timeout_ms == 50000


@pytest.mark.parametrize("where", ["flag", "env"])
def test_a_quota_the_store_cannot_map_is_refused(secret: Path, where: str) -> None:
    huge = "99999999999999999999999"
    if where == "flag":
        with pytest.raises(ConfigError, match=r"^--quota-backend-bytes: must be at most"):
            _parse(secret, "--quota-backend-bytes", huge)
    else:
        with pytest.raises(ConfigError, match=r"^ETCD_QUOTA_BACKEND_BYTES \(--quota-backend-bytes\): must be at most"):
            _parse(secret, env={"ETCD_QUOTA_BACKEND_BYTES": huge})
    assert _parse(secret, "--quota-backend-bytes", str(8 << 30)).quota_backend_bytes == 8 << 30


def test_two_members_with_the_same_peer_urls_are_refused(secret: Path, tmp_path: Path) -> None:
    """A member's ID is derived from its peer URLs and the token: two names with the same URLs
    would be one member twice in the new cluster's first entries. etcd refuses them (`member
    exists with identical ID`); so do `raftgate store` and `raftgate snapshot restore`."""
    with pytest.raises(ConfigError, match=r"^--initial-cluster: member exists with identical ID"):
        _parse(secret, "--name", "a", "--initial-advertise-peer-urls", PEER,
               "--initial-cluster", f"a={PEER},b={PEER}")
    from tests.support.snapshots import make_snapshot, raftgate

    snap = make_snapshot(tmp_path / "snap", keys=1)
    proc = raftgate("snapshot", "restore", str(snap), "--data-dir", str(tmp_path / "target"), "--name", "a",
                    "--initial-cluster", f"a={PEER},b={PEER}", "--initial-advertise-peer-urls", PEER)
    assert proc.returncode == 1 and "member exists with identical ID" in proc.stderr, proc.stderr
    assert not (tmp_path / "target").exists()
