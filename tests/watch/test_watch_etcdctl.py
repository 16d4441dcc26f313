"""etcdctl watch against real etcd 3.5.1 and raftgate, side by side: the same output, stderr and
exit code for history (--rev, --prev-kv), prefix and from-key watches and a denied watch."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.processes import (
    ETCDCTL,
    EtcdServer,
    RaftgateLocal,
    etcdctl,
    new_server,
    side_by_side,
    skip_unless_available,
)

pytestmark = pytest.mark.slow

Server = EtcdServer | RaftgateLocal


def ctl(srv: Server, *args: str, user: str | None = None) -> str:
    rc, out, err = etcdctl(srv.endpoint, *args, user=user)
    assert rc == 0, (args, out, err)
    return out


def watch_for(srv: Server, *args: str, user: str | None = None, seconds: float = 2.0,
              during: list[tuple[str, ...]] | None = None) -> tuple[int | None, str, str]:
    """Runs `etcdctl watch ...`, does `during` writes, stops it after `seconds` if it is still running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    env["ETCDCTL_API"] = "3"
    cmd = [ETCDCTL, f"--endpoints={srv.endpoint}", "--dial-timeout=5s"]
    if user:
        cmd.append(f"--user={user}")
    proc = subprocess.Popen([*cmd, "watch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    time.sleep(0.7)  # the watch must be created before the writes (no way to observe that from outside)
    for step in during or []:
        ctl(srv, *step, user="root:rootpw")
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err
    return proc.returncode, out, err


def scenario(srv: Server) -> dict[str, object]:
    ctl(srv, "user", "add", "root:rootpw")
    ctl(srv, "user", "add", "u:pw")
    ctl(srv, "role", "add", "r")
    ctl(srv, "role", "grant-permission", "r", "readwrite", "foo")
    ctl(srv, "role", "grant-permission", "r", "readwrite", "p/", "--prefix")
    ctl(srv, "user", "grant-role", "u", "r")
    ctl(srv, "auth", "enable")
    root = "root:rootpw"
    ctl(srv, "put", "p/a", "1", user=root)
    ctl(srv, "put", "p/a", "2", user=root)
    ctl(srv, "del", "p/a", user=root)
    ctl(srv, "put", "p/b", "3", user=root)
    got: dict[str, object] = {}
    rev_out = ctl(srv, "get", "p/b", "-w", "json", user=root)
    got["history"] = watch_for(srv, "p/", "--prefix", "--rev=2", "--prev-kv", user="u:pw")[1:]
    got["live"] = watch_for(srv, "p/", "--prefix", user="u:pw", during=[("put", "p/c", "4"), ("del", "p/b")])[1:]
    got["from_key_root"] = watch_for(srv, "p/b", "--from-key", user=root, during=[("put", "p/z", "5")])[1:]
    got["denied_prefix"] = watch_for(srv, "q/", "--prefix", user="u:pw")
    got["denied_from_key"] = watch_for(srv, "foo", "--from-key", user="u:pw")
    got["anonymous"] = watch_for(srv, "foo")
    assert rev_out
    return got


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, object]]]:
    kinds = ("etcd", "raftgate")
    for kind in kinds:
        skip_unless_available(kind)
    dirs = {kind: tmp_path_factory.mktemp(f"ctlwatch-{kind}") for kind in kinds}

    def run(kind: str) -> dict[str, object]:
        srv = new_server(kind, dirs[kind], **({"extra_args": ["--nodes", "1"]} if kind == "raftgate" else {}))
        srv.start()
        try:
            return scenario(srv)
        finally:
            srv.stop()

    yield side_by_side(kinds, run)


@pytest.mark.parametrize("case", ["history", "live", "from_key_root", "denied_prefix", "denied_from_key"])
def test_etcdctl_watch_same_as_etcd(results: dict[str, dict[str, object]], case: str) -> None:
    assert results["raftgate"][case] == results["etcd"][case]


def test_anonymous_watch_says_user_name_is_empty(results: dict[str, dict[str, object]]) -> None:
    """etcd 3.5.1 reported every denial as `permission denied`; 3.5.8+/3.6/3.7.1 (PR #14322), which
    raftgate follows, say `user name is empty`. Exit code and message shape are etcdctl's."""
    reason = "rpc error: code = {} desc = etcdserver: {}"
    shape = "watch was canceled ({})\nError: watch is canceled by the server\n"
    assert results["etcd"]["anonymous"] == (5, "", shape.format(reason.format("PermissionDenied", "permission denied")))
    assert results["raftgate"]["anonymous"] == (5, "", shape.format(reason.format("InvalidArgument",
                                                                                  "user name is empty")))


def test_denied_watch_reports_the_reason(results: dict[str, dict[str, object]]) -> None:
    rc, out, err = results["raftgate"]["denied_prefix"]  # type: ignore[misc]
    assert "permission denied" in err, (rc, out, err)
