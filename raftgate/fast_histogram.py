"""A Prometheus histogram cheap enough for every batch on the hot path.

Why not ``prometheus_client.Histogram``: its ``observe`` takes a lock and walks every bucket, about
2 µs on the machines raftgate is measured on, more than the 1 µs a metric that is always on may
cost per observation (docs/performance.md; ``python -m bench.observe_cost`` measures both). Here
an observation is one ``bisect`` and two additions, with no lock: each histogram must be observed
from one thread only (the thread that owns what it measures); a scrape, on the metrics server's
thread, reads counters that only grow, so at worst it misses the observation under way.

The exposition is the standard one (cumulative ``_bucket`` series with ``le``, ``_sum``,
``_count``), from a collector registered in the default registry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry


class FastHistogram(Collector):
    """One unlabelled histogram with fixed upper bounds (an implicit +Inf bucket after them)."""

    #: as prometheus_client's metrics name their labels (tests read it): none
    _labelnames: tuple[str, ...] = ()

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry | None = REGISTRY) -> None:
        self.name = name
        self.documentation = documentation
        self._bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        """One observation (from this histogram's one thread)."""
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts = list(self._counts)
        total = self._sum
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
            running += count
            buckets.append(("+Inf" if bound == float("inf") else _le(bound), running))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=total)


def _le(bound: float) -> str:
    """prometheus_client's spelling of a bucket bound (``floatToGoString``), so that series keep
    the labels they had as a ``Histogram``."""
    from prometheus_client.utils import floatToGoString

    return floatToGoString(bound)
