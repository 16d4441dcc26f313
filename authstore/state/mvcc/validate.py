"""etcd's API-layer checks of KV requests (v3rpc/key.go), run before authorization and apply.

etcd rejects these requests at the gRPC layer, before they reach Raft, so a client sees these
errors ahead of any permission error; raftgate keeps that order by running them first.
"""

from __future__ import annotations

from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

_SORT_ORDERS = frozenset(pb.RangeRequest.SortOrder.values())
_SORT_TARGETS = frozenset(pb.RangeRequest.SortTarget.values())


def check_range(req: pb.RangeRequest) -> None:
    if not req.key:
        raise EtcdError(Err.EMPTY_KEY)
    if req.sort_order not in _SORT_ORDERS or req.sort_target not in _SORT_TARGETS:
        raise EtcdError(Err.INVALID_SORT_OPTION)


def check_put(req: pb.PutRequest) -> None:
    if not req.key:
        raise EtcdError(Err.EMPTY_KEY)
    if req.ignore_value and req.value:
        raise EtcdError(Err.VALUE_PROVIDED)
    if req.ignore_lease and req.lease:
        raise EtcdError(Err.LEASE_PROVIDED)


def check_delete_range(req: pb.DeleteRangeRequest) -> None:
    if not req.key:
        raise EtcdError(Err.EMPTY_KEY)


def check_txn(req: pb.TxnRequest, max_txn_ops: int = 128) -> None:
    """Shape checks of the whole tree, then the put/delete overlap check of each branch."""
    _check_txn_shape(req, max_txn_ops)
    _check_intervals(req.success)
    _check_intervals(req.failure)


def _check_txn_shape(req: pb.TxnRequest, max_txn_ops: int) -> None:
    # the widest of compares / success / failure counts, and nested txns get the remaining budget
    width = max(len(req.compare), len(req.success), len(req.failure))
    if width > max_txn_ops:
        raise EtcdError(Err.TOO_MANY_OPS)
    for c in req.compare:
        if not c.key:
            raise EtcdError(Err.EMPTY_KEY)
    for op in (*req.success, *req.failure):
        _check_op(op, max_txn_ops - width)


def _check_op(op: pb.RequestOp, max_txn_ops: int) -> None:
    which = op.WhichOneof("request")
    if which == "request_range":
        check_range(op.request_range)
    elif which == "request_put":
        check_put(op.request_put)
    elif which == "request_delete_range":
        check_delete_range(op.request_delete_range)
    elif which == "request_txn":
        _check_txn_shape(op.request_txn, max_txn_ops)
    else:
        raise EtcdError(Err.KEY_NOT_FOUND)  # etcd's answer to an empty op


# ---- overlap check (etcd's checkIntervals) ----
# Intervals use etcd's "affine" order: an empty end sorts after every key (unbounded). A delete's
# range_end of "\x00" is NOT special here, exactly as in etcd: [key, "\x00") is an inverted
# interval that overlaps nothing.
_Interval = tuple[bytes, bytes]


def _lt(a: bytes, b: bytes) -> bool:
    """a < b where b"" is +infinity (only ends are ever empty)."""
    if not b:
        return bool(a)
    if not a:
        return False
    return a < b


def _hits(dels: list[_Interval], key: bytes) -> bool:
    point_end = key + b"\x00"
    return any(_lt(begin, point_end) and _lt(key, end) for begin, end in dels)


def _check_intervals(ops: list[pb.RequestOp]) -> tuple[set[bytes], list[_Interval]]:
    """Puts of this branch and its nested txns must be distinct keys and outside every delete.

    Returns (put keys, delete intervals) so the enclosing level can check against them. A key
    put by both the success and the failure branch of one nested txn is fine: only one runs.
    """
    dels: list[_Interval] = []
    for op in ops:
        if op.WhichOneof("request") == "request_delete_range":
            d = op.request_delete_range
            dels.append((d.key, d.range_end) if d.range_end else (d.key, d.key + b"\x00"))

    puts: set[bytes] = set()
    for op in ops:
        if op.WhichOneof("request") != "request_txn":
            continue
        puts_then, dels_then = _check_intervals(op.request_txn.success)
        puts_else, dels_else = _check_intervals(op.request_txn.failure)
        for k in puts_then:
            if k in puts or _hits(dels, k):
                raise EtcdError(Err.DUPLICATE_KEY)
            puts.add(k)
        for k in puts_else:
            if (k in puts and k not in puts_then) or _hits(dels, k):
                raise EtcdError(Err.DUPLICATE_KEY)
            puts.add(k)
        dels.extend(dels_then)
        dels.extend(dels_else)

    for op in ops:
        if op.WhichOneof("request") != "request_put":
            continue
        k = op.request_put.key
        if k in puts or _hits(dels, k):
            raise EtcdError(Err.DUPLICATE_KEY)
        puts.add(k)
    return puts, dels
