"""Token extraction from gRPC metadata (etcd's AuthInfoFromCtx rules) and token fingerprints."""

from __future__ import annotations

from proxy.tokens.extract import extract_token
from raftgate.token_verifier import fingerprint


def test_token_key_first_value() -> None:
    assert extract_token((("token", "a"), ("token", "b"))) == "a"


def test_authorization_fallback_and_token_precedence() -> None:
    assert extract_token((("authorization", "x"),)) == "x"
    assert extract_token((("authorization", "x"), ("token", "t"))) == "t"


def test_bearer_prefix_stripped_once() -> None:
    assert extract_token((("token", "Bearer abc"),)) == "abc"
    assert extract_token((("authorization", "Bearer abc"),)) == "abc"
    assert extract_token((("token", "Bearer Bearer abc"),)) == "Bearer abc"
    assert extract_token((("token", "bearer abc"),)) == "bearer abc"  # etcd: case-sensitive prefix


def test_absent_and_empty() -> None:
    assert extract_token(None) is None
    assert extract_token(()) is None
    assert extract_token((("user-agent", "grpc"),)) is None
    assert extract_token((("token", ""),)) == ""


def test_bytes_values() -> None:
    assert extract_token((("token", b"abc"),)) == "abc"


def test_fingerprint_is_short_and_not_the_token() -> None:
    fp = fingerprint("secret-token")
    assert len(fp) == 12 and "secret" not in fp
    assert fp == fingerprint("secret-token") != fingerprint("secret-token2")
