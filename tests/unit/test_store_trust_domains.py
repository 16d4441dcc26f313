"""A sidecar's credential must not also be a store peer's (issue 21: trust domains stay apart).

The peer port admits any holder of the peer credential as a store node: it sends Raft messages
(entries, votes, snapshots) that the cluster applies without any other check, so a peer is more
than root. A sidecar's credential is held by whoever reads an application namespace's Secrets.
The store refuses a sidecar secret equal to the central one and a sidecar CA that is a central CA;
the same must hold for the peer credential: the same secret in ``--sidecar-secret-file`` and
``--peer-secret-file``, or a sidecar CA whose key is a peer CA's, would make every sidecar a peer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from authstore import config
from raftgate.config_support import ConfigError
from tests.support.processes import write_test_pki

PEER = "http://127.0.0.1:12380"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("ETCD_", "RAFTGATE_STORE_"))]:
        monkeypatch.delenv(name)


def _secret(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_sidecar_secret_that_is_the_peer_secret_is_refused(tmp_path: Path) -> None:
    internal = _secret(tmp_path / "internal", "internal-secret-0123456789")
    shared = _secret(tmp_path / "shared", "shared-secret-0123456789")
    args = ["--internal-secret-file", internal, "--listen-peer-urls", PEER, "--initial-advertise-peer-urls", PEER]
    with pytest.raises(ConfigError, match="--sidecar-secret-file.*--peer-secret-file"):
        config.parse([*args, "--sidecar-secret-file", shared, "--peer-secret-file", shared], environ={})
    other = _secret(tmp_path / "other", "shared-secret-0123456789\n")  # the same once read (stripped)
    with pytest.raises(ConfigError, match="--sidecar-secret-file.*--peer-secret-file"):
        config.parse([*args, "--sidecar-secret-file", shared, "--peer-secret-file", other], environ={})
    peer = _secret(tmp_path / "peer", "peer-secret-0123456789")
    config.parse([*args, "--sidecar-secret-file", shared, "--peer-secret-file", peer], environ={})


def _mtls_args(central: dict[str, Path], peer: dict[str, Path], sidecar_ca: Path) -> list[str]:
    peer_url = "https://127.0.0.1:12380"
    return ["--listen-internal-urls", "https://127.0.0.1:12379", "--cert-file", str(central["server.crt"]),
            "--key-file", str(central["server.key"]), "--trusted-ca-file", str(central["ca"]),
            "--sidecar-trusted-ca-file", str(sidecar_ca), "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url, "--peer-cert-file", str(peer["server.crt"]),
            "--peer-key-file", str(peer["server.key"]), "--peer-trusted-ca-file", str(peer["ca"])]


def test_a_sidecar_ca_that_is_a_peer_ca_is_refused(tmp_path: Path) -> None:
    central = write_test_pki(tmp_path / "central", ["proxy"])
    peer = write_test_pki(tmp_path / "peer", [], ca_name="raftgate-test-peer-ca")
    sidecar = write_test_pki(tmp_path / "sidecar", ["sidecar"], ca_name="raftgate-test-sidecar-ca")
    with pytest.raises(ConfigError, match="--sidecar-trusted-ca-file.*--peer-trusted-ca-file"):
        config.parse(_mtls_args(central, peer, peer["ca"]), environ={})
    bundle = tmp_path / "sidecar-bundle.crt"  # a bundle that holds the peer CA among others
    bundle.write_bytes(sidecar["ca"].read_bytes() + peer["ca"].read_bytes())
    with pytest.raises(ConfigError, match="--sidecar-trusted-ca-file.*--peer-trusted-ca-file"):
        config.parse(_mtls_args(central, peer, bundle), environ={})
    config.parse(_mtls_args(central, peer, sidecar["ca"]), environ={})  # CAs of their own: fine
