"""An etcdctl step runner that asserts exit code, stdout and stderr byte for byte.

Expectations are etcd 3.7.1's behaviour as seen through etcdctl 3.5.1. Where real etcd 3.5.1 (the
binary we can run side by side) answers differently, the step carries a `v35` override; every other
expectation was validated against the real etcd, so raftgate passing it means raftgate == etcd.

stderr comparison ignores etcdctl's own structured client log lines (`{"level":...}` JSON, which carry
timestamps and pointer addresses); every other stderr line (the `Error: ...` lines) must match exactly.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from dataclasses import dataclass, field

from tests.support.processes import etcdctl

ROOT = "root:rootpw"
TU = "test-user:pass"

_LOG_LINE = re.compile(r'^\{"level":')

USER_EMPTY = "Error: etcdserver: user name is empty\n"
DENIED = "Error: etcdserver: permission denied\n"
AUTH_FAILED = "Error: etcdserver: authentication failed, invalid user ID or password\n"
INVALID_MGMT = "Error: etcdserver: invalid auth management\n"


def strip_client_logs(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(keepends=True) if not _LOG_LINE.match(line))


def client_log_errors(stderr: str) -> list[str]:
    """The `error` fields of etcdctl's client log lines (the raw gRPC status the client saw)."""
    import json

    out = []
    for line in stderr.splitlines():
        if _LOG_LINE.match(line):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line).get("error", ""))
    return out


@dataclass
class Ctl:
    """Runs etcdctl steps against one server and checks them; `backend` selects 3.5.1 overrides."""

    endpoint: str
    backend: str
    transcript: list[tuple[tuple[str, ...], str | None, int, str, str]] = field(default_factory=list)

    def raw(self, *args: str, user: str | None = None, stdin: str | None = None) -> tuple[int, str, str]:
        rc, out, err = etcdctl(self.endpoint, *args, user=user, stdin=stdin)
        err = strip_client_logs(err)
        self.transcript.append((args, user, rc, out, err))
        return rc, out, err

    def __call__(
        self,
        *args: str,
        user: str | None = None,
        stdin: str | None = None,
        rc: int = 0,
        out: str | None = "",
        err: str | None = "",
        out_re: str | None = None,
        v35: dict[str, object] | None = None,
    ) -> tuple[int, str, str]:
        """Run one step and assert it. `out`/`err` None = don't check; `{ep}` is replaced by the endpoint."""
        exp: dict[str, object] = {"rc": rc, "out": out, "err": err, "out_re": out_re}
        if self.backend == "etcd" and v35:
            exp.update(v35)
        got_rc, got_out, got_err = self.raw(*args, user=user, stdin=stdin)
        where = f"etcdctl {' '.join(args)} (user={user}) on {self.backend}"
        want_out = exp["out"]
        want_err = exp["err"]
        if isinstance(want_out, str):
            want_out = want_out.replace("{ep}", self.endpoint)
        if isinstance(want_err, str):
            want_err = want_err.replace("{ep}", self.endpoint)
        problems = []
        if got_rc != exp["rc"]:
            problems.append(f"exit code {got_rc} != {exp['rc']}")
        if want_out is not None and got_out != want_out:
            problems.append(f"stdout {got_out!r} != {want_out!r}")
        if exp["out_re"] is not None and not re.fullmatch(str(exp["out_re"]), got_out, re.S):
            problems.append(f"stdout {got_out!r} !~ {exp['out_re']!r}")
        if want_err is not None and got_err != want_err:
            problems.append(f"stderr {got_err!r} != {want_err!r}")
        assert not problems, f"{where}: " + "; ".join(problems)
        return got_rc, got_out, got_err

    def popen(self, *args: str, user: str | None = None) -> subprocess.Popen[str]:
        """Start etcdctl with pipes (for interactive `txn -i`); the caller must wait/kill it."""
        import os

        from tests.support.processes import ETCDCTL

        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
        env["ETCDCTL_API"] = "3"
        cmd = [ETCDCTL, f"--endpoints={self.endpoint}", "--dial-timeout=5s"]
        if user:
            cmd.append(f"--user={user}")
        return subprocess.Popen(
            cmd + list(args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )


def setup_auth(ctl: Ctl) -> None:
    """The upstream fixture: root/rootpw (role root via etcdctl's auto-create), test-user/pass with
    test-role = READWRITE on the single key `foo`, auth enabled."""
    ctl("user", "add", ROOT, out="User root created\n")
    ctl("user", "add", TU, out="User test-user created\n")
    ctl("role", "add", "test-role", out="Role test-role created\n")
    ctl("role", "grant-permission", "test-role", "readwrite", "foo", out="Role test-role updated\n")
    ctl("user", "grant-role", "test-user", "test-role", out="Role test-role is granted to user test-user\n")
    ctl("auth", "enable", out="Authentication Enabled\n")
