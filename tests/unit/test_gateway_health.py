"""The gateway's /health decides as etcd 3.5's checkV3Health (etcdhttp/metrics.go): an alarm not
excluded, then no leader (unless serializable), then a one-key read whose "user name is empty" or
"permission denied" counts as served. Callers without a token cannot multiply the store's work:
concurrent checks with the same question share one."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from multidict import MultiDict

from protos.etcdserverpb import rpc_pb2 as pb
from proxy import gateway_health
from proxy.gateway_health import RANGE, HealthChecker, check, excluded_alarms
from raftgate.methods import Method


class AioError(grpc.aio.AioRpcError):
    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class Store:
    def __init__(self, *, alarms: tuple[int, ...] = (), leader: int = 7, range_error: str | None = None,
                 gate: asyncio.Event | None = None) -> None:
        self.alarms = alarms
        self.leader = leader
        self.range_error = range_error
        self.gate = gate
        self.calls: list[str] = []
        self.serializable: list[bool] = []

    async def node_state(self, timeout: float) -> tuple[int, list[pb.AlarmMember]]:
        self.calls.append("node")
        if self.gate is not None:
            await self.gate.wait()
        return self.leader, [pb.AlarmMember(memberID=1, alarm=a) for a in self.alarms]

    async def forward_anonymous(self, method: Method, request: bytes, timeout: float) -> bytes:
        self.calls.append(method.name)
        assert method is RANGE
        self.serializable.append(pb.RangeRequest.FromString(request).serializable)
        if self.range_error is not None:
            raise AioError(self.range_error)
        return pb.RangeResponse().SerializeToString()


def run(store: Store, excluded: frozenset[str] = frozenset(), serializable: bool = False) -> tuple[bool, str]:
    return asyncio.run(check(store, excluded, serializable))


@pytest.mark.parametrize(("store", "excluded", "serializable", "answer"), [
    (Store(), frozenset(), False, (True, "")),
    (Store(alarms=(pb.AlarmType.NOSPACE,)), frozenset(), False, (False, "ALARM NOSPACE")),
    (Store(alarms=(pb.AlarmType.NOSPACE,)), frozenset({"NOSPACE"}), False, (True, "")),
    (Store(alarms=(pb.AlarmType.CORRUPT,)), frozenset({"NOSPACE"}), False, (False, "ALARM CORRUPT")),
    (Store(leader=0), frozenset(), False, (False, "RAFT NO LEADER")),
    (Store(leader=0), frozenset(), True, (True, "")),
    (Store(range_error="etcdserver: user name is empty"), frozenset(), False, (True, "")),
    (Store(range_error="etcdserver: permission denied"), frozenset(), False, (True, "")),
    (Store(range_error="etcdserver: request timed out"), frozenset(), False,
     (False, "RANGE ERROR:etcdserver: request timed out")),
])
def test_health_is_decided_as_etcd_decides_it(store: Store, excluded: frozenset[str], serializable: bool,
                                                answer: tuple[bool, str]) -> None:
    assert run(store, excluded, serializable) == answer


def test_a_serializable_check_reads_serializably_and_needs_no_leader() -> None:
    store = Store(leader=0)
    assert run(store, serializable=True) == (True, "")
    assert store.serializable == [True]


def test_concurrent_checks_with_the_same_question_share_one() -> None:
    async def scenario() -> tuple[list[tuple[bool, str]], Store]:
        gate = asyncio.Event()
        store = Store(gate=gate)
        checker = HealthChecker(store)
        waiting = [asyncio.ensure_future(checker.check(frozenset({"NOSPACE", "BOGUS"}), False)) for _ in range(50)]
        while store.calls.count("node") < 1:
            await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(*waiting), store

    answers, store = asyncio.run(scenario())
    assert answers == [(True, "")] * 50
    assert store.calls == ["node", "Range"]  # one check for all fifty callers


def test_every_exclude_value_is_read_and_only_alarm_names_are_kept() -> None:
    """etcd reads every ``exclude``: NOSPACE after sixteen others still counts. What is kept is at
    most etcd's alarm names, so a long query costs nothing later."""
    others = [("exclude", f"X{i}") for i in range(500)]
    query = MultiDict([("exclude", "CORRUPT")] * 16 + [("exclude", "NOSPACE")] + others)
    assert excluded_alarms(query) == frozenset({"CORRUPT", "NOSPACE"})
    assert excluded_alarms(MultiDict([("exclude", ""), ("serializable", "true")])) == frozenset()


class SilentStore:
    """A node that never answers (stopped, or cut off with its connections open): every call lasts
    the whole time it is given; the deadline each call was given is recorded."""

    def __init__(self) -> None:
        self.deadlines: list[float] = []

    async def node_state(self, timeout: float) -> None:
        self.deadlines.append(asyncio.get_running_loop().time() + timeout)
        await asyncio.sleep(timeout)
        return None

    async def forward_anonymous(self, method: Method, request: bytes, timeout: float) -> bytes:
        self.deadlines.append(asyncio.get_running_loop().time() + timeout)
        await asyncio.sleep(timeout)
        raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   "Deadline Exceeded")


@pytest.mark.parametrize(("serializable", "reason"), [
    (False, "RAFT NO LEADER"), (True, "RANGE ERROR:context deadline exceeded")])
def test_a_silent_node_is_answered_within_one_check_timeout_in_etcds_words(
        monkeypatch: pytest.MonkeyPatch, serializable: bool, reason: str) -> None:
    """etcd bounds its whole check by its request timeout (its alarms and leader are its own); a
    read that ran out of time says Go's ``context deadline exceeded``. Before the fix each step
    had the whole timeout (14 s for a stopped node) and the reason was gRPC's ``Deadline Exceeded``."""
    monkeypatch.setattr(gateway_health, "CHECK_TIMEOUT", 0.2)

    async def scenario() -> tuple[tuple[bool, str], float, list[float]]:
        store = SilentStore()
        started = asyncio.get_running_loop().time()
        answer = await check(store, frozenset(), serializable)
        return answer, started, store.deadlines

    answer, started, deadlines = asyncio.run(scenario())
    assert answer == (False, reason)
    assert deadlines and all(d <= started + 0.2 + 1e-3 for d in deadlines), [d - started for d in deadlines]
