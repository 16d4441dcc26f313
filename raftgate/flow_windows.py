"""A fixed HTTP/2 receive window for gRPC ends whose unread data must stay small.

With BDP probing (gRPC's default) C-core grows every stream's receive window to what it measures
of the link's bandwidth-delay product: many MiB on a fast link, more under load, and a sender can
drive it up on purpose. What such a window lets in is held before any handler runs, so it bounds
what an unauthenticated caller makes a store hold and what a stalled watch stream fills in a
proxy. Fixed at 1 MiB per stream, a transfer still runs at 1 MiB per round trip (1 GB/s at 1 ms).
"""

from __future__ import annotations

#: gRPC channel or server options: no BDP probing, 1 MiB windows
FIXED_RECEIVE_WINDOW: list[tuple[str, int]] = [
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1 << 20),
]
