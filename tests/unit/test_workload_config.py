"""The proxy's --oidc-* and --identity-oidc-token-file flags: what start-up accepts and refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.config import ConfigError, load
from tests.support.oidc_issuer import public_jwk, rsa_key


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "secret").write_text("s3cret-for-tests-only")
    (tmp_path / "map.json").write_text(json.dumps([{"match": "system:serviceaccount:a:*", "user": "a"}]))
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [public_jwk(rsa_key(0), "k1")]}))
    (tmp_path / "token").write_text("x.y.z\n")
    return {name: str(tmp_path / name) for name in ("secret", "map.json", "jwks.json", "token")}


def args(files: dict[str, str], *more: str) -> list[str]:
    return ["--store-endpoints", "127.0.0.1:1", "--internal-secret-file", files["secret"], *more]


def test_workload_identity_flags(files: dict[str, str]) -> None:
    oidc = ["--oidc-issuer", "https://kubernetes.default.svc", "--oidc-audience", "raftgate",
            "--oidc-user-map", files["map.json"]]
    assert load(args(files), env={}).workload is None
    cfg = load(args(files, *oidc, "--oidc-jwks-file", files["jwks.json"]), env={})
    assert cfg.workload is not None and cfg.workload.audience == "raftgate"
    assert load(args(files, *oidc), env={}).workload is not None  # discovery: fetched at the first token
    cfg = load(args(files, *oidc, "--identity-oidc-token-file", files["token"]), env={})
    assert cfg.identity is not None and cfg.identity.kind == "oidc"


@pytest.mark.parametrize(("more", "message"), [
    (["--oidc-issuer", "https://k8s"], "--oidc-audience"),
    (["--oidc-issuer", "https://k8s", "--oidc-audience", "a"], "--oidc-user-map"),
    (["--oidc-audience", "a"], "needs --oidc-issuer"),
    (["--oidc-issuer", "http://k8s.example", "--oidc-audience", "a", "--oidc-user-map", "MAP"], "https"),
    (["--oidc-issuer", "https://k8s", "--oidc-audience", "a", "--oidc-user-map", "JWKS"], "user map"),
    (["--oidc-issuer", "https://k8s", "--oidc-audience", "a", "--oidc-user-map", "MAP", "--oidc-jwks-file", "MAP"],
     "JWKS"),
    (["--identity-oidc-token-file", "TOKEN"], "needs --oidc-issuer"),
    (["--identity-oidc-token-file", "TOKEN", "--identity-jwt-file", "TOKEN"], "mutually exclusive"),
])
def test_bad_workload_flags_are_refused(files: dict[str, str], more: list[str], message: str) -> None:
    names = {"MAP": files["map.json"], "JWKS": files["jwks.json"], "TOKEN": files["token"]}
    with pytest.raises(ConfigError, match=message):
        load(args(files, *[names.get(m, m) for m in more]), env={})
