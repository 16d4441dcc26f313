"""Kubernetes workload identity (raftgate/workload_identity.py): a test issuer on 127.0.0.1 (keys
generated here, discovery document and JWKS served by http.server), and every way a token is refused."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path

import jwt as pyjwt
import pytest

from raftgate.workload_identity import (
    DISCOVERY_PATH,
    NBF_LEEWAY_SECONDS,
    DiscoverySource,
    Fetcher,
    FileSource,
    KeySet,
    UserMap,
    UserMapFile,
    WorkloadConfigError,
    WorkloadRefused,
    WorkloadVerifier,
    build,
)
from tests.support.oidc_issuer import AUDIENCE, DISCOVERY, JWKS, TestIssuer, public_jwk, rsa_key, running_issuer
from tests.support.processes import free_port

RULES = [
    {"match": "system:serviceaccount:shop:cart", "user": "cart"},
    {"match": "system:serviceaccount:shop:admin-*", "user": "shop-admin"},
    {"match": "system:serviceaccount:shop:*", "user": "shop"},
]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def issuer() -> Iterator[TestIssuer]:
    with running_issuer() as it:
        yield it


@functools.cache
def fetcher() -> Fetcher:
    """One for the module: loading the system CA store costs a tenth of a second."""
    return Fetcher()


def verifier(issuer: TestIssuer, *, clock: Clock | None = None, refetch: float = 30.0,
             keys_clock: Clock | None = None, cache_size: int = 4096) -> WorkloadVerifier:
    source = DiscoverySource(issuer.url, fetcher())
    keys = KeySet(source, refetch_interval=refetch, **({"clock": keys_clock} if keys_clock else {}))
    return WorkloadVerifier(issuer.url, AUDIENCE, keys, UserMap.from_json(json.dumps(RULES)),
                            clock=clock or time.time, cache_size=cache_size)


def refused(v: WorkloadVerifier, token: str) -> str:
    with pytest.raises(WorkloadRefused) as err:
        v.verify(token)
    assert token not in str(err.value)
    return str(err.value)


def test_a_projected_token_maps_to_its_user_by_discovery(issuer: TestIssuer) -> None:
    v = verifier(issuer)
    before = issuer.requests[DISCOVERY]
    found = v.verify(issuer.token("system:serviceaccount:shop:cart"))
    assert (found.user, found.subject) == ("cart", "system:serviceaccount:shop:cart")
    assert issuer.requests[DISCOVERY] == before + 1  # discovery, then jwks_uri
    assert v.verify(issuer.token("system:serviceaccount:shop:cart", aud=["other", AUDIENCE])).user == "cart"


def test_rules_exact_then_glob_first_match_wins_and_unmapped_is_refused(issuer: TestIssuer) -> None:
    v = verifier(issuer)
    assert v.verify(issuer.token("system:serviceaccount:shop:admin-1")).user == "shop-admin"
    assert v.verify(issuer.token("system:serviceaccount:shop:checkout")).user == "shop"
    assert refused(v, issuer.token("system:serviceaccount:bank:cart")).startswith("no rule maps subject")
    assert refused(v, issuer.token("system:serviceaccount:SHOP:cart")).startswith("no rule")  # case-sensitive


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"lifetime": -5}, "expired"),  # within PyJWT's leeway, still refused: no leeway on exp
    ({"lifetime": -3600}, "expired"),
    ({"nbf": time.time() + NBF_LEEWAY_SECONDS + 600}, "not yet valid"),
    ({"aud": "etcd"}, "wrong audience"),
    ({"iss": "https://other.example"}, "wrong issuer"),
])
def test_claims_are_checked(issuer: TestIssuer, kwargs: dict[str, object], reason: str) -> None:
    assert refused(verifier(issuer), issuer.token(**kwargs)) == reason  # type: ignore[arg-type]


def test_nbf_within_the_leeway_is_accepted(issuer: TestIssuer) -> None:
    assert verifier(issuer).verify(issuer.token(nbf=time.time() + NBF_LEEWAY_SECONDS / 2)).user == "cart"


def test_missing_claims_and_foreign_signatures_are_refused(issuer: TestIssuer) -> None:
    v = verifier(issuer)
    now = int(time.time())
    no_exp = pyjwt.encode({"iss": issuer.url, "aud": [AUDIENCE], "sub": "system:serviceaccount:shop:cart",
                           "iat": now}, issuer.keys["k1"], algorithm="RS256", headers={"kid": "k1"})
    assert refused(v, no_exp).startswith("invalid token")
    forged = issuer.token(key=rsa_key(1))  # kid k1, another key
    assert refused(v, forged) == "bad signature"
    assert refused(v, "not-a-jwt") == "malformed token"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_alg_none_and_hmac_confusion_are_refused(issuer: TestIssuer) -> None:
    v = verifier(issuer)
    claims = pyjwt.decode(issuer.token(), options={"verify_signature": False})
    none = b64(json.dumps({"alg": "none", "kid": "k1"}).encode()) + "." + b64(json.dumps(claims).encode()) + "."
    assert "algorithm" in refused(v, none)
    # HS256 keyed with the issuer's public key (what a verifier trusting the header would accept)
    public = json.dumps(issuer.published[0]).encode()
    signing = b64(json.dumps({"alg": "HS256", "kid": "k1", "typ": "JWT"}).encode()) + "." + b64(
        json.dumps(claims).encode())
    for secret in (public, issuer.published[0]["n"].encode()):
        mac = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
        assert "algorithm" in refused(v, signing + "." + b64(mac))


def test_symmetric_keys_in_the_jwks_are_never_used(tmp_path: Path) -> None:
    secret = b"shared-secret-0123456789abcdef0123456789"
    jwks = {"keys": [{"kty": "oct", "kid": "h1", "alg": "HS256", "k": b64(secret)}]}
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(jwks))
    with pytest.raises(WorkloadConfigError, match="no usable signing key"):
        KeySet(FileSource(str(path))).load()
    key = rsa_key(1)
    jwks["keys"].append(public_jwk(key, "r1"))
    path.write_text(json.dumps(jwks))
    keys = KeySet(FileSource(str(path)))
    keys.load()
    v = WorkloadVerifier("https://issuer.test", AUDIENCE, keys, UserMap.from_json(json.dumps(RULES)))
    claims = {"iss": "https://issuer.test", "aud": AUDIENCE, "sub": "system:serviceaccount:shop:cart",
              "exp": int(time.time()) + 600}
    hs = pyjwt.encode(claims, secret, algorithm="HS256", headers={"kid": "h1"})
    assert refused(v, hs) == "unknown key id"
    assert v.verify(pyjwt.encode(claims, key, algorithm="RS256", headers={"kid": "r1"})).user == "cart"
    # the key's alg wins over the header's: an RS256 key used as PS256 is refused
    assert "algorithm" in refused(v, pyjwt.encode(claims, key, algorithm="PS256", headers={"kid": "r1"}))


def test_unknown_kid_refetches_once_then_refuses_until_the_interval(issuer: TestIssuer) -> None:
    keys_clock = Clock()
    keys_clock.now = 1000.0
    v = verifier(issuer, keys_clock=keys_clock, refetch=30.0)
    assert v.verify(issuer.token()).user == "cart"
    fetched = issuer.requests[JWKS]
    new_key = rsa_key(2)
    keys_clock.now += 31  # keys fetched just now are not fetched again for an unknown kid
    assert refused(v, issuer.token(kid="k2", key=new_key)) == "unknown key id"
    assert issuer.requests[JWKS] == fetched + 1  # fetched again for the unknown kid
    for _ in range(5):  # a flood of unknown kids costs nothing more within the interval
        assert refused(v, issuer.token(kid="k-made-up", key=new_key)) == "unknown key id"
    assert issuer.requests[JWKS] == fetched + 1
    # the issuer rotates: after the interval the new key is fetched and accepted
    issuer.keys["k2"] = new_key
    issuer.published.append(public_jwk(new_key, "k2"))
    try:
        keys_clock.now += 31
        assert v.verify(issuer.token(kid="k2")).user == "cart"
        assert issuer.requests[JWKS] == fetched + 2
    finally:
        issuer.published.pop()
        del issuer.keys["k2"]


def test_cache_never_past_exp_and_bounded(issuer: TestIssuer) -> None:
    clock = Clock()
    v = verifier(issuer, clock=clock, cache_size=2)
    token = issuer.token(lifetime=60)
    exp = pyjwt.decode(token, options={"verify_signature": False})["exp"]
    assert v.verify(token).expires_at == exp
    assert v.cached(token) is not None
    clock.now = exp  # the token's exp: no longer valid, cached or not
    assert v.cached(token) is None
    assert refused(v, token) == "expired"
    others = [issuer.token(f"system:serviceaccount:shop:s{i}") for i in range(3)]
    clock.now = time.time()
    for t in others:
        v.verify(t)
    assert v.cached(others[0]) is None and v.cached(others[2]) is not None


def test_only_tokens_of_the_issuer_are_routed_here(issuer: TestIssuer) -> None:
    v = verifier(issuer)
    assert v.is_workload_token(issuer.token())
    assert not v.is_workload_token(issuer.token(iss="https://other.example"))
    etcd_jwt = pyjwt.encode({"username": "root", "revision": 1, "exp": int(time.time()) + 60},
                          "an-hmac-secret-of-32-bytes-or-more!", algorithm="HS256")
    assert not v.is_workload_token(etcd_jwt)
    assert not v.is_workload_token("AbCdEfGh.17")  # a simple token
    assert not v.is_workload_token("x" * 20000)


def test_discovery_must_name_the_same_issuer(issuer: TestIssuer) -> None:
    """A discovery document for another issuer gives no keys: every token is refused."""
    source = DiscoverySource(issuer.url + "/", fetcher())  # not the document's issuer exactly
    v = WorkloadVerifier(issuer.url + "/", AUDIENCE, KeySet(source), UserMap.from_json(json.dumps(RULES)))
    assert refused(v, issuer.token(iss=issuer.url + "/")) == "unknown key id"
    assert DISCOVERY_PATH == DISCOVERY


def test_issuer_urls_must_be_https_except_loopback() -> None:
    with pytest.raises(WorkloadConfigError, match="https"):
        DiscoverySource("http://issuer.example", fetcher())
    DiscoverySource("https://kubernetes.default.svc", fetcher())


def test_jwks_file_is_reread_when_it_changes(tmp_path: Path, issuer: TestIssuer) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(issuer.jwks()))
    rules = tmp_path / "map.json"
    rules.write_text(json.dumps(RULES))
    v = build("https://issuer.test", AUDIENCE, jwks_file=str(path), ca_file=None, user_map_file=str(rules))
    key = rsa_key(1)
    token = issuer.token(iss="https://issuer.test", kid="k7", key=key)
    assert refused(v, token) == "unknown key id"
    path.write_text(json.dumps({"keys": [public_jwk(key, "k7")]}))
    v.keys.refetch_interval = 0  # the file's own interval is a second; no waiting here
    assert v.verify(token).user == "cart"


@pytest.mark.parametrize("text", ['{"match": "a", "user": "b"}', '[{"match": "a"}]', '[{"match": "", "user": "b"}]',
                                  '[{"match": "a", "user": "b", "x": 1}]', "[{]"])
def test_bad_user_maps_are_start_up_errors(text: str) -> None:
    with pytest.raises(WorkloadConfigError):
        UserMap.from_json(text)


def test_a_changed_user_map_is_used_and_forgets_cached_results(tmp_path: Path, issuer: TestIssuer) -> None:
    """A ConfigMap update takes effect without a restart; a broken update maps nobody (fails closed)."""
    jwks, rules = tmp_path / "jwks.json", tmp_path / "map.json"
    jwks.write_text(json.dumps(issuer.jwks()))
    rules.write_text(json.dumps(RULES))
    v = build(issuer.url, AUDIENCE, jwks_file=str(jwks), ca_file=None, user_map_file=str(rules))
    assert isinstance(v.user_map, UserMapFile)
    v.user_map.poll_interval = 0
    token = issuer.token("system:serviceaccount:shop:checkout")
    assert v.verify(token).user == "shop"
    rules.write_text(json.dumps([{"match": "system:serviceaccount:shop:checkout", "user": "checkout"}]))
    assert v.cached(token) is None  # mapped by the old rules: forgotten
    assert v.verify(token).user == "checkout"
    rules.write_text("[{not json")
    assert "user map" in refused(v, token)
    rules.write_text("[]")
    assert refused(v, token).startswith("no rule maps")


def test_an_oversized_or_unreachable_issuer_gives_no_keys(issuer: TestIssuer) -> None:
    """Bounded reads: a JWKS over 256 KiB is not used; a closed port refuses, nothing hangs."""
    issuer.published.append({"kty": "RSA", "kid": "pad", "padding": "x" * (300 * 1024)})
    try:
        assert refused(verifier(issuer), issuer.token()) == "unknown key id"
    finally:
        issuer.published.pop()
    closed = f"http://127.0.0.1:{free_port()}"
    v = WorkloadVerifier(closed, AUDIENCE, KeySet(DiscoverySource(closed, fetcher())),
                         UserMap.from_json(json.dumps(RULES)))
    assert refused(v, issuer.token(iss=closed)) == "unknown key id"


def test_discovery_over_https_trusts_the_ca_file(tmp_path: Path) -> None:
    """--oidc-ca-file: the issuer's certificate is checked against it (and only then trusted)."""
    with running_issuer(tmp_path) as tls_issuer:
        assert tls_issuer.url.startswith("https://127.0.0.1:")
        rules = tmp_path / "map.json"
        rules.write_text(json.dumps(RULES))
        v = build(tls_issuer.url, AUDIENCE, jwks_file=None, ca_file=str(tmp_path / "ca.pem"),
                  user_map_file=str(rules))
        assert v.verify(tls_issuer.token()).user == "cart"
        untrusting = WorkloadVerifier(tls_issuer.url, AUDIENCE, KeySet(DiscoverySource(tls_issuer.url, fetcher())),
                                      UserMap.from_json(json.dumps(RULES)))
        assert refused(untrusting, tls_issuer.token()) == "unknown key id"  # system CAs: not trusted


def test_a_jwks_file_is_read_again_only_when_it_changed(tmp_path: Path, issuer: TestIssuer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a JWKS file changed is told as for every file raftgate follows (raftgate/file_watch.py):
    an unchanged file is looked at, not read again, however often its keys are due; a replaced one
    (a ConfigMap swap) is read at the next look, and a deleted one leaves no keys."""
    import raftgate.workload_identity as wi

    reads: list[str] = []
    read = wi.read_bounded
    monkeypatch.setattr(wi, "read_bounded", lambda path, limit: reads.append(str(path)) or read(path, limit))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(issuer.jwks()))
    mono = Clock()
    keys = KeySet(FileSource(str(path)), clock=mono)
    keys.load()
    assert len(reads) == 1 and keys.key_for("k1") is not None
    for _ in range(5):
        mono.now += FileSource.max_age + 1
        assert keys.key_for("k1") is not None
    assert len(reads) == 1
    replacement = tmp_path / "jwks.json.new"
    replacement.write_text(json.dumps({"keys": [public_jwk(rsa_key(1), "k7")]}))
    replacement.replace(path)
    mono.now += FileSource.max_age + 1
    assert keys.key_for("k7") is not None and keys.key_for("k1") is None
    assert len(reads) == 2
    path.unlink()
    mono.now += FileSource.max_age + 1
    assert keys.key_for("k7") is None
