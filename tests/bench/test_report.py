"""The bench's report, in-process: the shares of the floor and etcd, the table's columns, the chart."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from bench import report


def _row(unit: str = "/s", **values: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {"row": f"Put/s, 16 clients · off · 1 node ({unit})", "group": "put", "metric": "rate",
                           "unit": unit, "better": "higher" if unit == "/s" else "lower"}  # fmt: skip
    for kind, value in values.items():
        row[kind] = {"value": value, "rounds": [value], "errors": 0, "error": None, "gen_cpu": []}
    row.update(report.shares(row))
    return row


def test_shares_of_etcd_and_of_the_floor() -> None:
    row = _row(raftgate=1500.0, etcd=6000.0, floor=5000.0)
    assert row["ratio"] == pytest.approx(0.25)
    assert row["of_floor"] == pytest.approx(0.30)
    assert row["etcd_of_floor"] == pytest.approx(1.2)


def test_a_missing_or_zero_value_gives_no_share() -> None:
    no_floor = _row(raftgate=1500.0, etcd=6000.0)
    assert no_floor["ratio"] == pytest.approx(0.25)
    assert no_floor["of_floor"] is None and no_floor["etcd_of_floor"] is None
    failed = _row(raftgate=None, etcd=6000.0, floor=0.0)
    assert failed["ratio"] is None and failed["of_floor"] is None and failed["etcd_of_floor"] is None


def _doc(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"machine": {"nproc": 2, "cpu_model": "test", "memory": "1 GiB", "python": "3.11", "grpcio": "1"},
            "command": "python -m bench", "wall_seconds": 1.0, "targets": {"etcd": "etcd 3.5.1"},
            "bcrypt": {"4": {"limit_per_s": 2000.0, "checkpw_s": 0.001}}, "settings": {}, "rows": rows}  # fmt: skip


def test_the_table_has_the_floor_and_both_shares() -> None:
    rows = [_row(raftgate=1500.0, etcd=6000.0, floor=5000.0), _row(raftgate=100.0, etcd=200.0)]
    rows[1]["row"] = "Watch events/s delivered"
    table = report.table(_doc(rows))
    header = next(line for line in table.splitlines() if line.startswith("| row"))
    assert [c.strip() for c in header.strip("|").split("|")] == \
        ["row", "raftgate", "etcd", "floor", "raftgate÷etcd", "raftgate÷floor", "ahead"]  # fmt: skip
    put = next(line for line in table.splitlines() if line.startswith("| Put/s"))
    assert [c.strip() for c in put.strip("|").split("|")][1:7] == ["1,500", "6,000", "5,000", "0.25", "0.30", "etcd"]
    watch = next(line for line in table.splitlines() if line.startswith("| Watch"))
    assert [c.strip() for c in watch.strip("|").split("|")][3:6] == ["—", "0.50", "—"]
    assert "raftgate÷floor 0.30" in report.line(rows[0])


def test_the_chart_is_a_png_when_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [_row(raftgate=1500.0, etcd=6000.0, floor=5000.0), _row("ms", raftgate=7.8, etcd=1.8, floor=1.5)]
    path = tmp_path / "chart.png"
    assert report.chart(_doc(rows), path) is None
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_without_matplotlib_no_chart_and_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it fails
    path = tmp_path / "chart.png"
    why = report.chart(_doc([_row(raftgate=1.0, etcd=2.0)]), path)
    assert why is not None and "matplotlib is not installed" in why
    assert not path.exists()


def test_a_cell_whose_rounds_disagree_is_marked_and_the_header_says_why() -> None:
    """A row measured while the machine moved under it (one round a fifth off the other) must not
    read like the rest: its cell carries ``~`` and the table's header says what that means."""
    steady = _row(raftgate=1500.0, etcd=6000.0, floor=5000.0)
    steady["raftgate"]["rounds"] = [1450.0, 1550.0]  # 7 % apart: unmarked
    moved = _row(raftgate=1391.0, etcd=4578.0, floor=4247.0)
    moved["row"] = "Put/s, 16 clients · simple · 1 node"
    moved["etcd"]["rounds"] = [4046.0, 5109.0]  # 23 % of their median apart
    table = report.table(_doc([steady, moved]))
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")]
             for line in table.splitlines() if line.startswith("| Put/s")}
    assert cells[steady["row"]][1:4] == ["1,500", "6,000", "5,000"]
    assert cells["Put/s, 16 clients · simple · 1 node"][1:4] == ["1,391", "4,578 ~", "4,247"]
    assert any(line.startswith("~ ") and "20 %" in line for line in table.splitlines())
    assert report.spread({"rounds": [4046.0, 5109.0]}) == pytest.approx(1063 / 4577.5)
    assert report.spread({"rounds": [5.0]}) is None and report.spread({"rounds": []}) is None


@pytest.mark.parametrize(("rounds", "marked"), [
    ([100.0, 119.0], False),  # 19 % of the median apart
    ([100.0, 125.0], True),
    ([100.0, 101.0, 140.0], True),  # three rounds: max - min against the median (101)
    ([0.0, 0.0], False),  # steady at zero
    ([0.0, 0.0, 50.0], True),  # a median of zero, yet one round far off
    ([120.0, None], True),  # a round that failed: the row is not steady
    ([None, None], False),  # no value at all: nothing to mark (the cell says err)
])  # fmt: skip
def test_which_rounds_count_as_unsteady(rounds: list[float | None], marked: bool) -> None:
    row = _row(raftgate=100.0, etcd=200.0)
    row["raftgate"]["rounds"] = rounds
    assert report.cell(row, "raftgate").endswith(" ~") is marked


def test_the_ab_table_and_the_progress_line_mark_and_explain_it_too() -> None:
    row = _row(A=1000.0, B=1300.0, floor=3000.0)
    row["B"]["rounds"] = [1000.0, 1600.0]
    row.update(report.ab_shares(row, "A", "B"))
    doc = _doc([row])
    doc["ab"] = [{"name": "A", "env": {}, "build": "here"}, {"name": "B", "env": {}, "build": "there"}]
    table = report.ab_table(doc)
    assert report.SPREAD_NOTE in table.splitlines()
    line = next(x for x in table.splitlines() if x.startswith("| Put/s"))
    assert [c.strip() for c in line.strip("|").split("|")][1:3] == ["1,000", "1,300 ~"]
    assert "B 1,300 ~" in report.line(row)
