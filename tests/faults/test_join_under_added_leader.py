"""A member added later joins a cluster whose leader is itself a member added later.

A joining node learns where its peers are. It took their IDs from --initial-cluster as if every
member had been there from the start (an ID computed from the peer URLs and the token), but a
member added with `member add` has an ID of its own: the joiner could hear such a leader's
heartbeats and never answer them, so it never caught up nor published its name. Found by
tests/faults/test_proxy_outlives_its_seeds.py in the runs where an added member won the election.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, Node, program_cluster, store_argv
from tests.support.processes import etcdctl, free_port, wait_for

pytestmark = pytest.mark.slow


def _add(cluster: Cluster, ep: str, name: str, tmp_path: Path, secret: Path, client_url: str, *,
         killed_before_its_log: bool = False) -> Node:
    """killed_before_its_log: the joiner's data dir is as a kill -9 leaves it right after the node
    learnt its ID from the cluster and wrote it (authstore/node/identity.py), before any entry came."""
    peer_port, internal_port = free_port(), free_port()
    rc, out, err = etcdctl(ep, "member", "add", name, f"--peer-urls=http://127.0.0.1:{peer_port}", timeout=60)
    assert rc == 0, err
    initial = re.search(r'ETCD_INITIAL_CLUSTER="([^"]+)"', out)
    assert initial, out
    node = Node(name=name, data_dir=tmp_path / name, internal=f"127.0.0.1:{internal_port}",
                argv=store_argv(name, tmp_path / name, internal_port, peer_port, secret, initial.group(1),
                                client_url, ["--initial-cluster-state", "existing"]))
    if killed_before_its_log:
        added = re.search(r"Member +([0-9a-f]+) added", out)  # etcdctl pads the ID (%16x)
        assert added, out
        node.data_dir.mkdir(mode=0o700)
        (node.data_dir / "member_id").write_text(f"{int(added.group(1), 16):016x}\n")
    cluster.nodes.append(node)
    cluster.restart(node)
    return node


def _names(ep: str) -> str:
    rc, out, err = etcdctl(ep, "member", "list", timeout=30)
    return out if rc == 0 else ""


def _status_from_leader(ep: str) -> bool:
    rc, out, _err = etcdctl(ep, "endpoint", "status", "-w", "json", timeout=30)
    if rc != 0:
        return False
    (status,) = json.loads(out)
    return bool(status["Status"]["leader"]) and status["Status"]["header"]["member_id"] == status["Status"]["leader"]


@pytest.mark.parametrize("killed_before_its_log", [False, True], ids=["joins", "restarted-before-its-log"])
def test_a_member_joins_under_a_leader_that_was_added_later(tmp_path: Path, killed_before_its_log: bool) -> None:
    """Also when the joiner was killed after it wrote the ID the cluster gave it and before its
    first entries came: restarted, it must still learn where (and under which IDs) its peers are."""
    with program_cluster(tmp_path, nodes=3) as cluster:
        ep = cluster.endpoint
        argv = cluster.nodes[0].argv
        client_url = argv[argv.index("--advertise-client-urls") + 1]
        secret = Path(argv[argv.index("--internal-secret-file") + 1])
        first = _add(cluster, ep, "added1", tmp_path, secret, client_url)
        wait_for(lambda: "added1" in _names(ep), 60, "added1 to publish its name")
        info = wait_for(lambda: cluster.leader_info(first), 30, "added1's own ID")
        # etcdctl move-leader asks the endpoint's Status and needs it to be the leader's answer; under
        # load the proxy may still be re-learning the leader after the member change, so wait for that
        wait_for(lambda: _status_from_leader(ep), 30, "the proxy's Status to come from the leader")
        rc, out, err = etcdctl(ep, "move-leader", f"{info.member_id:x}", timeout=60)
        assert rc == 0, (out, err)
        wait_for(lambda: (i := cluster.leader_info(first)) is not None and i.leader_id == i.member_id, 30,
                 "added1 to lead")
        _add(cluster, ep, "added2", tmp_path, secret, client_url, killed_before_its_log=killed_before_its_log)
        # added2 must answer the leader (added1), catch up and publish its name
        wait_for(lambda: "added2" in _names(ep), 60, "added2, joining under added1's lead, to publish its name")
