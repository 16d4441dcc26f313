"""The bench's command line, in-process: which rows ``--only`` selects."""

from __future__ import annotations

import re

from bench import cli


def _selected(only: str) -> list[str]:
    phases = cli.plan(False, [1], ["off", "simple"], [4])
    pattern = re.compile(only, re.I)
    return [f"{s.label} · {mode}" for p in phases for mode, specs in (("off", p.off), (p.token, p.on))
            for s in specs if cli.wanted(pattern, p, s, mode)]  # fmt: skip


def test_only_matches_the_row_names_the_table_shows() -> None:
    """`--only 'Put/s'` (bench/README.md's example) selects the Put rows: the table names them
    "Put/s, 16 clients · off · 1 node", the measurement is labelled "Put, 16 clients"."""
    assert "Put, 16 clients · off" in _selected("Put/s, 16 clients · off")
    assert "Range linearizable, 16 clients · simple" in _selected("Range/s linearizable")
    assert "Put, 1 client · off" in _selected("Put, 1 client: p50 · off")
    assert _selected("Put/s, 64") == ["Put, 64 clients · off", "Put, 64 clients · simple"]
    assert "Put, 16 clients · off" in _selected("Put, 16 clients · off")  # the label still works


def test_watch_writers_other_than_the_default_are_named_in_the_row() -> None:
    """`--watch-writers 16` measures the fan-out's capacity, not a Put's latency under it: its row
    must not share a name (and so a line in a comparison) with the default row."""
    for writers, name in ((cli.WATCH_WRITERS, "Watch events/s delivered, 100 watchers · simple · 1 node"),
                          (16, "Watch events/s delivered, 100 watchers, 16 writers · simple · 1 node")):  # fmt: skip
        phases = cli.plan(False, [1], ["simple"], [4])
        cli.size_watch_rows(phases, 100, writers)
        rows = [(p, s) for p in phases for s in p.on if s.group == "watch"]
        assert [cli.row_name(p, s, "simple", "rate") for p, s in rows] == [name]
        assert rows[0][1].params == {"watchers": 100, "writers": writers}


def test_a_full_run_takes_three_rounds_per_row_so_one_slow_round_cannot_move_its_median() -> None:
    """With two rounds a row's "median" was their mean: one round taken while the VM ran slow moved
    it by up to a quarter. A full run takes three; `--quick` (CI's smoke run) one; `--rounds` wins."""
    assert cli.settings_from(cli._parser().parse_args([]), cores=2).rounds == 3
    assert cli.settings_from(cli._parser().parse_args(["--quick"]), cores=2).rounds == 1
    assert cli.settings_from(cli._parser().parse_args(["--rounds", "5"]), cores=2).rounds == 5
