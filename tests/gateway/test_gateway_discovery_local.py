"""`raftgate local --gateway-port` serves what discovery finds, side by side with a real etcd.

The same steps an HTTP client that discovers takes (tests/support/discovering_client.py: Patroni's
etcd3 DCS) against etcd 3.5.1 and against `raftgate local`, both with auth on: authenticate on the
seed URL, member/list, then a put and a get through etcd3gw on every clientURL found. On etcd the
client URL serves the gateway; on raftgate each member proxy serves one on a port of its own, which
its node advertises.

Finding: `raftgate local --gateway-port` listed its members' gRPC-only URLs on the gateway (failed
before the fix).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.discovering_client import DiscoveringClient
from tests.support.processes import BACKENDS, EtcdServer, RaftgateLocal, etcdctl, free_port, new_server

pytestmark = pytest.mark.slow

USER = ("app", "apppw")


@pytest.fixture(scope="module", params=BACKENDS)
def seed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """(the gateway URL a client is configured with, the server), auth on, user app on /service/."""
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"discovery-{kind}")
    gateway_port = free_port()
    server = new_server(kind, tmp, extra_args=[] if kind == "etcd" else ["--gateway-port", str(gateway_port)])
    with server:
        ep = server.endpoint
        for args in (("user", "add", "root:rootpw"), ("user", "add", "app:apppw"), ("role", "add", "app"),
                     ("role", "grant-permission", "app", "readwrite", "/service/", "--prefix"),
                     ("user", "grant-role", "app", "app"), ("auth", "enable")):
            rc, _, err = etcdctl(ep, *args, timeout=60)
            assert rc == 0, (args, err)
        url = ep if isinstance(server, EtcdServer) else f"http://127.0.0.1:{gateway_port}"
        yield url, server


def test_discovery_finds_urls_that_serve_the_gateway(seed: tuple[str, object]) -> None:
    url, server = seed
    client = DiscoveringClient([url], USER)
    members = client.refresh()
    if isinstance(server, RaftgateLocal):
        state = server.local_json()
        assert state is not None
        gateways = {p["member"]: f"http://127.0.0.1:{p['gateway_port']}"  # type: ignore[index]
                    for p in state["processes"] if p["role"] == "member-proxy"}  # type: ignore[union-attr,index]
        assert {m["name"]: m["clientURLs"] for m in members} == {name: [u] for name, u in gateways.items()}
        assert len(members) == 3
    for found in list(client.machines):
        client.machines = [found]
        assert client.put_get("/service/patroni/leader", found) == found
        # and the member's /version, as etcd3gw asks it to find the API path
        with urllib.request.urlopen(f"{found}/version", timeout=60) as answer:
            assert set(json.loads(answer.read())) == {"etcdserver", "etcdcluster"}


def test_a_restarted_local_keeps_its_member_gateways(seed: tuple[str, object]) -> None:
    """The member gateways' ports are kept in layout.json: the URLs a client found stay valid."""
    url, server = seed
    if not isinstance(server, RaftgateLocal):
        pytest.skip("raftgate local only")
    before = sorted(DiscoveringClient([url], USER).refresh(), key=lambda m: m["name"])
    server.restart()
    client = DiscoveringClient([url], USER)
    after = sorted(client.refresh(), key=lambda m: m["name"])
    assert [m["clientURLs"] for m in after] == [m["clientURLs"] for m in before]
    assert client.put_get("/service/patroni/leader", "again") == "again"
