"""The audit log end to end: `raftgate local --audit-log` with etcdctl as the client. Records name
the user, method, key and etcd's message for a denial, never a password or a value; SIGHUP after
logrotate's rename reopens the file; with --audit-fail-closed, a log that cannot be reopened
refuses requests with `Unavailable` `raftgate: audit log unavailable`."""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import RaftgateLocal, skip_unless_available, wait_for

pytestmark = pytest.mark.slow

ROOT_PW, ALICE_PW, VALUE = "r00t-Pa55word", "al1ce-Pa55word", "v4lue-n0t-for-logs"


def records(path: Path) -> list[dict[str, Any]]:
    """The complete lines so far (the writer may be in the middle of one)."""
    try:
        return [json.loads(line) for line in path.read_text().split("\n")[:-1]]
    except FileNotFoundError:
        return []


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_audit_log_through_raftgate_local(tmp_path: Path) -> None:
    skip_unless_available("raftgate")
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "audit.log"
    with RaftgateLocal(tmp_path / "rg", extra_args=["--nodes", "1", "--audit-log", str(path), "--audit-level",
                                                    "denials", "--audit-fail-closed"]) as rg:
        assert rg.proc is not None
        root = f"root:{ROOT_PW}"
        for args, user in ((["user", "add", f"root:{ROOT_PW}"], None), (["user", "grant-role", "root", "root"], None),
                           (["auth", "enable"], None), (["user", "add", f"alice:{ALICE_PW}"], root),
                           (["put", "/k", VALUE], root)):
            rc, out, err = rg.ctl(*args, user=user)
            assert rc == 0, (args, out, err)
        rc, _, err = rg.ctl("get", "/secret", user=f"alice:{ALICE_PW}")
        assert rc != 0 and "etcdserver: permission denied" in err
        assert rg.ctl("get", "/k", user=f"alice:{ALICE_PW}x")[0] != 0  # a wrong password

        def denial() -> list[dict[str, Any]]:
            return [r for r in records(path) if r["method"] == "/etcdserverpb.KV/Range" and r["user"] == "alice"]

        (refused,) = wait_for(denial, 60, "alice's denied Range in the audit log")  # type: ignore[misc]
        assert (refused["result"], refused["key"], refused["peer"].startswith("ipv4:127.0.0.1:")) == (
            "etcdserver: permission denied", b64("/secret"), True)
        assert refused["token_fp"] and refused["auth_revision"] > 0
        failed = ("alice", "etcdserver: authentication failed, invalid user ID or password")

        def logins() -> list[tuple[str, str]]:
            return [(r["user"], r["result"]) for r in records(path) if r["method"] == "/etcdserverpb.Auth/Authenticate"]

        # The writer thread appends records as it gets to them: the wrong password's came after the
        # denied Range (make test once read the file between the two).
        wait_for(lambda: failed in logins(), 60, "alice's failed login in the audit log")
        seen = records(path)
        assert ("alice", "ok") in logins()
        assert any(r["method"] == "/etcdserverpb.Auth/UserAdd" and r["target_user"] == "alice" and r["user"] == "root"
                   for r in seen)
        assert not any(r["method"] == "/etcdserverpb.KV/Put" for r in seen)  # an ok Put is not a denial
        text = path.read_text()
        for secret in (ROOT_PW, ALICE_PW, VALUE, b64(VALUE)):
            assert secret not in text
        assert (logs / "audit.log.node1").exists()  # the member proxy's own file

        # logrotate: rename, then SIGHUP; the next records go to a new file at the same path
        path.rename(logs / "audit.log.1")
        os.kill(rg.proc.pid, signal.SIGHUP)

        def reopened() -> bool:
            rg.ctl("get", "/secret", user=f"alice:{ALICE_PW}")
            return bool(denial())

        wait_for(reopened, 60, "a record in the reopened file")
        assert rg.proc.poll() is None

        # the directory goes away: the reopen fails, and with --audit-fail-closed requests are refused
        for name in os.listdir(logs):
            (logs / name).unlink()
        logs.rmdir()
        os.kill(rg.proc.pid, signal.SIGHUP)

        def refused_unaudited() -> bool:
            _, _, err = rg.ctl("put", "/k", "again", user=root)
            return "code = Unavailable desc = raftgate: audit log unavailable" in err

        wait_for(refused_unaudited, 60, "a request refused because the audit log cannot be written")
