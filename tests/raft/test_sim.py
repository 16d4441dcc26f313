"""The deterministic cluster simulation (see sim.py): Raft's safety properties after every step
and a linearizable client history, across seeds, 3- and 5-node clusters and Raft options."""

from __future__ import annotations

from .sim import SimConfig, Simulation


def sim_config(nodes: int, seed: int, steps: int) -> SimConfig:
    """Varies the Raft options and the fsync behaviour with the seed, so all combinations run."""
    variant = seed % 4
    return SimConfig(nodes=nodes, steps=steps, pre_vote=variant in (0, 2), check_quorum=variant in (0, 1),
                     immediate_sync=(0.3, 0.6, 0.9)[seed % 3])


def test_sim(sim_case: tuple[int, int, int]) -> None:
    nodes, seed, steps = sim_case
    sim = Simulation(seed, sim_config(nodes, seed, steps))
    sim.run()  # raises SafetyViolation (with the seed and the last events) on the first bad step
    sim.check_history()
    # not a liveness proof, but a simulation in which nothing happens proves nothing either
    assert sim.stats["elections"] > 0
    assert sim.completed_ops() > steps // 1000, (sim.completed_ops(), sim.stats)
