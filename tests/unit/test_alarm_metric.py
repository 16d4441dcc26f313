"""The NOSPACE alarm as a metric: ``raftgate_store_alarm_active{alarm}`` follows the alarms in the
node's applied state (set by the leader's quota through the log, cleared by Alarm DEACTIVATE), so
the chart's NOSPACE alert fires on every node that refuses writes, and again after a restart.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

import authstore.metrics  # noqa: F401  (registers the store's metrics)
from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb


def active(alarm: str) -> float | None:
    return REGISTRY.get_sample_value("raftgate_store_alarm_active", {"alarm": alarm})


def _apply(applier: Applier, index: int, req: ipb.InternalRaftRequest) -> None:
    applier.apply_batch([Entry(term=1, index=index, data=req.SerializeToString())])


def test_alarm_gauge_follows_the_applied_alarms(tmp_path: Path) -> None:
    applier = Applier(Backend(tmp_path / "db"), member_id=7)
    assert active("NOSPACE") == 0 and active("CORRUPT") == 0  # exported before the first alarm
    raise_it = pb.AlarmRequest(action=pb.AlarmRequest.ACTIVATE, memberID=7, alarm=pb.NOSPACE)
    _apply(applier, 1, ipb.InternalRaftRequest(ID=1, store_alarm=raise_it))
    assert active("NOSPACE") == 1 and active("CORRUPT") == 0

    # A restarted node reports the alarm it holds before it applies anything new.
    applier.backend.close()
    authstore.metrics.observe_alarms(())
    assert active("NOSPACE") == 0
    applier = Applier(Backend(tmp_path / "db"), member_id=7)
    assert active("NOSPACE") == 1

    clear = pb.AlarmRequest(action=pb.AlarmRequest.DEACTIVATE, memberID=7, alarm=pb.NOSPACE)
    _apply(applier, 2, ipb.InternalRaftRequest(ID=2, alarm=clear))
    assert active("NOSPACE") == 0
    applier.backend.close()
