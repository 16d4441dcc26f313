"""A member removed while it was away stops once it is back (found in a full run: 1 of 4).

The removal entry is committed by the other members; the leader then stops sending to the removed
one, so a member that was paused, cut off or slow at that moment never applies the entry that
removes it, and it ran on for ever, campaigning into a cluster that no longer counts it
(tests/faults/test_membership_follow.py waited 30 s for it to stop and failed). etcd's peers
answer a removed member's messages with 410 Gone and it stops; raftgate's peers refuse them and
it stops the same way.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support.cluster import program_cluster
from tests.support.processes import etcdctl, wait_for

pytestmark = pytest.mark.slow


def test_a_member_removed_while_paused_stops_once_resumed(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3) as cluster:
        leader = cluster.leader()
        away = cluster.followers(leader)[0]
        cluster.leader_info(away)  # its member ID
        assert away.program is not None and away.program.proc is not None
        pid = away.program.proc.pid
        os.kill(pid, signal.SIGSTOP)  # away while its removal is committed
        try:
            rc, _, err = etcdctl(cluster.endpoint, "--command-timeout=30s", "member", "remove", f"{away.member_id:x}")
            assert rc == 0, err
            assert etcdctl(cluster.endpoint, "put", "after-remove", "yes")[0] == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: not away.running, 30, "the member removed while away to stop")
        assert "removed from the cluster" in away.output(), away.output()[-2000:]
