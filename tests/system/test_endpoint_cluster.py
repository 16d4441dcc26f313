"""`etcdctl endpoint status --cluster` and `endpoint health --cluster`, side by side with etcd:
one row per member, each answered by that member (its own ID, term, raft index, applied index,
leader flag), reached through the client URL the member advertises."""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import EtcdServer, RaftgateLocal, etcdctl, wait_for

pytestmark = pytest.mark.slow

ROOT = "root:rootpw"
#: etcdctl waits its whole command timeout (5 s by default) for a member that is down; 2 s is
#: still long for a live member's answer, and the same on both sides of each comparison
DOWN_TIMEOUT = "--command-timeout=2s"


def _json(endpoint: str, *args: str, user: str | None = None) -> Any:
    rc, out, err = etcdctl(endpoint, *args, "-w", "json", user=user)
    assert rc == 0, err
    return json.loads(out)


def _keys(row: dict[str, Any]) -> set[str]:
    """The row's field paths (Go's JSON leaves zero fields out, so compare what etcd shows)."""
    out = set()
    for k, v in row.items():
        out.add(k)
        if isinstance(v, dict):
            out |= {f"{k}.{sub}" for sub in _keys(v)}
    return out


def _check_rows(rows: list[dict[str, Any]], url_of: dict[str, int], etcd_row: dict[str, Any]) -> None:
    """One row per member, each that member's own answer, shaped as etcd's."""
    assert sorted(r["Endpoint"] for r in rows) == sorted(url_of)
    for row in rows:
        st = row["Status"]
        assert st["header"]["member_id"] == url_of[row["Endpoint"]], row
        assert st["raftTerm"] > 0 and st["raftIndex"] >= st["raftAppliedIndex"] > 0
        assert _keys(etcd_row) <= _keys(row), (etcd_row, row)
    assert len({r["Status"]["leader"] for r in rows}) == 1
    leaders = [r for r in rows if r["Status"]["leader"] == r["Status"]["header"]["member_id"]]
    assert len(leaders) == 1, rows
    assert len({r["Status"]["header"]["cluster_id"] for r in rows}) == 1


def _health_of_down(endpoints: str, down: str, user: str | None = None) -> tuple[dict[str, Any], str]:
    """`endpoint health` where the member at `down` is down: its JSON row, and its line of the
    plain output with its URL left out (the rest of `endpoints` must be healthy). Both forms are
    asked at once: each waits out the command timeout for the member that is down."""
    with ThreadPoolExecutor(2) as pool:
        as_json = pool.submit(etcdctl, endpoints, DOWN_TIMEOUT, "endpoint", "health", "-w", "json", user=user)
        plain = pool.submit(etcdctl, endpoints, DOWN_TIMEOUT, "endpoint", "health", user=user)
        rc, out, err = as_json.result()
        plain_answer = plain.result()
    assert rc != 0, out
    rows = json.loads(out)
    assert all(r["health"] for r in rows if r["endpoint"] != down), rows
    row = next(r for r in rows if r["endpoint"] == down)
    assert not row["health"], rows
    rc, out, err = plain_answer
    assert rc != 0 and "Error: unhealthy cluster" in err, err
    lines = [line for line in out.splitlines() + err.splitlines() if line.startswith(f"{down} ")]
    assert len(lines) == 1, (out, err)
    return row, lines[0].replace(down, "URL")


def test_endpoint_status_and_health_cluster_one_row_per_member(tmp_path: Path) -> None:
    if not EtcdServer.available():
        pytest.skip("etcd is not installed")
    with EtcdServer(tmp_path / "etcd") as etcd:
        etcd_status = _json(etcd.endpoint, "endpoint", "status", "--cluster")
        etcd_health = _json(etcd.endpoint, "endpoint", "health", "--cluster")
    assert len(etcd_status) == 1
    # the member's process is stopped now: what etcdctl says of it (asked while raftgate starts)
    etcd_down_asked = ThreadPoolExecutor(1)
    etcd_down_answer = etcd_down_asked.submit(_health_of_down, etcd.endpoint, etcd.endpoint)
    with etcd_down_asked, RaftgateLocal(tmp_path / "raftgate") as rg:
        members = _json(rg.endpoint, "member", "list")["members"]
        assert len(members) == 3
        url_of = {m["clientURLs"][0]: m["ID"] for m in members}
        assert len(url_of) == 3, f"each member must advertise its own client URL: {members}"

        def settled(endpoint: str, *args: str, user: str | None = None) -> list[dict[str, Any]] | None:
            rows = _json(endpoint, "endpoint", "status", *args, user=user)
            return rows if len({r["Status"]["raftAppliedIndex"] for r in rows}) == 1 else None

        rows = wait_for(lambda: settled(rg.endpoint, "--cluster"), 30, "every member to apply the same index")
        assert isinstance(rows, list)
        _check_rows(rows, url_of, etcd_status[0])

        # the table etcd prints: one line per member, IS LEADER true exactly once
        rc, out, err = etcdctl(rg.endpoint, "endpoint", "status", "--cluster")
        assert rc == 0, err
        lines = out.splitlines()
        assert len(lines) == 3 and sum(", true, " in line for line in lines) == 1, out

        health = _json(rg.endpoint, "endpoint", "health", "--cluster")
        assert sorted(h["endpoint"] for h in health) == sorted(url_of)
        assert all(h["health"] for h in health), health
        assert {k for h in etcd_health for k in h} <= {k for h in health for k in h}

        # With authentication on, as root. etcdctl 3.5.1 asks MemberList for --cluster without
        # credentials, which etcd 3.7 (and raftgate) refuse, so the member URLs are given.
        assert etcdctl(rg.endpoint, "user", "add", "root", "--new-user-password", "rootpw")[0] == 0
        assert etcdctl(rg.endpoint, "auth", "enable")[0] == 0
        endpoints = ",".join(url_of)
        rows = _json(endpoints, "endpoint", "status", user=ROOT)  # each login is a log entry: indexes move
        _check_rows(rows, url_of, etcd_status[0])
        health = _json(endpoints, "endpoint", "health", user=ROOT)
        assert sorted(h["endpoint"] for h in health) == sorted(url_of) and all(h["health"] for h in health), health

        # A member whose node is down: its row is missing and etcdctl names it, as with etcd.
        follower = next(r for r in rows if r["Status"]["leader"] != r["Status"]["header"]["member_id"])
        state = rg.local_json()
        assert state is not None
        name = next(m["name"] for m in members if m["ID"] == follower["Status"]["header"]["member_id"])
        store = next(p for p in state["processes"] if p["role"] == "store" and p["name"] == name)  # type: ignore[index]
        os.kill(int(store["pid"]), signal.SIGKILL)
        # status and health each wait out the command timeout for that member: asked at once
        with ThreadPoolExecutor(1) as pool:
            status = pool.submit(etcdctl, endpoints, DOWN_TIMEOUT, "endpoint", "status", "-w", "json", user=ROOT)
            row, line = _health_of_down(endpoints, follower["Endpoint"], user=ROOT)
            rc, out, err = status.result()
        assert rc != 0 and f"Failed to get the status of endpoint {follower['Endpoint']}" in err, err
        alive = json.loads(out)
        assert sorted(r["Endpoint"] for r in alive) == sorted(u for u in url_of if u != follower["Endpoint"])
        # and `endpoint health` says that member is unhealthy, in etcd's words for a stopped member
        etcd_down = etcd_down_answer.result()
        assert row["error"] == etcd_down[0]["error"], (row, etcd_down)
        assert line == etcd_down[1], (line, etcd_down)


#: one start in `make test`; the race is tried again by the soak variants (`make test-soak`)
@pytest.mark.parametrize("round_", [0, *(pytest.param(i, marks=pytest.mark.soak) for i in range(1, 5))])
def test_every_member_has_published_its_client_urls_once_local_is_ready(tmp_path: Path, round_: int) -> None:
    """As etcd says "ready" only once its member attributes are published, a member list asked
    right after ``raftgate local`` is ready names every member with its client URL."""
    with RaftgateLocal(tmp_path) as local:
        code, out, err = etcdctl(local.endpoint, "member", "list", "-w", "json")
        assert code == 0, err
        members = json.loads(out)["members"]
        assert len(members) == 3 and all(m.get("clientURLs") and m.get("name") for m in members), members
