"""``raftgate bootstrap-auth``: create the root user and role and enable authentication, once.

Run by the Helm chart's post-install/post-upgrade hook Job against the proxy's etcd v3 API (any
etcd-compatible endpoint works). It waits until an endpoint answers (bounded by ``--timeout``),
then, idempotently:

1. ``AuthStatus`` says disabled (a cluster started without ``raftgate store
   --initial-root-password-file``, which the chart always gives): ``UserAdd root`` (an existing
   root user is kept), ``RoleAdd root`` (an existing role is kept), ``UserGrantRole root root``,
   ``AuthEnable``;
2. then, always: root must authenticate with the file's password and no other user may hold role
   root. Otherwise the cluster is not trusted (someone may have made themselves root while auth
   was off): a clear message and exit 1, never a warning and success.

A transient failure (endpoint unavailable, deadline exceeded, leader change) starts the sequence
again on the next endpoint until the deadline; any other refusal is checked against AuthStatus
(another bootstrap may have finished meanwhile) and otherwise reported. The password is read from
a file and never printed, logged or put in an error message.

Exit codes: 0 authentication is enabled and root is the file's, 1 it could not be enabled in time
or root is not trusted, 2 bad flags or file.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.password_file import PasswordFileError, read_password_file

PROG = "raftgate bootstrap-auth"
ROOT = "root"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: Codes after which the whole sequence is simply tried again (it is idempotent).
TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED})
#: Answers that mean "already done" for the step that got them (etcd's exact messages).
ALREADY = {
    "UserAdd": "etcdserver: user name already exists",
    "RoleAdd": "etcdserver: role name already exists",
}

class BootstrapError(Exception):
    """A refusal that retrying will not change; the message never contains the password."""


class _AlreadyEnabled(Exception):
    """Another bootstrap enabled authentication while this one was running."""


@dataclass(frozen=True)
class Options:
    endpoints: tuple[str, ...]
    password: str
    timeout: float
    rpc_timeout: float


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise BootstrapError(message)


def _parser() -> _Parser:
    p = _Parser(
        prog=PROG,
        description="Create the root user and role and enable etcd v3 authentication, once.",
        epilog="The Helm chart runs it as a hook Job: docs/kubernetes.md.",
    )
    p.add_argument(
        "--endpoints", required=True, help="comma list of host:port (or http://host:port) etcd API endpoints"
    )
    p.add_argument("--root-password-file", required=True, help="file holding the root password (one line)")
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (default 300)")
    p.add_argument("--rpc-timeout", type=float, default=10.0, help="deadline of each request in seconds (default 10)")
    return p


def _endpoint(raw: str) -> str:
    value = raw.strip()
    for scheme in ("http://", "grpc://"):
        value = value.removeprefix(scheme)
    if value.startswith("https://"):
        raise BootstrapError(f"--endpoints: {raw!r}: TLS client endpoints are not supported; use the plaintext port")
    if not value or ":" not in value or value.rsplit(":", 1)[1] == "":
        raise BootstrapError(f"--endpoints: {raw!r} is not host:port")
    return value


def _read_password(path: str) -> str:
    try:
        return read_password_file(path)
    except PasswordFileError as exc:
        raise BootstrapError(f"--root-password-file: {exc}") from None


def parse(argv: Sequence[str]) -> Options:
    a = _parser().parse_args(list(argv))
    endpoints = tuple(_endpoint(e) for e in a.endpoints.split(",") if e.strip())
    if not endpoints:
        raise BootstrapError("--endpoints: no endpoint given")
    if not a.timeout > 0 or not a.rpc_timeout > 0:
        raise BootstrapError("--timeout and --rpc-timeout must be positive")
    return Options(endpoints, _read_password(a.root_password_file), a.timeout, a.rpc_timeout)


def _say(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


class _Session:
    """One endpoint's Auth stub, with each call bounded by the request deadline and the overall one."""

    def __init__(self, channel: grpc.Channel, opts: Options, deadline: float) -> None:
        self.auth = rpc_pb2_grpc.AuthStub(channel)
        self.opts = opts
        self.deadline = deadline

    def _timeout(self) -> float:
        return max(0.05, min(self.opts.rpc_timeout, self.deadline - time.monotonic()))

    def enabled(self) -> bool:
        return bool(self.auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=self._timeout()).enabled)

    def step(self, name: str, request: object) -> bool:
        """Run one administration call; True if it did something, False if it was already done."""
        try:
            getattr(self.auth, name)(request, timeout=self._timeout())
        except grpc.RpcError as exc:
            if exc.code() in TRANSIENT:
                raise
            if ALREADY.get(name) == exc.details():
                return False
            if self.enabled():  # someone else finished the bootstrap meanwhile
                raise _AlreadyEnabled from None
            raise BootstrapError(f"{name} was refused: {exc.details()} ({exc.code().name})") from None
        return True

    def bootstrap(self) -> None:
        if self.enabled():
            _say("authentication is already enabled; checking root")
        else:
            try:
                self._enable()
            except _AlreadyEnabled:
                _say("authentication was enabled meanwhile; checking root")
        self._verify()

    def _enable(self) -> None:
        """The old way, for a cluster started without --initial-root-password-file: while auth is
        off anyone may have created root first, so _verify decides afterwards whether to trust it."""
        created = self.step("UserAdd", rpc_pb2.AuthUserAddRequest(name=ROOT, password=self.opts.password))
        _say("created user root" if created else "user root already exists")
        created = self.step("RoleAdd", rpc_pb2.AuthRoleAddRequest(name=ROOT))
        _say("created role root" if created else "role root already exists")
        self.step("UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=ROOT, role=ROOT))
        self.step("AuthEnable", rpc_pb2.AuthEnableRequest())
        _say("authentication enabled")

    def _verify(self) -> None:
        """Root must authenticate with the file's password, and nobody else may hold role root:
        otherwise someone else may own this cluster (a root created while auth was off, or an
        admin added meanwhile), and the Job fails instead of adopting it."""
        try:
            token = self.auth.Authenticate(
                rpc_pb2.AuthenticateRequest(name=ROOT, password=self.opts.password), timeout=self._timeout()
            ).token
        except grpc.RpcError as exc:
            if exc.code() in TRANSIENT:
                raise
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise BootstrapError(
                    "root does not authenticate with the password in the file: root was created by someone "
                    "else or its password was changed; not trusting this cluster"
                ) from None
            raise BootstrapError(f"Authenticate as root was refused: {exc.details()} ({exc.code().name})") from None
        md = (("token", token),)
        users = self.auth.UserList(rpc_pb2.AuthUserListRequest(), metadata=md, timeout=self._timeout()).users
        holders = [
            name for name in users
            if name != ROOT and ROOT in self.auth.UserGet(rpc_pb2.AuthUserGetRequest(name=name), metadata=md,
                                                          timeout=self._timeout()).roles
        ]  # fmt: skip
        if holders:
            who = f"user {holders[0]} holds" if len(holders) == 1 else f"users {', '.join(holders)} hold"
            raise BootstrapError(f"{who} role root: only root may; not trusting this cluster")
        _say("root authenticates with the password file and no other user holds role root")


def run(opts: Options) -> int:
    deadline = time.monotonic() + opts.timeout
    delay = 0.1
    attempt = 0
    last = "no answer yet"
    while True:
        endpoint = opts.endpoints[attempt % len(opts.endpoints)]
        attempt += 1
        with grpc.insecure_channel(endpoint) as channel:
            try:
                _Session(channel, opts, deadline).bootstrap()
                return EXIT_OK
            except grpc.RpcError as exc:
                if exc.code() not in TRANSIENT:
                    print(f"{PROG}: error: {endpoint}: {exc.details()} ({exc.code().name})", file=sys.stderr)
                    return EXIT_FAILURE
                last = f"{endpoint}: {exc.code().name}"
            except BootstrapError as exc:
                print(f"{PROG}: error: {endpoint}: {exc}", file=sys.stderr)
                return EXIT_FAILURE
        left = deadline - time.monotonic()
        if left <= 0:
            print(f"{PROG}: error: gave up after {opts.timeout:g}s; last: {last}", file=sys.stderr)
            return EXIT_FAILURE
        if attempt % len(opts.endpoints) == 0:
            # Every endpoint was tried: wait (a polling interval, growing to 2 s) before the next round.
            time.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv)
    except BootstrapError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    return run(opts)
