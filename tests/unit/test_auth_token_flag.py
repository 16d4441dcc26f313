"""``--auth-token``: one parser (etcd's rules) for both programs, so a string the proxy refuses the
store refuses too, and both exit 2 naming the flag before anything starts.

etcd (server/auth/store.go decomposeOpts, server/auth/options.go, jwt.go): comma-split, the first
element is the type (``simple``, ``jwt`` or empty), each other element exactly ``key=value``, a
duplicate key refused, an unknown key only warned about, an empty value the same as no value,
``sign-method`` one of jwt-go's names (case-sensitive), ``ttl`` a Go duration. raftgate is
stricter on one point: a ttl that is not positive is refused.
"""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import authstore.config
import authstore.main
import proxy.config
import proxy.main

# {pub}: a valid RSA public key file; {missing}: a path that does not exist
ACCEPTED = [
    "simple",
    "simple,x=y",  # etcd ignores a simple provider's options
    "jwt,sign-method=RS256,pub-key={pub}",
    "jwt,pub-key={pub},sign-method=RS256,ttl=1h30m",
    "jwt,sign-method=RS256,pub-key={pub},ttl=1.5h",
    "jwt,sign-method=RS256,pub-key={pub},ttl=500us",  # any Go unit
    "jwt,sign-method=RS256,pub-key={pub},ttl=",  # empty: the default
    "jwt,sign-method=RS256,pub-key={pub},priv-key=",  # empty: not given
    "jwt,sign-method=RS256,pub-key={pub},x=y",  # unknown key: a warning, as in etcd
    "jwt,sign-method=RS256,pub-key={pub},=y",  # an empty key is one more unknown key
    "jwt,sign-method=PS512,pub-key={pub}",
]
REFUSED = [
    "opaque",  # unknown type
    " simple",  # no trimming: etcd sees the type " simple"
    "Simple",
    "simple,x",  # not key=value
    "jwt,sign-method=RS256,pub-key={pub},pub-key={pub}",  # duplicate key
    "jwt,sign-method=RS256,pub-key={pub},ttl=5m,ttl=5m",
    "jwt,sign-method=RS256=x,pub-key={pub}",  # two '='
    "jwt,sign-method=RS256, pub-key={pub}",  # " pub-key" is an unknown key: no key left
    "jwt,sign-method=RS256,pub-key={pub},ttl=forever",
    "jwt,sign-method=RS256,pub-key={pub},ttl=5",  # a Go duration needs a unit
    "jwt,sign-method=RS256,pub-key={pub},ttl=0s",
    "jwt,sign-method=RS256,pub-key={pub},ttl=-5m",
    "jwt,sign-method=RS256,pub-key={pub},ttl=1d",
    "jwt,sign-method=RS256,pub-key={pub},ttl=\u0661h",  # Go's digits are ASCII: ARABIC-INDIC DIGIT ONE is none
    "jwt,sign-method=RS256,pub-key={pub},ttl=\uff15m",  # nor is FULLWIDTH DIGIT FIVE
    "jwt,sign-method=rs256,pub-key={pub}",  # names are case-sensitive
    "jwt,sign-method=none,pub-key={pub}",
    "jwt,sign-method=XX,pub-key={pub}",
    "jwt,sign-method=,pub-key={pub}",
    "jwt,pub-key={pub}",
    "jwt",
    "jwt,sign-method=RS256",  # no key
    "jwt,sign-method=RS256,pub-key={missing}",
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("auth-token")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp / "k.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                              serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp / "secret").write_text("dev-secret-of-32-bytes-0123456789\n")
    (tmp / "peer-secret").write_text("peer-secret-of-32-bytes-0123456789\n")
    return {"pub": str(tmp / "k.pub"), "missing": str(tmp / "missing"), "secret": str(tmp / "secret"),
            "peer_secret": str(tmp / "peer-secret"), "dir": str(tmp)}


def _proxy_argv(files: dict[str, str], token: str) -> list[str]:
    return ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={files['secret']}", f"--auth-token={token}"]


def _store_argv(files: dict[str, str], token: str) -> list[str]:
    return [f"--internal-secret-file={files['secret']}", f"--peer-secret-file={files['peer_secret']}",
            f"--data-dir={files['dir']}/data", f"--auth-token={token}"]


@pytest.mark.parametrize("template", ACCEPTED)
def test_both_programs_accept(files: dict[str, str], template: str) -> None:
    token = template.format(**files)
    proxy.config.load(_proxy_argv(files, token), env={})
    authstore.config.parse(_store_argv(files, token), {})


@pytest.mark.parametrize("template", REFUSED)
def test_both_programs_refuse_with_exit_2_naming_the_flag(files: dict[str, str], template: str) -> None:
    token = template.format(**files)
    with pytest.raises(proxy.config.ConfigError, match="--auth-token"):
        proxy.config.load(_proxy_argv(files, token), env={})
    # The store refuses it while reading its flags, before any file in the data dir is touched.
    with pytest.raises(authstore.config.ConfigError, match="--auth-token"):
        authstore.config.parse(_store_argv(files, token), {})
    umask = os.umask(0o022)  # the store's main sets its own: give the test process its umask back
    try:
        for main, argv in ((proxy.main.main, _proxy_argv(files, token)),
                           (authstore.main.main, _store_argv(files, token))):
            err = io.StringIO()
            with redirect_stderr(err):
                assert main(argv) == 2
            assert "--auth-token" in err.getvalue()
    finally:
        os.umask(umask)
    assert not Path(files["dir"], "data").exists()


def test_the_store_refuses_an_empty_auth_token(files: dict[str, str]) -> None:
    """The proxy's "" (no tokens, as etcd's nop provider) has no meaning for the store, which issues
    sidecars' tokens: refused while reading the flags, exit 2, not later at start-up."""
    with pytest.raises(authstore.config.ConfigError, match="--auth-token"):
        authstore.config.parse(_store_argv(files, ""), {})


def test_the_store_refuses_a_jwks_url(files: dict[str, str]) -> None:
    """The store verifies sidecars' JWTs with pub-key files only: a jwks-url it would ignore is refused."""
    with pytest.raises(authstore.config.ConfigError, match="--auth-token.*jwks-url"):
        authstore.config.parse(_store_argv(files, f"jwt,sign-method=RS256,pub-key={files['pub']},"
                                                  "jwks-url=https://127.0.0.1:1/jwks"), {})


def test_the_store_config_holds_the_parsed_keys(files: dict[str, str]) -> None:
    cfg = authstore.config.parse(_store_argv(files, f"jwt,sign-method=RS256,pub-key={files['pub']},ttl=90s"), {})
    assert cfg.jwt is not None and not cfg.jwt.can_sign
    assert authstore.config.parse(_store_argv(files, "simple"), {}).jwt is None
