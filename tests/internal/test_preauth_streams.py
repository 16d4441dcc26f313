"""What a caller without credentials can make a secret-mode store hold by keeping streams open.

The pre-authentication bound (tests/internal/test_preauth_bounds.py) is per message; a call that
stays open is another way to hold memory. The internal port's ``Health/Watch`` was open to every
caller and never ends: each stream is a gRPC call and a coroutine in the store (about 18 KB), so
anyone who can reach the port opens tens of thousands and the store's memory grows without bound
(a few thousand per second over one connection). Probes need ``Health/Check`` only; what stays
open to an unauthenticated caller must end at once (Check, Challenge).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from tests.support.processes import Program, free_port
from tests.support.store_args import _store_args

pytestmark = pytest.mark.slow

#: streams opened by the attack, over a few connections
STREAMS = 3000
CONNECTIONS = 3
#: seconds a call that ends is given to deliver its status once its first answer arrived (one that
#: stays open, Health/Watch before its fix, never ends: it waits this out once, all calls at once)
ENDS_WITHIN = 10.0
OPEN_METHODS = ("/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/Check", "/raftgate.storepb.Store/Challenge")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Program, str]]:
    tmp_path = tmp_path_factory.mktemp("preauth-streams")
    internal = free_port()
    program = Program(tmp_path / "s", _store_args(tmp_path, internal=internal, peer=free_port()), "raftgate store:")
    program.start(timeout=60)
    try:
        yield program, f"127.0.0.1:{internal}"
    finally:
        program.stop()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


async def _hold(target: str, method: str, pid: int) -> tuple[int, int]:
    """Opens STREAMS calls of ``method`` without credentials and reads each one's first answer;
    (how many are still open then, the store's RSS growth meanwhile: for the message only, the
    calls in flight at once make it noisy)."""
    channels = [grpc.aio.insecure_channel(target) for _ in range(CONNECTIONS)]
    before = _rss(pid)
    try:
        calls = [channels[n % CONNECTIONS].unary_stream(method)(b"", timeout=120) for n in range(STREAMS)]

        async def first(call: grpc.aio.UnaryStreamCall) -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call.read()
            # A call that ends sends its status after its answer: wait for it (bounded) instead of
            # looking at once (a loaded machine had one status still on its way: 1 of 3000 "open").
            with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError):
                await asyncio.wait_for(call.code(), ENDS_WITHIN)

        await asyncio.gather(*(first(c) for c in calls))
        growth = _rss(pid) - before
        still_open = sum(1 for c in calls if not c.done())
        for call in calls:
            call.cancel()
        return still_open, growth
    finally:
        for channel in channels:
            await channel.close()


@pytest.mark.parametrize("method", OPEN_METHODS)
def test_an_unauthenticated_caller_holds_no_stream_open(store: tuple[Program, str], method: str) -> None:
    program, target = store
    assert program.proc is not None
    still_open, growth = asyncio.run(_hold(target, method, program.proc.pid))
    assert still_open == 0, (f"{method}: {still_open} of {STREAMS} unauthenticated streams still open (the "
                             f"store's RSS grew by {growth >> 20} MiB)")
