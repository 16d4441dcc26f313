"""The request ID and time every logged request carries, stamped by the API layer (as etcdserver
does): the node logs bytes it never reads. proposer.py calls ``stamp`` with the ID it picked and
the time, once the node may log the request."""

from __future__ import annotations

from protos import wire
from protos.etcdserverpb import raft_internal_pb2 as ipb

ID_FIELD = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_name["ID"].number
TIME_FIELD = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_name["time_unix_ms"].number


def stamp(data: bytes, request_id: int, time_ms: int) -> bytes:
    """An encoded InternalRaftRequest with its ID and time appended (the last occurrence of a field
    wins, so nothing is parsed or re-encoded)."""
    return data + wire.varint_field(ID_FIELD, request_id) + wire.varint_field(TIME_FIELD, time_ms)
