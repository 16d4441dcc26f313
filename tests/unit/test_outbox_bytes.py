"""A DoStream's answers travel as protobuf's own encoding of DoResultBatch, whatever mixture of
answers, refusals, large parts, users and stage traces a message holds (the outbox may frame them
by hand, but the proxy must read exactly what it read before)."""

from __future__ import annotations

import random

from authstore.api.outbox import Outbox
from protos.internal import ANSWER_PART_BYTES
from protos.storepb import store_pb2 as spb
from raftgate import stages


def _expected(results: list[spb.DoResult]) -> bytes:
    return spb.DoResultBatch(results=results).SerializeToString()


def test_whole_answers_and_refusals_are_protobuf_s_bytes() -> None:
    rnd = random.Random(4)
    for _ in range(200):
        box = Outbox()
        want: list[spb.DoResult] = []
        for _ in range(rnd.randrange(1, 20)):
            call_id = rnd.choice((0, 1, 127, 128, 1 << 40))
            if rnd.random() < 0.2:
                refusal = spb.DoResult(id=call_id, code=rnd.randrange(1, 16), message="m" * rnd.randrange(3),
                                       user=rnd.choice(("", "alice")))
                box.refuse(refusal)
                want.append(refusal)
            else:
                response = bytes(rnd.randrange(256) for _ in range(rnd.choice((0, 1, 40, 300))))
                user = rnd.choice(("", "bob", "é"))
                box.answer(call_id, response, user=user)
                want.append(spb.DoResult(id=call_id, response=response, user=user))
        got = box.take()
        assert got == _expected(want)
        assert spb.DoResultBatch.FromString(got) == spb.DoResultBatch(results=want)
        assert box.bytes == 0 and not box


def test_traced_and_large_answers_keep_their_parts_and_stages() -> None:
    box = Outbox()
    trace = stages.store_trace()
    big = b"b" * (ANSWER_PART_BYTES + 10)
    box.answer(5, b"small", user="u", trace=trace)
    box.answer(6, big, user="v")
    first = spb.DoResultBatch.FromString(box.take()).results
    assert [(r.id, r.response[:5], r.size, r.rest, r.user) for r in first][:2] == [
        (5, b"small", 0, False, "u"), (6, b"bbbbb", len(big), False, "v")]
    assert len(first[0].stages) == len(trace) - 1 and not first[1].stages  # offsets: the traced call's only
    received = b"".join(r.response for r in first if r.id == 6)
    while box:
        for r in spb.DoResultBatch.FromString(box.take()).results:
            assert r.id == 6 and r.rest
            received += r.response
    assert received == big
