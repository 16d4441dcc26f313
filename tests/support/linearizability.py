"""A linearizability checker for client histories of a key-value store (Wing & Gong's search).

A history is a list of operations, each with an invoke time and an outcome:

- ``ok``: completed at ``complete`` time with ``output``;
- ``fail``: surely did not take effect (dropped from the history);
- ``timeout``: outcome unknown. It may have taken effect at any point after its invocation, or
  never; its output never constrains anything. A read that timed out constrains nothing at all.

The history is linearizable if some total order of (all ok and some timed-out) operations
respects real time (an op that completed before another was invoked comes first) and replays
correctly on a sequential KV model. Keys are independent (P-compositionality: a history is
linearizable iff each key's sub-history is), so each key is searched separately, and the search
memoizes (set of linearized ops, model state) so each such pair is explored once.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

PUT, GET, DELETE, CAS = "put", "get", "delete", "cas"
OK, FAIL, TIMEOUT = "ok", "fail", "timeout"


@dataclass(slots=True)
class Op:
    client: int
    kind: str
    key: Hashable
    #: put: the value; cas: (expected, new) where None means "absent"; get/delete: None
    arg: Any
    invoke: int
    complete: int | None = None
    status: str = "pending"
    #: get: the value read (None = absent); delete: whether the key existed; cas: whether it swapped
    output: Any = None

    def __repr__(self) -> str:
        end = "?" if self.complete is None else self.complete
        call = f"c{self.client} {self.kind}({self.key!r}, {self.arg!r})"
        return f"[{self.invoke}..{end}] {call} -> {self.status} {self.output!r}"


@dataclass
class History:
    """Records operations as a test issues them. Times come from a counter, so they never tie."""

    ops: list[Op] = field(default_factory=list)
    _clock: itertools.count = field(default_factory=lambda: itertools.count(1))

    def invoke(self, client: int, kind: str, key: Hashable, arg: Any = None) -> Op:
        op = Op(client, kind, key, arg, next(self._clock))
        self.ops.append(op)
        return op

    def ok(self, op: Op, output: Any = None) -> None:
        op.status, op.output, op.complete = OK, output, next(self._clock)

    def fail(self, op: Op) -> None:
        op.status, op.complete = FAIL, next(self._clock)

    def timeout(self, op: Op) -> None:
        op.status, op.complete = TIMEOUT, None

    def close(self) -> None:
        """Marks every operation still pending as timed out (the test ended before it did)."""
        for op in self.ops:
            if op.status == "pending":
                self.timeout(op)


@dataclass
class CheckResult:
    ok: bool
    #: the first key whose sub-history is not linearizable, and that sub-history
    key: Hashable = None
    ops: list[Op] = field(default_factory=list)
    explored: int = 0

    def describe(self) -> str:
        if self.ok:
            return "linearizable"
        lines = [f"not linearizable on key {self.key!r} ({len(self.ops)} ops):"]
        lines += [f"  {op!r}" for op in self.ops[:200]]
        return "\n".join(lines)


def _step(state: Any, op: Op) -> tuple[bool, Any]:
    """The sequential model: (whether op's output is consistent with state, state after op)."""
    kind = op.kind
    known = op.status == OK
    if kind == PUT:
        return True, op.arg
    if kind == GET:
        return op.output == state, state
    if kind == DELETE:
        return (not known or op.output == (state is not None)), None
    if kind == CAS:
        expected, new = op.arg
        swapped = state == expected
        if known and op.output != swapped:
            return False, state
        return True, (new if swapped else state)
    raise ValueError(f"unknown operation kind {kind!r}")


class _Node:
    __slots__ = ("op", "bit", "is_call", "match", "prev", "next")

    def __init__(self, op: Op | None, bit: int, is_call: bool) -> None:
        self.op = op
        self.bit = bit
        self.is_call = is_call
        self.match: _Node | None = None
        self.prev: _Node | None = None
        self.next: _Node | None = None


def _check_key(ops: list[Op], initial: Any = None, max_explored: int = 5_000_000) -> tuple[bool, int]:
    events: list[tuple[int, int, _Node]] = []
    n_returns = 0
    for bit, op in enumerate(ops):
        call = _Node(op, bit, True)
        events.append((op.invoke, 0, call))
        if op.status == OK:
            assert op.complete is not None
            ret = _Node(op, bit, False)
            call.match = ret
            events.append((op.complete, 1, ret))
            n_returns += 1
    events.sort(key=lambda e: (e[0], e[1]))
    head = _Node(None, -1, False)
    prev = head
    for _, _, node in events:
        prev.next = node
        node.prev = prev
        prev = node

    def lift(call: _Node) -> None:
        call.prev.next = call.next  # type: ignore[union-attr]
        if call.next is not None:
            call.next.prev = call.prev
        ret = call.match
        if ret is not None:
            ret.prev.next = ret.next  # type: ignore[union-attr]
            if ret.next is not None:
                ret.next.prev = ret.prev

    def unlift(call: _Node) -> None:
        ret = call.match
        if ret is not None:
            ret.prev.next = ret  # type: ignore[union-attr]
            if ret.next is not None:
                ret.next.prev = ret
        call.prev.next = call  # type: ignore[union-attr]
        if call.next is not None:
            call.next.prev = call

    seen: set[tuple[int, Any]] = set()
    stack: list[tuple[_Node, Any]] = []
    linearized = 0
    state = initial
    remaining = n_returns
    entry = head.next
    explored = 0
    while remaining:
        explored += 1
        if explored > max_explored:
            raise RuntimeError(f"linearizability search gave up after {max_explored} steps")
        if entry is not None and entry.is_call:
            ok, new_state = _step(state, entry.op)  # type: ignore[arg-type]
            if ok:
                lin = linearized | (1 << entry.bit)
                memo = (lin, new_state)
                if memo not in seen:
                    seen.add(memo)
                    stack.append((entry, state))
                    state, linearized = new_state, lin
                    lift(entry)
                    if entry.match is not None:
                        remaining -= 1
                    entry = head.next
                    continue
            entry = entry.next
        else:
            # a return whose call is not linearized yet (or the end): undo the last choice
            if not stack:
                return False, explored
            call, state = stack.pop()
            linearized &= ~(1 << call.bit)
            unlift(call)
            if call.match is not None:
                remaining += 1
            entry = call.next
    return True, explored


def check(ops: Iterable[Op], initial: Any = None) -> CheckResult:
    """Checks a KV history (every key starts at ``initial``, None meaning absent)."""
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for op in ops:
        if op.status == FAIL or op.status == "pending":
            if op.status == "pending":
                raise ValueError(f"operation still pending (call History.close()): {op!r}")
            continue
        if op.status == TIMEOUT and op.kind == GET:
            continue
        by_key[op.key].append(op)
    explored = 0
    for key, kops in by_key.items():
        ok, n = _check_key(kops, initial)
        explored += n
        if not ok:
            return CheckResult(False, key, sorted(kops, key=lambda o: o.invoke), explored)
    return CheckResult(True, explored=explored)
