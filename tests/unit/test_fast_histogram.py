"""FastHistogram (raftgate/fast_histogram.py) exposes what prometheus_client's Histogram would for
the same observations, so that swapping one for the other changes no series a dashboard reads."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from raftgate.fast_histogram import FastHistogram

BUCKETS = (0.001, 0.002, 0.004, 1, 16)
VALUES = (0.0, 0.001, 0.0015, 0.002, 0.5, 1.0, 3.0, 16.0, 17.0, 1e9)


def _exposition(make: type[Histogram] | type[FastHistogram]) -> str:
    registry = CollectorRegistry()
    h = make("x_seconds", "What it measures.", buckets=BUCKETS, registry=registry)
    for v in VALUES:
        h.observe(v)
    lines = generate_latest(registry).decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line)


def test_the_exposition_is_prometheus_clients() -> None:
    assert _exposition(FastHistogram) == _exposition(Histogram)


def test_the_always_on_histograms_are_fast_ones() -> None:
    from authstore import metrics as store_metrics
    from proxy import metrics as proxy_metrics

    for h in (store_metrics.WAL_FSYNC_DURATION, store_metrics.LMDB_COMMIT_DURATION,
              store_metrics.LINK_CALLS_PER_MESSAGE, store_metrics.LINK_ANSWERS_PER_MESSAGE,
              proxy_metrics.LINK_CALLS_PER_MESSAGE):
        assert isinstance(h, FastHistogram)
