"""Options for the Raft simulations: ``--sim-seed N`` replays one seed, ``--sim-steps N`` (or the
environment variable RAFTGATE_SIM_STEPS) sets the total number of simulated steps of each
simulation (sim.py: the core alone; node_sim.py: the real RaftNode driver).

The options exist when pytest is pointed at tests/raft (``pytest tests/raft -k sim --sim-seed 7``);
from a whole-suite run use the environment variables RAFTGATE_SIM_SEED / RAFTGATE_SIM_STEPS.
"""

from __future__ import annotations

import os

import pytest

#: total simulated steps of a default run (CI), split into seeds of STEPS_PER_SEED steps
DEFAULT_TOTAL_STEPS = 2_000_000
STEPS_PER_SEED = 50_000
#: the same for the simulation of real RaftNodes (node_sim.py; a step costs ~5x more there)
DEFAULT_NODE_SIM_STEPS = 1_000_000


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("raft simulation")
    group.addoption("--sim-seed", type=int, default=None, help="run the Raft simulation for this seed only")
    group.addoption("--sim-steps", type=int, default=None,
                    help=f"total simulated steps across seeds (default {DEFAULT_TOTAL_STEPS}, env RAFTGATE_SIM_STEPS)")


def _option(config: pytest.Config, name: str, env: str) -> int | None:
    value = config.getoption(name, default=None)
    if value is None and os.environ.get(env):
        value = int(os.environ[env])
    return value


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for fixture, default in (("sim_case", DEFAULT_TOTAL_STEPS), ("node_sim_case", DEFAULT_NODE_SIM_STEPS)):
        if fixture in metafunc.fixturenames:
            cases = _cases(metafunc.config, default)
            metafunc.parametrize(fixture, cases, ids=[f"n{n}-seed{s}" for n, s, _ in cases])


def _cases(config: pytest.Config, default: int) -> list[tuple[int, int, int]]:
    """(nodes, seed, steps) per test case."""
    seed = _option(config, "sim_seed", "RAFTGATE_SIM_SEED")
    total = _option(config, "sim_steps", "RAFTGATE_SIM_STEPS") or default
    if seed is not None:
        steps = min(total, STEPS_PER_SEED) if total != default else STEPS_PER_SEED
        return [(3, seed, steps), (5, seed, steps)]
    n = max(2, total // STEPS_PER_SEED)
    return [(3 if i % 2 == 0 else 5, i // 2, STEPS_PER_SEED) for i in range(n)]
