"""The simulation of real RaftNodes (node_sim.py): the driver that ships, on a hostile network with
crashes that lose unsynced writes, checked after every step; and proof that it would catch a
driver that answers before its writes are durable."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterator

import pytest

from authstore.node.driver import RaftNode

from .fakes import FakeWAL
from .node_sim import NodeSimConfig, NodeSimulation
from .sim import SafetyViolation


@pytest.fixture(autouse=True)
def _quiet_driver() -> Iterator[None]:
    """The driver logs each leader change and, in the broken-driver test, its fail-stop."""
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def node_sim_config(nodes: int, seed: int, steps: int) -> NodeSimConfig:
    """Varies with the seed: the state machine (odd seeds: the store's Applier on LMDB; even: a
    dict that loses what was applied since its last sync on a crash), how often the workers (WAL
    writes, apply) finish at once, the fault rate, and whether a lone entry is written on the loop
    (a fast disk: seeds 1, 2 and 3 of every 5)."""
    return NodeSimConfig(nodes=nodes, steps=steps, immediate=(0.0, 0.5, 0.9)[seed % 3],
                         fault_rate=0.03 if seed % 4 == 3 else 0.004, store=seed % 2 == 1,
                         fast_log=seed % 5 in (1, 2, 3))


def run(seed: int, cfg: NodeSimConfig) -> NodeSimulation:
    sim = NodeSimulation(seed, cfg)
    try:
        sim.run()  # raises SafetyViolation (with the seed and the last events) on the first bad step
        sim.check_history()
    finally:
        sim.close()
    return sim


def test_node_sim(node_sim_case: tuple[int, int, int]) -> None:
    nodes, seed, steps = node_sim_case
    sim = run(seed, node_sim_config(nodes, seed, steps))
    # not a liveness proof, but a simulation in which nothing happens proves nothing either
    assert sim.stats["elections"] > 0 and sim.stats["crashes"] > 0, sim.stats
    assert sim.completed_ops() > steps // 1000, (sim.completed_ops(), sim.stats)


def test_node_sim_replays_a_seed_exactly() -> None:
    def outcome() -> list[tuple[object, ...]]:
        sim = run(5, NodeSimConfig(nodes=3, steps=5000, fault_rate=0.02))
        return [(o.kind, o.key, o.arg, o.status, o.output, o.invoke, o.complete) for o in sim.history.ops]

    assert outcome() == outcome()


def test_node_sim_covers_snapshots_and_membership() -> None:
    """Compaction, snapshot send and install, and member changes happen in a default-sized seed."""
    sim = run(2, NodeSimConfig(nodes=5, steps=50_000))
    assert sim.net.stats["snapshots"] > 0 and sim.stats["conf_changes"] > 0 and sim.stats["transfers"] > 0, (
        sim.stats, sim.net.stats)


@pytest.mark.parametrize("seed", [0, 1])  # the dict state machine, the store's Applier
def test_node_sim_answers_writes_once_decided(seed: int) -> None:
    """The early-answer path that ships: a write's caller is answered once its batch is decided
    (StateMachine.on_decided), before the apply batch returns; crashes in that window lose the
    unsynced state, and the history is still linearizable."""
    sim = run(seed, node_sim_config(3, seed, 20_000))
    assert sim.stats["early_answers"] > 0, sim.stats


@pytest.fixture
def follower_answers_before_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken driver: every node sends its Ready's messages before the WAL write (only a
    leader may, for its MsgApp), so a follower grants votes and acknowledges entries that a crash
    can take back."""
    monkeypatch.setattr(RaftNode, "_split_sends", lambda self, messages: (messages, []))


@pytest.mark.parametrize("fast_log", [False, True])  # written on the log worker; a lone entry on the loop
def test_node_sim_catches_an_answer_before_fsync_at_once(follower_answers_before_fsync: None, fast_log: bool) -> None:
    """Raft's persistence rule, checked as each message leaves, fails within a few hundred steps."""
    with pytest.raises(SafetyViolation, match="before that vote is durable|while its WAL holds"):
        run(0, NodeSimConfig(nodes=3, steps=2000, fast_log=fast_log))


def test_node_sim_catches_an_answer_before_fsync_end_to_end(follower_answers_before_fsync: None) -> None:
    """Without that check, the end-to-end properties (election safety, leader completeness,
    state-machine safety, linearizability) find what the broken order leads to: a crash takes
    back an acknowledged entry or a vote. Seeds are searched in order within a bound (about one
    seed in eight finds it); with today's core the fourth (seed 3) fails after 16,340 steps."""
    for seed in range(48):
        cfg = NodeSimConfig(nodes=3, steps=20_000, immediate=0.0, fault_rate=0.03, check_persistence=False)
        try:
            run(seed, cfg)
        except SafetyViolation as exc:
            assert "fail-stop" not in str(exc)
            return
    pytest.fail("no seed in 48 x 20,000 steps found the broken persistence order")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_node_sim_with_a_log_whose_sync_speed_changes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real WAL tells after every sync whether it was fast, so a node's writes move between
    the event loop and the log thread from one Ready to the next: each Ready here goes either
    way at random (seeded), with crashes, and Raft's properties hold as with one way only."""
    flips = random.Random(seed)
    monkeypatch.setattr(FakeWAL, "syncs_fast", property(lambda self: flips.random() < 0.5, lambda self, value: None),
                        raising=False)
    sim = run(seed, dataclasses.replace(node_sim_config(3, seed, 20_000), fast_log=True))
    assert sim.stats["crashes"] > 0 and sim.completed_ops() > 20, sim.stats
