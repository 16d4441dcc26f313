"""A single-member store does not wait a whole election timeout before it leads, as etcd: it
advances all but one election tick at start, fresh or restarted, and says so in etcd's words."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import Program, free_port
from tests.support.store_args import _store_args

LINE = "started as single-node; fast-forwarding election ticks"


def test_a_single_member_store_fast_forwards_its_election_ticks_fresh_and_restarted(tmp_path: Path) -> None:
    store = Program(tmp_path / "s", _store_args(tmp_path, internal=free_port(), peer=free_port()), "raftgate store:")
    with store:  # started, and ready
        assert LINE in store.output()
        assert "forward-ticks 9" in store.output()
        store.restart()
        assert LINE in store.output(), "the restarted member did not fast-forward"
