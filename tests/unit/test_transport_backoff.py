"""The peer reconnect back-off is bounded well inside one election timeout (1 s by default), so a
restarted node hears the leader soon after it listens again: ours, and gRPC's own connection
back-off under it (1 s at first, growing by 1.6 up to 120 s unless told otherwise)."""

from __future__ import annotations

import itertools

from authstore.node import transport

DEFAULT_ELECTION_TIMEOUT = 1.0


def test_the_reconnect_schedule_starts_small_and_stays_bounded() -> None:
    delays = list(itertools.islice(transport.reconnect_delays(), 100))
    assert delays[0] <= 0.05
    assert delays == sorted(delays)  # it grows, then stays
    assert max(delays) == delays[-1] == transport.RECONNECT_MAX
    assert transport.RECONNECT_MAX <= DEFAULT_ELECTION_TIMEOUT / 4


def test_grpcs_own_reconnect_backoff_is_bounded_the_same() -> None:
    options = dict(transport.channel_options())
    bound_ms = transport.RECONNECT_MAX * 1000
    for name in ("grpc.initial_reconnect_backoff_ms", "grpc.min_reconnect_backoff_ms",
                 "grpc.max_reconnect_backoff_ms"):
        assert name in options, name
        assert 0 < options[name] <= bound_ms, (name, options[name])
