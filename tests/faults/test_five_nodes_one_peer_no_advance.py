"""etcd's initial election tick advance needs more than one connected peer: a member of five
started with only one peer up does not fast-forward (it could campaign early into a cluster
whose other members it cannot hear yet), says ready after its wait for a leader, and the cluster
elects one once a third member makes a quorum."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.cluster import Cluster, Node, store_argv
from tests.support.processes import free_port


def test_a_member_of_five_with_one_peer_up_does_not_advance_its_ticks(tmp_path: Path) -> None:
    secret = tmp_path / "internal-secret"
    secret.write_text(os.urandom(32).hex())
    os.chmod(secret, 0o600)
    client_url = f"http://127.0.0.1:{free_port()}"
    layout = [(f"node{i + 1}", free_port(), free_port()) for i in range(5)]
    initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in layout)
    nodes = [Node(name=name, argv=store_argv(name, tmp_path / name, internal, peer, secret, initial, client_url, []),
                  data_dir=tmp_path / name, internal=f"127.0.0.1:{internal}") for name, internal, peer in layout]
    cluster = Cluster(tmp_path, sys.executable, secret.read_text(), nodes, "")
    try:
        cluster.restart(nodes[1])  # its peer, up first: node1 has one active peer from its start
        cluster.restart(nodes[0])  # ready after its wait for a leader: its advance's window is over
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
