"""`etcdctl endpoint status --cluster` and `endpoint health --cluster`, side by side with etcd:
one row per member, each answered by that member (its own ID, term, raft index, applied index,
leader flag), reached through the client URL the member advertises."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import EtcdServer, RaftgateLocal, etcdctl, wait_for

pytestmark = pytest.mark.slow

ROOT = "root:rootpw"


def _json(endpoint: str, *args: str) -> Any:
    rc, out, err = etcdctl(endpoint, *args, "-w", "json", user=ROOT)
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


def _etcd_rows(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with EtcdServer(tmp_path / "etcd") as etcd:
        ep = etcd.endpoint
        assert etcdctl(ep, "user", "add", "root", "--new-user-password", "rootpw")[0] == 0
        assert etcdctl(ep, "auth", "enable")[0] == 0
        return _json(ep, "endpoint", "status", "--cluster"), _json(ep, "endpoint", "health", "--cluster")


def test_endpoint_status_and_health_cluster_one_row_per_member(tmp_path: Path) -> None:
    if not EtcdServer.available():
        pytest.skip("etcd is not installed")
    etcd_status, etcd_health = _etcd_rows(tmp_path)
    password = tmp_path / "root-password"
    password.write_text("rootpw\n")
    with RaftgateLocal(tmp_path / "raftgate", extra_args=["--initial-root-password-file", str(password)]) as rg:
        members = _json(rg.endpoint, "member", "list")["members"]
        assert len(members) == 3
        url_of = {m["clientURLs"][0]: m["ID"] for m in members}
        assert len(url_of) == 3, f"each member must advertise its own client URL: {members}"

        def settled() -> list[dict[str, Any]] | None:
            rows = _json(rg.endpoint, "endpoint", "status", "--cluster")
            applied = {r["Status"]["raftAppliedIndex"] for r in rows}
            return rows if len(applied) == 1 else None

        rows = wait_for(settled, 30, "every member to apply the same index")
        assert isinstance(rows, list)
        assert sorted(r["Endpoint"] for r in rows) == sorted(url_of)
        for row in rows:
            st = row["Status"]
            # the row is that member's own answer
            assert st["header"]["member_id"] == url_of[row["Endpoint"]], row
            assert st["raftTerm"] > 0 and st["raftIndex"] >= st["raftAppliedIndex"] > 0
            assert _keys(etcd_status[0]) <= _keys(row), (etcd_status[0], row)
        assert len({r["Status"]["leader"] for r in rows}) == 1
        leaders = [r for r in rows if r["Status"]["leader"] == r["Status"]["header"]["member_id"]]
        assert len(leaders) == 1, rows
        assert len({r["Status"]["header"]["cluster_id"] for r in rows}) == 1

        # the table etcd prints: one line per member, IS LEADER true exactly once
        rc, out, err = etcdctl(rg.endpoint, "endpoint", "status", "--cluster", user=ROOT)
        assert rc == 0, err
        lines = out.splitlines()
        assert len(lines) == 3 and sum(", true, " in line for line in lines) == 1, out

        health = _json(rg.endpoint, "endpoint", "health", "--cluster")
        assert sorted(h["endpoint"] for h in health) == sorted(url_of)
        assert all(h["health"] for h in health), health
        assert {k for h in etcd_health for k in h} <= {k for h in health for k in h}
