"""Apply says which batches changed the membership (the node re-reads members and peers after
them), so the node need not recognise membership requests by their response type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb


def _entry(index: int, req: ipb.InternalRaftRequest) -> Entry:
    return Entry(term=1, index=index, data=req.SerializeToString())


def test_apply_reports_a_membership_change_and_tells_the_decided_hook(tmp_path: Path) -> None:
    applier = Applier(Backend(tmp_path / "db", map_size=64 << 20), member_id=1)
    decided: list[tuple[int, bool]] = []

    def hook(index: int, _results: list[tuple[int, Any]], membership_changed: bool) -> None:
        decided.append((index, membership_changed))

    applier.on_decided(hook)
    put = ipb.InternalRaftRequest(ID=7, put=pb.PutRequest(key=b"k", value=b"v"))
    attrs = ipb.InternalRaftRequest(ID=8, member_attr_set=ipb.MemberAttrSetRequest(member_ID=1, name="n1"))
    try:
        results, changed = applier.apply([_entry(1, put)], term=1)
        assert [rid for rid, _ in results] == [7] and not changed
        results, changed = applier.apply([_entry(2, put), _entry(3, attrs)], term=1)
        assert [rid for rid, _ in results] == [7, 8] and changed
        results, changed = applier.apply([_entry(3, attrs)], term=1)  # a replay: nothing applied
        assert not changed
    finally:
        applier.backend.close()
    assert decided == [(1, False), (3, True)]
