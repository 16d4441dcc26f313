"""``python -m bench.observe_cost``: what one histogram observation costs, in µs.

The rule (docs/performance.md): a metric that is always on costs under 1 µs per observation, or it
goes behind RAFTGATE_TRACE_STAGES. This measures prometheus_client's ``Histogram.observe`` and
raftgate's ``FastHistogram.observe`` (raftgate/fast_histogram.py), each net of an empty call, and
the stage check a request pays with tracing off (one module attribute test). A micro-benchmark:
run it on an idle machine; it asserts nothing.
"""

from __future__ import annotations

import argparse
import timeit

from prometheus_client import CollectorRegistry, Histogram

from raftgate import stages
from raftgate.fast_histogram import FastHistogram

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def measure(number: int = 200_000, repeat: int = 5) -> dict[str, float]:
    """Best of ``repeat`` runs of ``number`` calls, µs per call, net of an empty call."""
    registry = CollectorRegistry()
    prom = Histogram("x_prometheus", "x", buckets=BUCKETS, registry=registry)
    fast = FastHistogram("x_fast", "x", buckets=BUCKETS, registry=registry)

    def best(stmt: object) -> float:
        return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6  # type: ignore[arg-type]

    def empty() -> None:
        pass

    def off() -> None:
        if stages.ON:
            pass

    base = best(empty)
    return {
        "prometheus_client Histogram.observe": best(lambda: prom.observe(7)) - base,
        "FastHistogram.observe": best(lambda: fast.observe(7)) - base,
        "stage check with tracing off": best(off) - base,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.observe_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--number", type=int, default=200_000)
    a = p.parse_args(argv)
    for name, us in measure(a.number).items():
        print(f"{name:40s} {us:6.3f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
