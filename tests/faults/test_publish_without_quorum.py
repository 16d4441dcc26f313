"""A member that starts while its cluster has no quorum cannot publish its attributes (no leader
takes the proposal): it still says ready after its wait, keeps trying quietly (no error, no
traceback), and publishes once a second member makes a quorum."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.cluster import Cluster, Node, store_argv
from tests.support.processes import free_port, wait_for


def test_a_member_started_without_quorum_says_ready_and_publishes_later(tmp_path: Path) -> None:
    secret = tmp_path / "internal-secret"
    secret.write_text(os.urandom(32).hex())
    os.chmod(secret, 0o600)
    client_url = f"http://127.0.0.1:{free_port()}"
    layout = [(f"node{i + 1}", free_port(), free_port()) for i in range(3)]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in layout)
    nodes = [Node(name=name, argv=store_argv(name, tmp_path / name, internal, peer, secret, initial, client_url, []),
                  data_dir=tmp_path / name, internal=f"127.0.0.1:{internal}") for name, internal, peer in layout]
    cluster = Cluster(tmp_path, sys.executable, secret.read_text(), nodes, "")
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
