"""The proxy spreads reads over the store's voters (issue 13, "reads on every node"): which node
a Range goes to, how the choice follows the nodes' health, and a read that fails on one node is
retried on another (with etcd's answers unchanged)."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from proxy import store_client
from proxy.config import load
from proxy.store_client import StoreClient, pick_reader
from proxy.store_pipe import NotSent, rpc_error
from raftgate.errors import Err


class _Ep:
    """What pick_reader looks at of a node."""

    def __init__(self, name: str, *, serves: bool = True, outstanding: int = 0, suspect_until: float = 0.0) -> None:
        self.target = name
        self.serves_reads = serves
        self.outstanding = outstanding
        self.suspect_until = suspect_until


def _picks(eps: list[_Ep], leader: _Ep, n: int, now: float = 100.0) -> Counter[str]:
    return Counter(pick_reader(eps, leader, now, turn).target for turn in range(n))  # type: ignore[arg-type]


def test_idle_nodes_take_reads_in_turn() -> None:
    a, b, c = _Ep("a"), _Ep("b"), _Ep("c")
    assert _picks([a, b, c], a, 9) == {"a": 3, "b": 3, "c": 3}


def test_the_least_busy_node_is_chosen() -> None:
    a, b, c = _Ep("a", outstanding=5), _Ep("b", outstanding=1), _Ep("c", outstanding=2)
    assert _picks([a, b, c], a, 4) == {"b": 4}


def test_suspect_and_unfit_nodes_get_no_reads() -> None:
    leader = _Ep("a")
    cut_off = _Ep("b", suspect_until=101.0)  # a read on it failed a moment ago
    learner = _Ep("c", serves=False)  # or no leader known, or not answering discovery
    assert _picks([leader, cut_off, learner], leader, 4) == {"a": 4}
    # once the suspicion has run out, it serves again
    assert _picks([leader, cut_off, learner], leader, 4, now=102.0) == {"a": 2, "b": 2}


def test_with_no_fit_node_the_leader_guess_serves() -> None:
    a, b = _Ep("a", serves=False), _Ep("b", suspect_until=1e18)
    assert _picks([a, b], b, 3) == {"b": 3}


def test_store_reads_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(("ETCD_", "RAFTGATE_"))]:
        monkeypatch.delenv(name)
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123")
    base = ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}"]
    assert load(base, env={}).spread_reads is False
    assert load([*base, "--store-reads=spread"], env={}).spread_reads is True
    assert load(base, env={"RAFTGATE_PROXY_STORE_READS": "spread"}).spread_reads is True


def _refusal(err: Err) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(err.code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=err.message)


def test_a_read_that_fails_on_one_node_is_retried_on_another() -> None:
    """A follower cut off from its leader answers `leader changed` (its ReadIndex spanned a leader
    change) or is unreachable: the read is answered by another node, and the failed one gets no
    spread reads for a while. A refusal (permission denied) is passed on as it is, never retried."""

    async def run() -> None:
        client = StoreClient(["a:1", "b:2", "c:3"], secret="s", spread_reads=True)
        try:
            for ep in client._endpoints:
                ep.serves_reads = True

            async def nothing_new() -> None:  # discovery finds these nodes as they were
                return None

            client._rediscover = nothing_new  # type: ignore[method-assign]
            tried: list[str] = []

            async def invoke(ep: store_client._Endpoint, _timeout: float | None) -> bytes:
                tried.append(ep.target)
                if ep.target == "b:2":
                    raise _refusal(Err.LEADER_CHANGED)
                if ep.target == "c:3":
                    raise rpc_error(grpc.StatusCode.UNAVAILABLE, "gone", NotSent)
                return ep.target.encode()

            answers = [await client._call(invoke, 5.0, read=True, spread=True) for _ in range(6)]
            assert set(answers) == {b"a:1"}
            assert tried.count("b:2") == 1 and tried.count("c:3") == 1  # then suspect: not asked again
            by_target = {ep.target: ep for ep in client._endpoints}
            assert by_target["b:2"].suspect_until > time.monotonic()
            assert all(ep.outstanding == 0 for ep in client._endpoints)

            async def denied(ep: store_client._Endpoint, _timeout: float | None) -> bytes:
                raise _refusal(Err.PERMISSION_DENIED)

            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client._call(denied, 5.0, read=True, spread=True)
            assert info.value.details() == Err.PERMISSION_DENIED.message
        finally:
            await client.close()

    asyncio.run(run())


def test_a_write_that_only_meets_not_leader_gets_etcds_no_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """`not leader` and `stopped` are the store's internal proof that a request never entered the
    log (the proxy retries them elsewhere); when the retry window ends on one, the client gets
    etcd's `no leader`, never the internal answer (seen in a kill -9 loop: `not leader` reached a
    client after the leader it knew of lost leadership for the whole window)."""
    monkeypatch.setattr(store_client, "RETRY_WINDOW", 0.3)

    async def run() -> None:
        client = StoreClient(["a:1"], secret="s")
        try:
            async def nothing_new() -> None:
                return None

            client._rediscover = nothing_new  # type: ignore[method-assign]

            async def not_leader(ep: store_client._Endpoint, _timeout: float | None) -> bytes:
                raise _refusal(Err.NOT_LEADER)

            for read in (False, True):
                with pytest.raises((grpc.aio.AioRpcError, store_client.EtcdError)) as info:
                    await client._call(not_leader, 5.0, read=read)
                err = info.value
                seen = (err.code(), err.details()) if isinstance(err, grpc.aio.AioRpcError) else err.err.value
                assert seen == Err.NO_LEADER.value
        finally:
            await client.close()

    asyncio.run(run())
