"""``python -m bench.apply_cost``: the apply stage's CPU per Put by batch size, and its fit into a
per-Put and a per-batch share; benchmarks never assert timings in tests, only that it measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import apply_cost


def test_it_applies_every_put_of_every_batch_and_fits_per_put_and_per_batch_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "apply.json"
    assert apply_cost.main(["--batches", "1,4", "--puts", "16", "--rounds", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [(r["batch"], r["puts"]) for r in doc["rows"]] == [(1, 16), (4, 16)]
    assert all(r["cpu_us"] > 0 and r["wall_us"] > 0 for r in doc["rows"])
    assert "per_put_us" in doc and "per_batch_us" in doc
    assert "µs per batch (CPU)" in capsys.readouterr().out


def test_a_follower_s_way_parses_each_entry_and_a_refused_put_is_an_error_not_a_number() -> None:
    """``--parse`` applies entries the leader did not hand over parsed; a Put refused by apply
    (here: by authorization, the grant does not cover the key) stops the measurement."""
    assert apply_cost.measure(2, 4, parsed=False)["puts"] == 4
    with pytest.raises(RuntimeError, match="refused: etcdserver: permission denied"):
        apply_cost.measure(2, 4, key_prefix="/elsewhere/")


@pytest.mark.parametrize("argv", [["--batches", "x"], ["--batches", "0"], ["--puts", "0"], ["--rounds", "0"]])
def test_bad_arguments_are_refused_with_exit_code_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert apply_cost.main(argv) == 2
    assert "bench.apply_cost:" in capsys.readouterr().err
