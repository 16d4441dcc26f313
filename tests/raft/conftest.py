"""Options for the Raft simulation: ``--sim-seed N`` replays one seed, ``--sim-steps N`` (or the
environment variable RAFTGATE_SIM_STEPS) sets the total number of simulated steps.

The options exist when pytest is pointed at tests/raft (``pytest tests/raft -k sim --sim-seed 7``);
from a whole-suite run use the environment variables RAFTGATE_SIM_SEED / RAFTGATE_SIM_STEPS.
"""

from __future__ import annotations

import os

import pytest

#: total simulated steps of a default run (CI), split into seeds of STEPS_PER_SEED steps
DEFAULT_TOTAL_STEPS = 2_000_000
STEPS_PER_SEED = 50_000


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
    if "sim_case" not in metafunc.fixturenames:
        return
    seed = _option(metafunc.config, "sim_seed", "RAFTGATE_SIM_SEED")
    total = _option(metafunc.config, "sim_steps", "RAFTGATE_SIM_STEPS") or DEFAULT_TOTAL_STEPS
    if seed is not None:
        steps = min(total, STEPS_PER_SEED) if total != DEFAULT_TOTAL_STEPS else STEPS_PER_SEED
        cases = [(3, seed, steps), (5, seed, steps)]
    else:
        n = max(2, total // STEPS_PER_SEED)
        cases = [(3 if i % 2 == 0 else 5, i // 2, STEPS_PER_SEED) for i in range(n)]
    metafunc.parametrize("sim_case", cases, ids=[f"n{n}-seed{s}" for n, s, _ in cases])
