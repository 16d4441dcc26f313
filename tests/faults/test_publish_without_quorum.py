"""A member that starts while its cluster has no quorum cannot publish its attributes (no leader
takes the proposal): it still says ready after its wait, keeps trying quietly (no error, no
traceback), and publishes once a second member makes a quorum."""

from __future__ import annotations

from pathlib import Path

from tests.support.cluster import unstarted_cluster
from tests.support.processes import wait_for


def test_a_member_started_without_quorum_says_ready_and_publishes_later(tmp_path: Path) -> None:
    cluster = unstarted_cluster(tmp_path, 3)
    nodes = cluster.nodes
    first, second = nodes[0], nodes[1]
    try:
        cluster.restart(first)  # returns once it said ready: after its wait, with no leader to publish to
        assert "member attributes not published yet" in first.program.output()  # type: ignore[union-attr]
        cluster.restart(second)
        me = wait_for(lambda: cluster.leader_info(first), 10, "node1 to answer").member_id  # type: ignore[union-attr]

        def published() -> bool:
            info = cluster.leader_info(second)
            return info is not None and info.leader_id != 0 and any(
                m.id == me and m.internal_urls == [f"http://{first.internal}"] for m in info.members)

        wait_for(published, 30, "node1's attributes in the member list")
        for node in (first, second):
            out = node.program.output()  # type: ignore[union-attr]
            assert " ERROR " not in out and "Traceback" not in out and "exception" not in out.lower(), out[-3000:]
    finally:
        cluster.close()
