"""DoStream's answers on the way back: framed into DoResultBatch messages of bounded size.

The store's side of the link's framing (protos/internal.py has its limits): whole answers travel
together, large ones in parts, taken in turn, so no message passes the gRPC limit and no large
answer holds the others back by more than one message.
"""

from __future__ import annotations

import collections

from authstore import metrics
from protos import wire
from protos.internal import ANSWER_PART_BYTES, STREAM_BATCH_BYTES
from protos.storepb import store_pb2 as spb
from raftgate import stages
from raftgate.byte_queue import ByteBudget

#: Answer bytes one DoStream's outbox holds before the store reads no more calls from that stream
#: (the server's STREAM_CALLS_HELD bounds the calls): a caller that never reads cannot make the
#: store buffer answers without end.
STREAM_BYTES_HELD = 64 << 20


class Outbox(ByteBudget):
    """The answers of one DoStream waiting to be written, taken one bounded message at a time.

    Answers up to ANSWER_PART_BYTES (and refusals) go first, as many as fit STREAM_BATCH_BYTES;
    larger answers fill what room is left, one part at a time and in turn, so that a large answer
    never travels as one message (over the gRPC limit it would end the stream for every call) and
    holds the other calls back by one message at most.

    Whole answers wait encoded (``_result_bytes``: protobuf's bytes for the DoResult, by hand), so
    a batch is their framing joined, with no message objects built and copied per answer.

    The budget (``bytes``: answers and refusal messages not yet taken) pauses the stream's reader
    at ``pause_at`` and lets it go on as soon as a take brings it below.
    """

    def __init__(self, pause_at: int = STREAM_BYTES_HELD) -> None:
        super().__init__(pause_at, pause_at - 1)
        #: (call id, the encoded DoResult, the bytes it counts: response + message)
        self.whole: collections.deque[tuple[int, bytes, int]] = collections.deque()
        #: Large answers still being sent: the call id, the answer, how much of it is sent, and
        #: the verified user (a sidecar's call; sent with the first part).
        self.large: collections.deque[tuple[int, bytes, int, str]] = collections.deque()
        #: call id -> the stage trace of a sampled call (raftgate/stages.py), until its answer is taken
        self.traces: dict[int, list[int]] = {}

    def __bool__(self) -> bool:
        return bool(self.whole or self.large)

    @property
    def count(self) -> int:
        """Calls whose answer is not (wholly) taken yet."""
        return len(self.whole) + len(self.large)

    def answer(self, call_id: int, response: bytes, user: str = "", trace: list[int] | None = None) -> None:
        if trace is not None:
            self.traces[call_id] = trace
        n = len(response)
        self.charge(n)
        if n > ANSWER_PART_BYTES:
            self.large.append((call_id, response, 0, user))
        else:
            self.whole.append((call_id, _result_bytes(call_id, response, user), n))

    def refuse(self, result: spb.DoResult) -> None:
        n = len(result.response) + len(result.message)
        self.charge(n)
        self.whole.append((result.id, result.SerializeToString(), n))

    def take(self) -> bytes:
        """The next DoResultBatch message (at least one result; none left makes it empty)."""
        out: list[bytes] = []
        ids: list[int] = []
        size = 0
        while self.whole:
            call_id, encoded, n = self.whole[0]
            if out and size + n > STREAM_BATCH_BYTES:
                break
            self.whole.popleft()
            out.append(encoded)
            ids.append(call_id)
            size += n
        while self.large and (not out or size + ANSWER_PART_BYTES <= STREAM_BATCH_BYTES):
            call_id, response, sent, user = self.large.popleft()
            part = response[sent : sent + ANSWER_PART_BYTES]
            if sent == 0:
                out.append(spb.DoResult(id=call_id, response=part, size=len(response), user=user).SerializeToString())
                ids.append(call_id)
            else:
                out.append(spb.DoResult(id=call_id, response=part, rest=True).SerializeToString())
                ids.append(-1)  # a later part: never carries the trace
            sent += len(part)
            size += len(part)
            if sent < len(response):
                self.large.append((call_id, response, sent, user))  # its next part after the others'
        self.release(size)  # once per message: what this take took
        if self.traces:
            for i, call_id in enumerate(ids):
                trace = self.traces.pop(call_id, None) if call_id >= 0 else None
                if trace is not None:  # the packed stages field, merged into the encoded result
                    out[i] += spb.DoResult(stages=stages.store_finish(trace)).SerializeToString()
        metrics.LINK_ANSWERS_PER_MESSAGE.observe(len(out))
        return b"".join([wire.length_delimited(_RESULTS_FIELD, encoded) for encoded in out])


_RESULTS_FIELD = spb.DoResultBatch.DESCRIPTOR.fields_by_name["results"].number
_ID_TAG = wire.encode_varint(spb.DoResult.DESCRIPTOR.fields_by_name["id"].number << 3)
_RESPONSE_FIELD = spb.DoResult.DESCRIPTOR.fields_by_name["response"].number
_USER_FIELD = spb.DoResult.DESCRIPTOR.fields_by_name["user"].number


def _result_bytes(call_id: int, response: bytes, user: str) -> bytes:
    """``DoResult(id=call_id, response=response, user=user).SerializeToString()``, by hand:
    protobuf's bytes exactly (fields in number order, defaults left out)."""
    out = _ID_TAG + wire.encode_varint(call_id) if call_id else b""
    if response:
        out += wire.length_delimited(_RESPONSE_FIELD, response)
    if user:
        out += wire.length_delimited(_USER_FIELD, user.encode())
    return out
