"""Small synchronous harness for unit tests of the Raft core: nodes are Raft values, and a
Network moves their messages immediately (persisting is implicit: the unstable log is the log)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from authstore.raft import Config, Entry, MemoryStorage, Message, MessageType, Raft

M = MessageType


def new_raft(id: int, voters: Iterable[int], *, learners: Iterable[int] = (), storage: MemoryStorage | None = None,
             election: int = 10, heartbeat: int = 1, **kw: object) -> Raft:
    st = storage if storage is not None else MemoryStorage.with_conf(list(voters), list(learners))
    return Raft(Config(id=id, storage=st, election_tick=election, heartbeat_tick=heartbeat,
                       rng=random.Random(id), **kw))  # type: ignore[arg-type]


def storage_with(voters: list[int], terms: list[int]) -> MemoryStorage:
    """A storage whose log holds one entry per term in terms (indexes 1..n)."""
    st = MemoryStorage.with_conf(voters)
    st.append([Entry(t, i + 1, data=b"e%d" % (i + 1)) for i, t in enumerate(terms)])
    return st


class Network:
    def __init__(self, *nodes: Raft) -> None:
        self.peers: dict[int, Raft] = {n.id: n for n in nodes}
        self.cut: set[tuple[int, int]] = set()
        self.drop_types: set[int] = set()
        self.sent: list[Message] = []
        self.intercept: Callable[[Message], bool] | None = None

    def send(self, *msgs: Message) -> None:
        queue = list(msgs)
        while queue:
            m = queue.pop(0)
            self.sent.append(m)
            if (m.frm, m.to) in self.cut or m.type in self.drop_types:
                continue
            if self.intercept is not None and not self.intercept(m):
                continue
            p = self.peers.get(m.to)
            if p is None:
                continue
            p.step(m)
            queue.extend(self.take(p))

    @staticmethod
    def take(p: Raft) -> list[Message]:
        msgs = p.msgs + p.msgs_after_append  # persisting is implicit: self-acks go at once
        p.msgs, p.msgs_after_append = [], []
        return msgs

    def flush(self) -> None:
        """Delivers whatever the nodes have queued (after ticks or direct calls)."""
        for p in self.peers.values():
            self.send(*self.take(p))

    def campaign(self, id: int) -> None:
        self.send(Message(M.MsgHup, to=id, frm=id))

    def propose(self, id: int, data: bytes = b"x") -> None:
        self.send(Message(M.MsgProp, to=id, frm=id, entries=[Entry(data=data)]))

    def isolate(self, id: int) -> None:
        for other in self.peers:
            if other != id:
                self.cut |= {(id, other), (other, id)}

    def heal(self) -> None:
        self.cut.clear()

    def tick(self, id: int, n: int = 1) -> None:
        p = self.peers[id]
        for _ in range(n):
            p.tick()
            self.send(*self.take(p))


def persisted(r: Raft) -> None:
    """The driver made r's appended entries durable: r steps its acknowledgement of its own."""
    msgs, r.msgs_after_append = r.msgs_after_append, []
    for m in msgs:
        r.step(m)


def log_of(r: Raft) -> list[tuple[int, int, bytes]]:
    log = r.log
    return [(e.index, e.term, e.data) for e in log.slice(log.first_index(), log.last_index() + 1, 1 << 62)]
