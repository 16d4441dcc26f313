"""The proxy keeps serving after every seed (--store-endpoints) has left the cluster: the nodes
it learned from the member list carry it. Three new voters join and the three seeds are removed
one by one (their processes stop); writes through the proxy succeed all along and after, and
the proxy's node list ends with the new members (the removed seeds are still asked, as seeds).

Finding: a proxy that stops serving once its seed endpoints have left the cluster (an attack that
held when written).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.cluster import Client, Node, program_cluster, retry_ok, store_argv
from tests.support.processes import etcdctl, free_port, wait_for

pytestmark = pytest.mark.slow


def test_writes_go_on_after_every_seed_left(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3) as cluster:
        ep = cluster.endpoint
        argv = cluster.nodes[0].argv
        client_url = argv[argv.index("--advertise-client-urls") + 1]
        secret = Path(argv[argv.index("--internal-secret-file") + 1])
        seeds = list(cluster.nodes)
        client = Client(ep)
        try:
            retry_ok(lambda: client.put(b"/w/0", b"0", timeout=10), 30, "a first write")
            for step, seed in enumerate(seeds, start=1):
                name = f"new{step}"
                peer_port, internal_port = free_port(), free_port()
                peer_url = f"http://127.0.0.1:{peer_port}"
                rc, out, err = etcdctl(ep, "member", "add", name, f"--peer-urls={peer_url}", timeout=60)
                assert rc == 0, err
                initial_now = re.search(r'ETCD_INITIAL_CLUSTER="([^"]+)"', out)
                assert initial_now, out
                node = Node(name=name, data_dir=tmp_path / name, internal=f"127.0.0.1:{internal_port}",
                            argv=store_argv(name, tmp_path / name, internal_port, peer_port, secret,
                                            initial_now.group(1), client_url, ["--initial-cluster-state", "existing"]))
                cluster.nodes.append(node)
                cluster.restart(node)
                retry_ok(lambda s=step: client.put(b"/w/%d" % s, b"joined", timeout=10), 60, f"a write after {name}")
                assert cluster.leader_info(seed) is not None
                rc, out, err = etcdctl(ep, "member", "remove", f"{seed.member_id:x}", timeout=60)
                assert rc == 0, err
                wait_for(lambda s=seed: not s.running, 30, f"the removed {seed.name} to stop")
                retry_ok(lambda s=step: client.put(b"/w/%d" % s, b"left", timeout=10), 60,
                         f"a write after {seed.name} left")
            # every seed is gone: the proxy still reaches the cluster through what it learned
            for i in range(10):
                retry_ok(lambda i=i: client.put(b"/after/%d" % i, b"x", timeout=10), 60, "writes with no seed left")
            assert client.get(b"/w/3") == b"left"
            rc, out, err = etcdctl(ep, "member", "list", timeout=30)
            assert rc == 0 and all(f"new{i}" in out for i in (1, 2, 3)), (out, err)
            assert not any(s.name in out for s in seeds), out
        finally:
            client.close()
