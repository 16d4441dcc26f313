"""One configuration idiom for every raftgate program (store, proxy, local).

Each program's configuration is a frozen dataclass built by a pure function from ``(argv,
environ)``: argparse declares the flags (names, types, defaults, choices), ``parse_flags`` lets
each flag fall back to environment variables (flag > first variable > next), and the program's
checks use the helpers here, so every bad value is one ``ConfigError`` whose message names the
flag, or the environment variable the value came from. The programs exit with code 2 on it.
Shared by store and proxy, so it lives in neither.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from raftgate.bounded_file import FileReadError, read_bounded

#: Where ``parse_flags`` reads a flag's variables: the flag's action -> names, strongest first.
EnvNames = Callable[[argparse.Action], Sequence[str]]

_HOST_PORT = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9.\-]+)):(?P<port>[0-9]{1,5})")
_UNSET = object()
#: ``raftgate proxy --workers`` (and ``raftgate local --proxy-workers``): processes serving one
#: client port (proxy/workers.py); more would only contend.
MAX_PROXY_WORKERS = 64


class ConfigError(ValueError):
    """A bad flag or environment value; the message says which and why (exit code 2)."""


class FlagParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting (``--help`` still
    prints and exits 0), so a program reports every bad value one way."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def prefixed(prefix: str) -> EnvNames:
    """The usual rule: ``<PREFIX><DEST>`` upper case (``RAFTGATE_PROXY_AUTH_TOKEN_TTL``)."""
    return lambda action: [prefix + action.dest.upper()]


@dataclass(frozen=True)
class Flags:
    """Parsed flag values, and for each the place it came from (for error messages)."""

    values: Mapping[str, Any]
    #: dest -> the flag (``--x``) or the environment variable it was read from; absent: default.
    origins: Mapping[str, str]
    flags: Mapping[str, str]

    def __getitem__(self, dest: str) -> Any:
        return self.values[dest]

    def given(self, dest: str) -> bool:
        return dest in self.origins

    def source(self, dest: str) -> str:
        """What to name in an error: ``--flag``, or ``VARIABLE (--flag)`` for an environment value."""
        flag = self.flags[dest]
        origin = self.origins.get(dest, flag)
        return flag if origin == flag else f"{origin} ({flag})"

    def error(self, dest: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source(dest)}: {message}")


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str],
                env_names: EnvNames) -> Flags:
    """Flags from ``argv``, else from the first of ``env_names(action)`` set in ``environ``, else
    the default. An environment value is converted and checked as argparse checks a flag (type,
    choices); a bad one is a ConfigError naming the variable."""
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    unset = argparse.Namespace(**{a.dest: _UNSET for a in options})
    ns = parser.parse_args(list(argv), unset)  # a flag not given keeps _UNSET: no default is applied
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    flags = {a.dest: a.option_strings[-1] for a in options}
    for action in options:
        dest, flag = action.dest, flags[action.dest]
        value = getattr(ns, dest)
        if value is not _UNSET:
            values[dest], origins[dest] = value, flag
            continue
        env = next((name for name in env_names(action) if name in environ), None)
        if env is None:
            default = action.default
            if isinstance(default, str) and action.type is not None:
                default = action.type(default)  # type: ignore[operator]
            values[dest] = default
            continue
        raw = environ[env]
        try:
            value = action.type(raw) if action.type else raw  # type: ignore[operator]
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            raise ConfigError(f"{env}: {raw!r} is not a valid value for {flag}") from None
        if action.choices is not None and value not in action.choices:  # argparse checks flags only
            raise ConfigError(f"{env}: {raw!r} is not one of {', '.join(map(str, action.choices))} ({flag})")
        values[dest], origins[dest] = value, env
    return Flags(values, origins, flags)


def integer(flags: Flags, dest: str, low: int | None = None, high: int | None = None) -> int:
    """The flag's value as an integer in ``low..high`` (either end open when None)."""
    value = flags[dest]
    try:
        number = int(str(value).strip())
    except ValueError:
        raise flags.error(dest, f"must be an integer, got {value!r}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        if high is None:
            raise flags.error(dest, f"must be at least {low}, got {number}")
        if low is None:
            raise flags.error(dest, f"must be at most {high}, got {number}")
        raise flags.error(dest, f"must be in {low}..{high}, got {number}")
    return number


def host_port(source: str, text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6), port 0..65535 -> (host, port)."""
    match = _HOST_PORT.fullmatch(text)
    if not match or int(match["port"]) > 65535:
        raise ConfigError(f"{source}: {text!r} is not host:port")
    if match["v6"]:
        try:
            ipaddress.IPv6Address(match["v6"])
        except ValueError:
            raise ConfigError(f"{source}: {match['v6']!r} is not an IPv6 address") from None
    return match["v6"] or match["host"], int(match["port"])


def read_file(source: str, path: str | Path, limit: int = 1024 * 1024) -> bytes:
    """A file's bytes, at most ``limit`` (a config file is small; a huge one is a mistake)."""
    try:
        return read_bounded(path, limit)
    except FileReadError as e:
        raise ConfigError(f"{source}: {e}") from None


def comma_list(text: str) -> list[str]:
    """``a, b,,c`` -> ``["a", "b", "c"]`` (etcd's URL lists)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def boolean(text: str) -> bool:
    """etcd's (Go's strconv.ParseBool) spellings of a boolean flag value (an argparse ``type``)."""
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes"):
        return True
    if value in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
