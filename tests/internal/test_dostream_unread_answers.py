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
