"""etcd's initial election tick advance needs more than one connected peer: a member of five
started with only one peer up does not fast-forward (it could campaign early into a cluster
whose other members it cannot hear yet), says ready after its wait for a leader, and the cluster
elects one once a third member makes a quorum."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.support.cluster import unstarted_cluster


def test_a_member_of_five_with_one_peer_up_does_not_advance_its_ticks(tmp_path: Path) -> None:
    cluster = unstarted_cluster(tmp_path, 5)
    nodes = cluster.nodes
    try:
        # two members at once (each says ready only after its wait for a leader, which none
        # elects): each has one active peer within its advance's window, never two
        starts = [threading.Thread(target=cluster.restart, args=(node,)) for node in nodes[:2]]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        assert all(node.running for node in nodes[:2])
        for node in nodes[:2]:
            out = node.program.output()  # type: ignore[union-attr]
            assert "starting initial election tick advance" in out, out[-2000:]
            assert "fast-forwarding election ticks" not in out, out[-2000:]
        cluster.restart(nodes[2])
        cluster.leader(timeout=30, among=nodes[:3])
        for node in nodes[:3]:
            out = node.program.output()  # type: ignore[union-attr]
            assert " ERROR " not in out and "Traceback" not in out, out[-3000:]
    finally:
        cluster.close()
