"""A member proxy that starts while its cluster has no leader still names gateways on member/list.

etcd 3.5.1 answers MemberList from the member's own state (not linearizable by default), so a
member that lost its quorum still lists every member's client URL, which serves its gateway. Here
the store nodes answer the member list without a leader too; the gateway URLs come from the
member list the proxy hears from the nodes (Store.Leader), which it took only from a node that
named a leader. A member proxy restarted (kill -9) during a quorum loss therefore knew no gateway
and answered with the gRPC client URLs: an HTTP client that discovers (Patroni) cached gRPC ports
and spoke HTTP to them, and each member/list waited for a new member list first.

Finding: after a restart without a leader, the gateway's member/list named gRPC-only URLs (fails
before the fix).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.cluster import Cluster
from tests.support.gateway_members import World, start_members
from tests.support.processes import free_port, wait_for, wait_serving

pytestmark = pytest.mark.slow

WAIT = 120.0  # upper bound on a loaded machine, never a timing assertion


def _member_urls(gateway: str) -> dict[str, list[str]]:
    request = urllib.request.Request(f"{gateway}/v3/cluster/member/list", data=b"{}")
    with urllib.request.urlopen(request, timeout=WAIT) as answer:
        return {m["name"]: m.get("clientURLs", []) for m in json.loads(answer.read())["members"]}


def _health(gateway: str) -> str:
    try:
        with urllib.request.urlopen(f"{gateway}/health", timeout=WAIT) as answer:
            return answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.read().decode()


def test_a_member_proxy_restarted_without_a_leader_names_gateways(tmp_path: Path) -> None:
    secret = tmp_path / "internal-secret"
    secret.write_text("e" * 64)
    secret.chmod(0o600)
    peers = {f"node{i + 1}": free_port() for i in range(3)}
    initial = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in peers.items())
    world = World(Cluster(tmp_path, sys.executable, secret.read_text(), [], ""), tmp_path, secret)
    try:
        start_members(world, initial, peers)
        survivor, *others = world.members
        wait_serving(survivor.grpc, WAIT)
        gateways = {m.name: [m.gateway] for m in world.members}
        assert _member_urls(survivor.gateway) == gateways
        for member in others:
            world.cluster.kill(member.node)
        wait_for(lambda: "RAFT NO LEADER" in _health(survivor.gateway), WAIT, "the survivor to follow no leader")
        survivor.proxy.kill9()
        survivor.proxy.start()
        # as on etcd: the member list without a leader, naming where each member serves HTTP
        assert _member_urls(survivor.gateway) == gateways
    finally:
        world.cluster.close()
