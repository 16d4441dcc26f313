"""``GET /health`` without a token sees the cluster's alarms with auth on, as etcd 3.5.1's does.

etcd's checkV3Health reads the member's own alarm list (no user involved): with the NOSPACE alarm
raised, /health answers 503 ``ALARM NOSPACE`` whether auth is on or not, and ``?exclude=NOSPACE``
(any of the ``exclude`` values) lets it pass. Side by side: etcd 3.5.1 on its client URL, and
``raftgate local --gateway-port`` on its gateway and on each member proxy's gateway.

Findings (fail before the fixes): with auth on, raftgate's check read the alarms as an anonymous
client, which the store refuses (Alarm GET needs a user in raftgate), so a cluster refusing every
write for lack of space reported healthy; and only the first 16 ``exclude`` values were read, so
``NOSPACE`` named after 16 others was not excluded.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.processes import BACKENDS, EtcdServer, RaftgateLocal, etcdctl, free_port, new_server

pytestmark = pytest.mark.slow

WAIT = 120.0  # upper bound on a loaded machine, never a timing assertion
NOSPACE = (503, '{"health":"false","reason":"ALARM NOSPACE"}\n')
HEALTHY = (200, '{"health":"true","reason":""}')


@dataclass
class World:
    server: EtcdServer | RaftgateLocal
    #: the URLs that serve /health: etcd's client URL; raftgate's gateway and its member proxies'
    urls: list[str]
    token: str


def _call(url: str, body: dict[str, object] | None = None, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": token} if token else {}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module", params=BACKENDS)
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"health-{kind}")
    gateway_port = free_port()
    server = new_server(kind, tmp, extra_args=[] if kind == "etcd" else
                        ["--gateway-port", str(gateway_port), "--nodes", "1"])
    with server:
        for args in (("user", "add", "root:rootpw"), ("auth", "enable")):
            rc, _, err = etcdctl(server.endpoint, *args, timeout=60)
            assert rc == 0, (args, err)
        if isinstance(server, RaftgateLocal):
            state = server.local_json()
            assert state is not None
            urls = [f"http://127.0.0.1:{gateway_port}"] + [
                f"http://127.0.0.1:{p['gateway_port']}"  # type: ignore[index]
                for p in state["processes"] if p["role"] == "member-proxy"]  # type: ignore[union-attr,index]
        else:
            urls = [server.endpoint]
        status, body = _call(f"{urls[0]}/v3/auth/authenticate", {"name": "root", "password": "rootpw"})
        assert status == 200, body
        yield World(server, urls, json.loads(body)["token"])


def _alarm(world: World, action: str) -> None:
    status, body = _call(f"{world.urls[0]}/v3/maintenance/status", {}, world.token)
    assert status == 200, body
    member = json.loads(body)["header"]["member_id"]
    status, body = _call(f"{world.urls[0]}/v3/maintenance/alarm",
                         {"action": action, "memberID": member, "alarm": "NOSPACE"}, world.token)
    assert status == 200, body


@pytest.fixture
def nospace(world: World) -> Iterator[World]:
    _alarm(world, "ACTIVATE")
    try:
        yield world
    finally:
        _alarm(world, "DEACTIVATE")


def test_health_reports_the_nospace_alarm_with_auth_on(nospace: World) -> None:
    for url in nospace.urls:
        assert _call(f"{url}/health") == NOSPACE, url
        assert _call(f"{url}/health?serializable=true") == NOSPACE, url
        assert _call(f"{url}/health?exclude=NOSPACE") == HEALTHY, url


def test_any_exclude_value_counts(nospace: World) -> None:
    """etcd reads every ``exclude`` value; NOSPACE after sixteen others is still excluded."""
    query = "&".join(["exclude=CORRUPT"] * 16 + ["exclude=NOSPACE"])
    for url in nospace.urls:
        assert _call(f"{url}/health?{query}") == HEALTHY, url


def test_health_is_healthy_again_once_the_alarm_is_disarmed(world: World) -> None:
    for url in world.urls:
        assert _call(f"{url}/health") == HEALTHY, url
