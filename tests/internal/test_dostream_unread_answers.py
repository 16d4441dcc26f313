"""A caller that sends calls on Store.DoStream and never reads the answers must not make the store
hold an unbounded number of them.

Since sidecars got their own credential, DoStream is open to a caller the store does not trust
(whoever reads an application namespace's Secrets holds a sidecar's credential). The store read
every call it was sent, ran it and kept its answer until the stream could take it: a caller that
sends calls and never reads makes the store buffer answers without end, until the node runs out
of memory. The store must stop taking calls from a stream while too many are taken and not yet
written (HTTP/2 flow control then holds the sender back).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from authstore.api.callers import Classifier
from authstore.api.interceptors import CALLER
from authstore.api.server import StoreService
from protos.storepb import store_pb2 as spb
from protos.storepb.store_pb2 import ChallengeResponse
from raftgate.errors import Err, EtcdError
from raftgate.internal_access import Caller
from raftgate.secret_proof import INTERNAL, Challenges, proof_metadata

SIDECAR_SECRET = b"sidecar-secret-for-tests-0123456789"
CALLS = 20_000
PER_BATCH = 500
#: far more than any bound the store may keep, far fewer than the calls sent
HELD_AT_MOST = 4096


class Context:
    """What do_stream asks of a grpc.aio context: a proof of a sidecar's secret, its address."""

    def __init__(self, proofs: Challenges) -> None:
        nonce = ChallengeResponse.FromString(proofs.issue(self.peer())).nonce
        self._metadata = proof_metadata(SIDECAR_SECRET, INTERNAL, proofs.member_id, nonce)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:10.0.0.7:40000"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def send_initial_metadata(self, _metadata: object) -> None:
        return None


def test_a_stream_whose_answers_are_not_read_is_not_read_without_end() -> None:
    asyncio.run(_scenario(b"a" * 1024, PER_BATCH, HELD_AT_MOST))


#: answers of 1 MiB: the calls' bound (far above 100 of them) would let the store hold GiBs
LARGE_ANSWER = b"a" * (1 << 20)


def test_a_stream_whose_large_answers_are_not_read_holds_a_bounded_number_of_bytes() -> None:
    """The outbox's bytes stop the reading: 64 MiB of answers, and the calls of the batch being read."""
    asyncio.run(_scenario(LARGE_ANSWER, 50, (64 + 2 * 50)))


async def _scenario(response: bytes, per_batch: int, held_at_most: int) -> None:
    service = StoreService.__new__(StoreService)  # only what DoStream uses
    service.classifier = Classifier(secret=b"central-secret-for-tests-0123456789", sidecar_secret=SIDECAR_SECRET)
    assert service.classifier.proofs is not None
    context = Context(service.classifier.proofs)
    assert service.classifier.classify(context) is Caller.SIDECAR
    CALLER.set(Caller.SIDECAR)  # what the store's gate finds before DoStream runs
    answered = 0

    async def answer(_data: bytes, **_how: object) -> bytes:
        nonlocal answered
        answered += 1
        return response

    async def unused(_data: bytes) -> bytes:
        raise AssertionError("not called")

    service.answer = answer  # type: ignore[method-assign]
    service.credentials = unused  # type: ignore[method-assign,assignment]
    service.resolve_token = unused  # type: ignore[method-assign,assignment]
    service.login = None  # type: ignore[assignment]

    async def batches() -> AsyncIterator[bytes]:
        for first in range(0, CALLS, per_batch):
            calls = [spb.DoCall(id=first + i, method=spb.DoCall.DO, request=b"") for i in range(per_batch)]
            yield spb.DoBatch(calls=calls).SerializeToString()
            await asyncio.sleep(0)

    stream = service.do_stream(batches(), context)  # type: ignore[arg-type]
    try:
        await anext(stream)  # the caller reads one message, then never again
        for _ in range(2 * CALLS // per_batch + 100):  # every batch had its turn to be read
            await asyncio.sleep(0)
        assert answered <= held_at_most, f"the store took {answered} calls whose answers nobody reads"
    finally:
        await stream.aclose()


def _answer_of(call_id: int) -> bytes | None:
    """Call ``call_id``'s answer: by turns none (a refusal), empty, small, several parts, one part
    (each its own bytes, so an answer given to the wrong call or twice shows)."""
    size = (None, 0, 100, 3 * (1 << 20) + 7, 1 << 20)[call_id % 5]
    if size is None:
        return None
    return (call_id.to_bytes(4, "big") * (size // 4 + 1))[:size]


def test_a_paused_stream_resumes_and_answers_every_call_once_with_its_own_answer() -> None:
    """Paused at the outbox's bound (answers, parts of large ones, empty ones and refusals mixed),
    the stream reads on once the caller reads, and every call gets its own answer exactly once."""
    asyncio.run(_resume_scenario(calls=120, per_batch=10))


async def _resume_scenario(calls: int, per_batch: int) -> None:
    service = StoreService.__new__(StoreService)  # only what DoStream uses
    service.classifier = Classifier(secret=b"central-secret-for-tests-0123456789", sidecar_secret=SIDECAR_SECRET)
    assert service.classifier.proofs is not None
    context = Context(service.classifier.proofs)
    CALLER.set(Caller.SIDECAR)
    answered = 0

    async def answer(data: bytes, **_how: object) -> bytes:
        nonlocal answered
        answered += 1
        response = _answer_of(int.from_bytes(data, "big"))
        if response is None:
            raise EtcdError(Err.TOO_MANY_REQUESTS)
        return response

    service.answer = answer  # type: ignore[method-assign]
    service.login = None  # type: ignore[assignment]

    async def batches() -> AsyncIterator[bytes]:
        for first in range(0, calls, per_batch):
            yield spb.DoBatch(calls=[spb.DoCall(id=i, method=spb.DoCall.DO, request=i.to_bytes(4, "big"))
                                     for i in range(first, first + per_batch)]).SerializeToString()
            await asyncio.sleep(0)

    got: dict[int, list[spb.DoResult]] = {}
    parts: dict[int, bytearray] = {}
    sizes: dict[int, int] = {}

    def take(message: bytes) -> None:
        for result in spb.DoResultBatch.FromString(message).results:
            if result.rest:
                parts[result.id] += result.response
            else:
                got.setdefault(result.id, []).append(result)
                parts[result.id] = bytearray(result.response)
                sizes[result.id] = result.size or len(result.response)

    stream = service.do_stream(batches(), context)  # type: ignore[arg-type]
    try:
        take(await anext(stream))  # one message read, then none for a while
        for _ in range(2 * calls // per_batch + 100):
            await asyncio.sleep(0)
        assert answered < calls  # paused at the outbox's bound
        async for message in stream:  # the caller reads again: to the end of the stream
            take(message)
    finally:
        await stream.aclose()
    assert sorted(got) == list(range(calls)) and answered == calls
    for call_id, results in got.items():
        assert len(results) == 1, f"call {call_id} answered {len(results)} times"
        expected = _answer_of(call_id)
        if expected is None:
            assert results[0].code == Err.TOO_MANY_REQUESTS.code.value[0] and not parts[call_id]
        else:
            assert results[0].code == 0 and sizes[call_id] == len(expected) and bytes(parts[call_id]) == expected
