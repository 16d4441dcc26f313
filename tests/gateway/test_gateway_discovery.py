"""An HTTP client that discovers the cluster through the gateway finds gateways, as on etcd.

Patroni's etcd3 DCS (and any client written against etcd's JSON gateway) asks
``/v3/cluster/member/list`` and then talks HTTP to each member's ``clientURLs``: on etcd those serve
gRPC and the gateway alike. raftgate's client URLs are its member proxies' gRPC ports, so each
store node also advertises its member proxy's gateway (``--advertise-gateway-urls``) and the
gateway's member list names those, while gRPC's MemberList keeps naming gRPC endpoints (etcdctl,
clientv3's auto-sync and python-etcd3's failover keep finding gRPC).

Three store nodes, each with a member proxy serving gRPC and the gateway; auth on. The client
below does what Patroni's does (seeds, authenticate, member/list, then the members' URLs, moving
on when one fails) and talks to what it found through etcd3gw (OpenStack's gateway client), also
while a member is removed and another added.

Finding: member/list on the gateway named gRPC-only URLs, so HTTP clients that discover could not
connect (Patroni with its default settings; failed before the fix).
"""

from __future__ import annotations

import json
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.discovering_client import DiscoveringClient
from tests.support.gateway_members import World, start_member, start_members
from tests.support.processes import etcdctl, free_port, wait_for, wait_serving

pytestmark = pytest.mark.slow

WAIT = 120.0  # upper bound on a loaded machine, never a timing assertion
ROOT = ("root", "rootpw")
APP = ("app", "apppw")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("discovery")
    secret = tmp / "internal-secret"
    secret.write_text("d" * 64)
    secret.chmod(0o600)
    peers = {f"node{i + 1}": free_port() for i in range(3)}
    initial = ",".join(f"{name}=http://127.0.0.1:{port}" for name, port in peers.items())
    cluster = Cluster(tmp, sys.executable, secret.read_text(), [], "")
    world = World(cluster, tmp, secret)
    try:
        start_members(world, initial, peers)
        cluster.endpoint = world.members[0].grpc
        wait_serving(world.members[0].grpc, WAIT)
        ep = world.members[0].grpc
        for args in (("user", "add", "root:rootpw"), ("user", "add", "app:apppw"), ("role", "add", "app"),
                     ("role", "grant-permission", "app", "readwrite", "/service/", "--prefix"),
                     ("user", "grant-role", "app", "app"), ("auth", "enable")):
            rc, _, err = etcdctl(ep, *args, timeout=60)
            assert rc == 0, (args, err)
        yield world
    finally:
        cluster.close()


def _grpc_member_urls(world: World) -> dict[str, list[str]]:
    rc, out, err = etcdctl(world.grpc_endpoints(), "member", "list", "-w", "json", user="root:rootpw", timeout=60)
    assert rc == 0, err
    return {m.get("name", ""): m.get("clientURLs", []) for m in json.loads(out)["members"]}


# --- the tests ------------------------------------------------------------------------------------


def test_the_gateways_member_list_names_gateways_and_grpcs_names_grpc(world: World) -> None:
    client = DiscoveringClient([world.members[0].gateway], APP)
    members = client.refresh()
    assert {m["name"]: m["clientURLs"] for m in members} == {m.name: [m.gateway] for m in world.members}
    assert {m["name"]: m["peerURLs"][0] for m in members} == {
        m.name: m.node.argv[m.node.argv.index("--initial-advertise-peer-urls") + 1] for m in world.members}
    # gRPC's MemberList (etcdctl, clientv3's auto-sync) keeps naming the gRPC endpoints
    assert _grpc_member_urls(world) == {m.name: [f"http://{m.grpc}"] for m in world.members}
    # every URL found is a gateway that serves this client, through etcd3gw
    for url in client.machines:
        client.machines = [url]
        assert client.put_get(f"/service/{url[-5:]}", "here") == "here"


def _get(url: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a request without any credentials, as a Kubernetes probe sends it."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def test_health_is_etcds_on_every_members_gateway_without_a_token(world: World) -> None:
    """etcd 3.5.1's answers on its client URL (measured with curl): GET /health, with
    ?serializable=true and ?exclude=NOSPACE; other methods 405; no /readyz or /livez in 3.5."""
    for member in world.members:
        for query in ("", "?serializable=true", "?exclude=NOSPACE", "?exclude=&exclude=CORRUPT"):
            status, headers, body = _get(f"{member.gateway}/health{query}")
            assert (status, body) == (200, '{"health":"true","reason":""}'), (member.name, query)
            assert headers["Content-Type"] == "text/plain; charset=utf-8"
    status, headers, body = _get(f"{world.members[0].gateway}/health", "POST")
    assert (status, headers.get("Allow"), body) == (405, "GET", "Method Not Allowed\n")
    for path in ("/readyz", "/livez"):
        assert _get(f"{world.members[0].gateway}{path}")[0] == 404
    status, headers, body = _get(f"{world.members[0].gateway}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "raftgate_proxy_gateway_health_checks_total" in body


def test_a_client_that_discovers_follows_a_member_removed_and_one_added(world: World) -> None:
    client = DiscoveringClient([m.gateway for m in world.members], APP)
    client.refresh()
    assert client.put_get("/service/leader", "before") == "before"
    # remove the first member (the one the client uses first) while the client runs
    gone = world.members[0]
    rc, out, err = etcdctl(world.members[1].grpc, "member", "list", user="root:rootpw", timeout=60)
    assert rc == 0, err
    gone_id = next(line.split(",")[0] for line in out.splitlines() if f", {gone.name}," in line)
    rc, _, err = etcdctl(world.members[1].grpc, "member", "remove", gone_id, user="root:rootpw", timeout=60)
    assert rc == 0, err
    wait_for(lambda: not gone.node.running, WAIT, f"{gone.name} to stop once removed")
    gone.proxy.stop(timeout=10)
    world.members.remove(gone)
    world.cluster.nodes.remove(gone.node)
    # the client's URL in use is gone: it moves on to the next it knows, and learns the new list
    assert client.put_get("/service/leader", "during") == "during"
    assert sorted(m["name"] for m in client.refresh()) == sorted(m.name for m in world.members)
    assert gone.gateway not in client.machines
    # add a member while the client runs: it shows up with its own gateway URL once started
    peer = free_port()
    rc, out, err = etcdctl(world.members[0].grpc, "member", "add", "node4", f"--peer-urls=http://127.0.0.1:{peer}",
                           user="root:rootpw", timeout=60)
    assert rc == 0, err
    initial = re.search(r'ETCD_INITIAL_CLUSTER="([^"]+)"', out)
    assert initial, out
    added = start_member(world, "node4", initial.group(1), peer, "--initial-cluster-state", "existing")

    def listed() -> bool:
        members = {m["name"]: m.get("clientURLs", []) for m in client.refresh()}
        return members.get("node4") == [added.gateway]

    wait_for(listed, WAIT, "the new member's gateway URL in the gateway's member list")
    assert added.gateway in client.machines
    client.machines = [added.gateway]
    assert client.put_get("/service/leader", "after") == "after"
    assert _grpc_member_urls(world)["node4"] == [f"http://{added.grpc}"]


def test_health_is_503_once_the_members_node_has_no_leader(world: World) -> None:
    """As etcd: no leader, 503 and the reason; ``serializable=true`` (this member alive) still 200."""
    survivor, *others = world.members
    for member in others:
        world.cluster.kill(member.node)

    def unhealthy() -> tuple[int, str] | None:
        status, _, body = _get(f"{survivor.gateway}/health")
        return (status, body) if status != 200 else None

    status, body = wait_for(unhealthy, WAIT, "/health to report the lost quorum")  # type: ignore[misc]
    assert status == 503
    answer = json.loads(body)
    assert answer["health"] == "false" and (answer["reason"] == "RAFT NO LEADER"
                                            or answer["reason"].startswith("RANGE ERROR:")), answer
    assert body.endswith("\n")  # Go's http.Error
    wait_for(lambda: _get(f"{survivor.gateway}/health")[2] == '{"health":"false","reason":"RAFT NO LEADER"}\n',
             WAIT, "the survivor to follow no leader")
    assert _get(f"{survivor.gateway}/health?serializable=true")[:3:2] == (200, '{"health":"true","reason":""}')
