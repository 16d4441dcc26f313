"""A store node's advertised URLs (``--advertise-gateway-urls``, ``--advertise-internal-urls``) are
refused at start-up when etcd would refuse them as client URLs: a control character (etcd 3.5.1:
``net/url: invalid control character in URL``) or a port that is no number.

The store keeps those URLs beside the member record joined by newlines, and publishes them until it
reads back what it was given. Python's URL parser drops newlines before it looks, so a URL holding
one was accepted and read back as two: the node proposed its attributes again, and again, about a
thousand Raft entries a second for as long as it ran (the log and the database grew without end),
and HTTP clients that discover through the gateway were handed the second half as a member's URL.

Finding: a newline inside one of these flag values made the store propose forever (fails before the fix).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from authstore import config
from raftgate.config_support import ConfigError
from tests.support.processes import ETCD, free_port, secret_file

#: a newline where a list separator (a comma) was meant, as a YAML block might give it
NEWLINE = "http://127.0.0.1:2380/\nhttp://127.0.0.1:2381"
HOSTILE = [NEWLINE, "http://127.0.0.1:2380\nhttp://127.0.0.1:2381", "http://127.0.0.1:2380/\njavascript:alert(1)", "http://127.0.0.1:2380/a\rb",
           "http://127.0.0.1:2380/\tx", "http://127.0.0.1:2380/\x00", "http://127.0.0.1:2380/\x7f"]
FLAGS = ["--advertise-gateway-urls", "--advertise-internal-urls"]


def _parse(tmp_path: Path, *extra: str) -> config.StoreConfig:
    secret = str(secret_file(tmp_path))
    return config.parse(["--internal-secret-file", secret, "--peer-secret-file", secret,
                         "--listen-peer-urls", "http://127.0.0.1:12380", *extra], environ={})


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("url", HOSTILE)
def test_a_control_character_in_an_advertised_url_is_refused(tmp_path: Path, flag: str, url: str) -> None:
    with pytest.raises(ConfigError, match=f"{flag}: .*control character"):
        _parse(tmp_path, flag, url)


@pytest.mark.parametrize("flag", FLAGS)
def test_a_port_that_is_no_number_is_refused_with_the_flags_name(tmp_path: Path, flag: str) -> None:
    for url in ("http://127.0.0.1:x", "http://127.0.0.1:99999", "http://[::1:2380"):
        with pytest.raises(ConfigError, match=f"{flag}: .*is not http"):
            _parse(tmp_path, flag, url)


def test_good_urls_are_kept_as_given(tmp_path: Path) -> None:
    cfg = _parse(tmp_path, "--advertise-gateway-urls", "http://a.example:8080, https://b.example:8443/",
                 "--advertise-internal-urls", "http://10.0.0.1:23790")
    assert cfg.advertise_gateway_urls == ["http://a.example:8080", "https://b.example:8443/"]
    assert cfg.advertise_internal_urls == ["http://10.0.0.1:23790"]


@pytest.mark.slow
def test_the_store_does_not_start_with_a_newline_in_its_gateway_url_as_etcd_does_not(tmp_path: Path) -> None:
    """Side by side: etcd 3.5.1 refuses a newline in --advertise-client-urls before it starts; the
    store refuses it in --advertise-gateway-urls (before the fix it started and proposed forever)."""
    peer, client = free_port(), free_port()
    etcd = subprocess.run([ETCD, "--data-dir", str(tmp_path / "etcd"), "--listen-client-urls",
                           f"http://127.0.0.1:{client}", "--advertise-client-urls", NEWLINE,
                           "--listen-peer-urls", f"http://127.0.0.1:{peer}"],
                          capture_output=True, text=True, timeout=60)
    assert etcd.returncode != 0 and "invalid control character in URL" in etcd.stderr, etcd.stderr[-2000:]
    secret = str(secret_file(tmp_path))
    internal, peer = free_port(), free_port()
    store = subprocess.run([sys.executable, "-m", "raftgate.cli", "store", "--name", "s1", "--data-dir",
                            str(tmp_path / "store"), "--listen-internal-urls", f"http://127.0.0.1:{internal}",
                            "--internal-secret-file", secret, "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                            "--peer-secret-file", secret, "--advertise-gateway-urls", NEWLINE],
                           capture_output=True, text=True, timeout=60)
    assert store.returncode == 2, store.stderr[-2000:]
    assert "--advertise-gateway-urls" in store.stderr and "control character" in store.stderr, store.stderr
    assert not (tmp_path / "store").exists()  # refused before anything was written
