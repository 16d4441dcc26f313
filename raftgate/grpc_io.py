"""Where gRPC core does the two programs' socket I/O: on the thread that polls for completions.

gRPC-Python's asyncio server and channels take completions from one poller thread and hand them
to the event loop. With gRPC core's EventEngine endpoints (grpcio's default), the reads and writes
themselves run on a pool of ``event_engine`` threads, which then wake the poller thread: measured
at 7.5 context switches per unary call on those threads alone. With core's older iomgr endpoints
the poller thread polls the sockets itself and does the I/O inline (0.04 switches per call). Both
programs pay that for every client call, every store-stream message and every Raft message: in
one rotation on the idle 2-core machine the iomgr endpoints took 16-20 % off the store's and the
proxy's CPU per Put and gave 12-20 % more Puts per second at 16 clients (docs/performance.md,
round 10). Everything above the endpoint (HTTP/2, TLS, the channel's settings) is the same code.

It is chosen through ``GRPC_EXPERIMENTS``, gRPC core's own switch, set before gRPC starts (so
``raftgate store`` and ``raftgate proxy`` apply it first thing; ``raftgate local`` passes it on to
its children with the rest of the environment). An operator's own ``GRPC_EXPERIMENTS`` is kept:
an experiment it names, enabled or disabled, is left as it says (``event_engine_client,
event_engine_listener`` restores gRPC's default); the others are added. A gRPC that no longer knows
these names would log "Unknown experiment" at start-up: tests/unit/test_grpc_io.py fails then.
"""

from __future__ import annotations

from collections.abc import MutableMapping

ENV = "GRPC_EXPERIMENTS"

#: experiment -> on (True) or off: gRPC core's connecting and listening sockets as iomgr endpoints
EXPERIMENTS: dict[str, bool] = {
    "event_engine_client": False,
    "event_engine_listener": False,
}


def merged(value: str) -> str:
    """``GRPC_EXPERIMENTS`` as ``value`` (an operator's setting, possibly empty) with ours added:
    an experiment ``value`` names already stays as it is there."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    named = {item.removeprefix("-") for item in items}
    items += [name if on else f"-{name}" for name, on in EXPERIMENTS.items() if name not in named]
    return ",".join(items)


def apply(environ: MutableMapping[str, str]) -> None:
    """Sets ``GRPC_EXPERIMENTS`` in ``environ``; before gRPC is imported, or it has no effect."""
    environ[ENV] = merged(environ.get(ENV, ""))
