"""The one config idiom: a flag wins over its environment variables, and an error names where the
bad value came from (the flag, or the variable and its flag)."""

from __future__ import annotations

import pytest

from raftgate.config_support import ConfigError, FlagParser, host_port, integer, parse_flags, prefixed


def _parser() -> FlagParser:
    p = FlagParser(prog="t")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--mode", default="a", choices=["a", "b"])
    p.add_argument("--ttl", default="300")
    return p


def test_flag_then_variable_then_default() -> None:
    env = {"T_COUNT": "7", "T_TTL": "60"}
    f = parse_flags(_parser(), ["--count", "9"], env, prefixed("T_"))
    assert (f["count"], f["ttl"], f["mode"]) == (9, "60", "a")
    assert (f.source("count"), f.source("ttl"), f.source("mode")) == ("--count", "T_TTL (--ttl)", "--mode")


@pytest.mark.parametrize("env, message", [
    ({"T_COUNT": "x"}, "T_COUNT: 'x' is not a valid value for --count"),
    ({"T_MODE": "c"}, "T_MODE: 'c' is not one of a, b (--mode)"),
])
def test_a_bad_variable_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_flags(_parser(), [], env, prefixed("T_"))


def test_a_bad_flag_is_a_config_error_not_an_exit() -> None:
    with pytest.raises(ConfigError, match="--count"):
        parse_flags(_parser(), ["--count", "x"], {}, prefixed("T_"))


def test_ranges_and_addresses_name_their_source() -> None:
    f = parse_flags(_parser(), [], {"T_TTL": "0"}, prefixed("T_"))
    with pytest.raises(ConfigError, match=r"^T_TTL \(--ttl\): must be at least 1, got 0$"):
        integer(f, "ttl", 1)
    assert host_port("--x", "[::1]:80") == ("::1", 80)
    with pytest.raises(ConfigError, match="--x: '127.0.0.1:99999' is not host:port"):
        host_port("--x", "127.0.0.1:99999")
