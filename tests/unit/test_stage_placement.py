"""A sampled request's store stages, placed on the proxy's clock, never come after the proxy had
the answer (found by tests/system/test_trace_stages.py failing on a loaded machine: `answered`
was placed after `proxy_out`, because the proxy stamped `proxy_sent` once its write had finished,
by which time the store could already be working on the call)."""

from __future__ import annotations

from unittest import mock

from prometheus_client import CollectorRegistry, Histogram

from raftgate import stages


def _placed(trace: stages.ProxyTrace) -> dict[str, float]:
    registry = CollectorRegistry()
    hist = Histogram("t_stage_seconds", "t", ["stage"], registry=registry, buckets=(1.0,))
    with mock.patch.object(stages, "PROXY_HISTOGRAM", hist), mock.patch.object(stages, "now", return_value=10_000):
        trace.finish()
    return {s.labels["stage"]: s.value for m in registry.collect() for s in m.samples if s.name.endswith("_sum")}


def test_store_stages_are_placed_before_the_answer_arrived_even_when_sent_was_stamped_late() -> None:
    trace = stages.ProxyTrace()
    trace.start = 0
    trace.sent = 4_000          # stamped late: the store had the call before this
    trace.received = 6_000      # a 2 µs round trip as the proxy saw it ...
    trace.store = [100, 200, 300, 2_500, 3_000]  # ... while the store took 3 µs
    placed = _placed(trace)
    received = trace.received / 1e9
    for stage in stages.STORE_STAGES:
        assert placed[stage] <= received, (stage, placed)
    order = [placed[s] for s in stages.PROXY_STAGES if s in placed]
    assert order == sorted(order), placed


def test_a_normal_round_trip_is_placed_halfway() -> None:
    trace = stages.ProxyTrace()
    trace.start = 0
    trace.sent = 1_000
    trace.received = 5_000
    trace.store = [0, 0, 0, 500, 2_000]  # a read: 2 µs in the store of a 4 µs round trip
    placed = _placed(trace)
    assert placed["store_in"] == 2_000 / 1e9  # 1 µs each way
    assert placed["answered"] == 4_000 / 1e9
