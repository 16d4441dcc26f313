"""Smoke test of ``python -m bench.capacity``: one short round of Put and of watch fan-out against a
single node and one proxy gives a row each, with a rate and the CPU per request (per event
delivered, for watch) of the store and the proxy; benchmarks never assert timings in tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_capacity_measures_put_and_watch_per_request_and_per_event(tmp_path: Path) -> None:
    out = tmp_path / "capacity.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.capacity", "--nodes", "1", "--proxies", "1", "--ops", "put,watch",
         "--conc", "4", "--rounds", "1", "--seconds", "1", "--procs", "2", "--json", str(out)],
        cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=120, start_new_session=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {row["op"]: row for row in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == ["put", "watch"]
    for row in rows.values():
        assert row["errors"] == 0, row["error"]
        assert row["rate"] > 0 and row["leader_us"] > 0 and row["proxies_us"] > 0
    assert "CPU per event" in proc.stdout and "CPU per request" in proc.stdout
