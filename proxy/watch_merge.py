"""Events a slow watch reader has not taken yet go to it in fewer, larger messages.

gRPC-Python pays its cost per message, on the proxy and on the client alike, so a client that
falls behind its watches would fall further behind if every revision stayed its own message. When
the proxy's sender takes an event answer and the answers queued right behind it carry more events
of the same watch, they leave as one ``WatchResponse``: the last one's header and watch id, every
event in revision order. etcd does the same for a watcher that fell behind (its catch-up answers
carry many revisions, with the newest header), and its API guarantees only that the events of one
revision are never split, which this keeps: whole answers are merged, fragments never.

Nothing waits for answers to merge: only what is already queued is taken. That is what the client
has not taken yet, and also the answers of one store batch (the store sends together what queued
for the stream meanwhile, as under concurrent writes), so a reader that keeps up may get several
revisions in one message too; with one write at a time it gets one message per revision, as
before. A merged message holds at most ``MERGE_BYTES`` (gRPC's default receive limit is 4 MiB;
etcd's Go client raises its own to 2 GiB) and ``MERGE_REVISIONS`` (etcd's bound on a catch-up
answer: 1 MiB of tiny events would be tens of thousands of revisions, merged in one go while the
proxy serves nobody else); an answer that is larger alone is sent alone.
"""

from __future__ import annotations

import sys
from typing import Any

from protos import wire
from raftgate.byte_queue import ByteQueue

#: A merged answer never grows past this many bytes (gRPC clients receive 4 MiB by default).
MERGE_BYTES = 1 << 20
#: ... nor past this many revisions (etcd's watchBatchMaxRevs: the most its catch-up answer carries).
MERGE_REVISIONS = 1000

_HEADER, _WATCH_ID, _EVENTS = 1, 2, 11
_LEN, _VARINT = 2, 0


class EventsAnswer:
    """An answer carrying only events of one watch (no created, canceled, compaction or fragment
    flag): one that may merge with the next answers of the same watch."""

    __slots__ = ("data", "watch_id", "events_at", "revisions")

    def __init__(self, data: bytes, watch_id: int, events_at: int, revisions: int = 1) -> None:
        self.data = data
        self.watch_id = watch_id
        self.events_at = events_at  # offset of its first event: the header and watch id come before
        self.revisions = revisions  # distinct revisions of its events (a catch-up answer has many)

    @classmethod
    def of(cls, data: bytes, watch_id: int, revisions: int = 1) -> EventsAnswer | None:
        """``data`` as a mergeable answer, given a parse found only events besides its header and
        watch id (of ``revisions`` distinct revisions); None if its fields are not in the order
        protobuf writes them."""
        at = events_offset(data)
        return None if at is None else cls(data, watch_id, at, revisions)


#: What a queued answer takes besides its payload: its bytes object (header and allocator
#: rounding) and its queue slot; a mergeable one also the ``EventsAnswer`` around it. Charged too,
#: so that a stalled client's bound is memory however small its answers (a 30-byte answer took
#: 136 bytes).
BYTES_COST = sys.getsizeof(b"") + 7 + 8
EVENTS_COST = BYTES_COST + sys.getsizeof(EventsAnswer(b"", 0, 0))


def answer_size(item: object) -> int:
    """What a queue of answers charges an item: the memory it takes (an error or the end counts
    nothing)."""
    if isinstance(item, EventsAnswer):
        return len(item.data) + EVENTS_COST
    return len(item) + BYTES_COST if isinstance(item, bytes) else 0


def events_offset(data: bytes) -> int | None:
    """Where the events of a WatchResponse start: after its header and watch id (protobuf writes
    fields in number order), at an events field; None if something else comes first."""
    pos = 0
    end = len(data)
    while pos < end:
        key, after = wire.decode_varint(data, pos)
        number, kind = key >> 3, key & 7
        if number == _EVENTS and kind == _LEN:
            return pos
        if number == _HEADER and kind == _LEN:
            size, after = wire.decode_varint(data, after)
            pos = after + size
        elif number == _WATCH_ID and kind == _VARINT:
            _, pos = wire.decode_varint(data, after)
        else:
            return None
    return None


def merge(answers: list[EventsAnswer]) -> bytes:
    """One WatchResponse with the last answer's header and watch id and every answer's events, in
    order (the answers are consecutive ones of one watch)."""
    if len(answers) == 1:
        return answers[0].data
    last = answers[-1]
    return b"".join([last.data[:last.events_at], *(a.data[a.events_at:] for a in answers)])


def take_merged(first: EventsAnswer, queue: ByteQueue[Any]) -> bytes:
    """``first`` (just taken from ``queue``) and the answers of the same watch queued right behind
    it, as one message: only what the reader has not taken yet, never beyond ``MERGE_BYTES`` nor
    ``MERGE_REVISIONS`` (answers of one watch hold disjoint revisions: whole ones, never fragments)."""
    taken = [first]
    events = len(first.data) - first.events_at
    revisions = first.revisions
    while True:
        nxt = queue.peek()
        if not isinstance(nxt, EventsAnswer) or nxt.watch_id != first.watch_id:
            break
        more = len(nxt.data) - nxt.events_at
        if nxt.events_at + events + more > MERGE_BYTES or revisions + nxt.revisions > MERGE_REVISIONS:
            break
        taken.append(queue.get_nowait())
        events += more
        revisions += nxt.revisions
    return merge(taken)
