"""Per-stage timestamps of sampled requests (``RAFTGATE_TRACE_STAGES``), for finding where a
request's time goes between the client, the proxy, the store's Raft path and back.

Off by default, and then free: every stage point is one test of the module-level ``ON`` and
nothing else (no metric is even registered, so /metrics has none of these series). On
(``RAFTGATE_TRACE_STAGES=N``, N > 0, read once at start by both programs):

- the proxy samples one client request in N, stamps ``proxy_in`` when its handler starts and
  marks the request's store call (``DoCall.trace``); only a marked call carries the mark across
  the link, and the store answers it with its own stage offsets (``DoResult.stages``);
- the store (with the variable set too) stamps the marked call's ``store_in``, ``proposed``,
  ``wal_synced``, ``committed``, ``applied`` and ``answered`` (when its answer is encoded onto the
  link), and observes each as seconds since ``store_in`` on its own /metrics;
- the proxy observes each stage as seconds since ``proxy_in``, ``proxy_out`` last. The store's
  stages are placed on the proxy's clock by assuming the link took as long each way: the store's
  ``store_in`` is put halfway through the round trip's time not spent in the store. No clock is
  shared, so the two programs may run on different machines.

Each histogram's ``_sum`` divided by its ``_count`` is the mean time from the start to that stage;
the difference of two such means is the mean time between the stages. A read has no
``proposed``/``wal_synced``/``committed`` stage. Memory is bounded: a trace is a few integers
held only while its request is in flight, and the histograms have fixed buckets and labels.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from contextvars import ContextVar

from prometheus_client import Histogram

#: Whether stage tracing is on in this process; tested once at each stage point.
ON = False
#: The proxy samples one client request in this many.
EVERY = 0

ENV = "RAFTGATE_TRACE_STAGES"
#: The store's stages, in order; ``DoResult.stages`` holds their offsets from ``store_in`` in
#: nanoseconds (index i: STORE_STAGES[i + 1]; 0 for a stage the request did not pass).
STORE_STAGES = ("store_in", "proposed", "wal_synced", "committed", "applied", "answered")
#: The proxy's view: every stage in order, relative to ``proxy_in``.
PROXY_STAGES = ("proxy_sent", *STORE_STAGES, "proxy_out")
PROPOSED, WAL_SYNCED, COMMITTED, APPLIED, ANSWERED = 1, 2, 3, 4, 5

_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
PROXY_HISTOGRAM: Histogram | None = None
STORE_HISTOGRAM: Histogram | None = None
_counter = 0
#: The proxy's trace of the request its current task serves (None: not sampled).
CURRENT: ContextVar[ProxyTrace | None] = ContextVar("raftgate_stage_trace", default=None)

now = time.perf_counter_ns


def configure(environ: Mapping[str, str] | None = None, *, program: str) -> None:
    """Reads ``RAFTGATE_TRACE_STAGES`` (an integer: sample one request in N; 0 or unset: off) and
    registers this program's histogram (``program``: "proxy" or "store") when it is on."""
    global ON, EVERY, PROXY_HISTOGRAM, STORE_HISTOGRAM
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    try:
        every = int(text or "0")
    except ValueError:
        raise ValueError(f"{ENV}: {text!r} is not an integer (sample one request in N; 0: off)") from None
    if every < 0:
        raise ValueError(f"{ENV}: must be 0 (off) or more")
    EVERY = every
    ON = every > 0
    if not ON:
        return
    if program == "proxy" and PROXY_HISTOGRAM is None:
        PROXY_HISTOGRAM = Histogram(
            "raftgate_proxy_request_stage_seconds",
            f"Sampled requests ({ENV}): seconds from the proxy receiving the request to each stage "
            "(store stages placed on the proxy's clock, the link assumed symmetric).",
            ["stage"], buckets=_BUCKETS)  # fmt: skip
    elif program == "store" and STORE_HISTOGRAM is None:
        STORE_HISTOGRAM = Histogram(
            "raftgate_store_request_stage_seconds",
            f"Sampled requests ({ENV}): seconds from the store receiving the call to each stage.",
            ["stage"], buckets=_BUCKETS)  # fmt: skip


def sampled() -> bool:
    """Whether this request is one in EVERY (call only when ON)."""
    global _counter
    _counter += 1
    if _counter >= EVERY:
        _counter = 0
        return True
    return False


class ProxyTrace:
    """One sampled request on the proxy: its start, when its store call went out, and the store's
    offsets once the answer came back."""

    __slots__ = ("start", "sent", "received", "store")

    def __init__(self) -> None:
        self.start = now()
        self.sent = 0
        self.received = 0
        self.store: list[int] = []

    def finish(self) -> None:
        """Observes every stage reached (called once, when the proxy answers the client)."""
        hist = PROXY_HISTOGRAM
        if hist is None:
            return
        end = now()
        if self.sent:
            hist.labels("proxy_sent").observe((self.sent - self.start) / 1e9)
        if self.sent and self.received and self.store:
            answered = self.store[-1]
            store_in = self.sent + max(0, self.received - self.sent - answered) // 2
            hist.labels("store_in").observe((store_in - self.start) / 1e9)
            for name, offset in zip(STORE_STAGES[1:], self.store, strict=False):
                if offset:
                    # never after the answer was here (a store slower than the round trip the
                    # proxy saw: its send was stamped late, or the clocks' rates differ)
                    at = min(store_in + offset, self.received)
                    hist.labels(name).observe((at - self.start) / 1e9)
        hist.labels("proxy_out").observe((end - self.start) / 1e9)


#: The proxy's trace of the request its current task serves (None: not sampled).
CURRENT: ContextVar[ProxyTrace | None] = ContextVar("raftgate_stage_trace", default=None)


def store_trace() -> list[int]:
    """A new store-side trace: [store_in, proposed, wal_synced, committed, applied, answered]."""
    return [now(), 0, 0, 0, 0, 0]


def store_finish(trace: list[int]) -> list[int]:
    """Stamps ``answered``, observes the store's stages, and returns the offsets for the proxy."""
    trace[ANSWERED] = now()
    start = trace[0]
    offsets = [t - start if t else 0 for t in trace[1:]]
    hist = STORE_HISTOGRAM
    if hist is not None:
        hist.labels("store_in").observe(0.0)
        for name, offset in zip(STORE_STAGES[1:], offsets, strict=True):
            if offset:
                hist.labels(name).observe(offset / 1e9)
    return offsets
