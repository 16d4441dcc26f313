"""The chart's JSON gateway (``gateway.enabled``): the standalone proxies and every member proxy
serve it, each store pod advertises its own member proxy's gateway (so the gateway's member list
names gateways: tests/gateway/test_gateway_discovery.py), the client Service and the
NetworkPolicies carry its port, and its Host whitelist holds the names clients use. Off by
default; refused with an https client port, since the gateway serves plain HTTP.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from proxy.gateway_access import Access, parse_hosts
from tests.support.chart_support import NAMESPACE, container_port, flags, lint, render, validate

FULLNAME = "rg-raftgate"
STORE = f"{FULLNAME}-store"
HEADLESS = f"{FULLNAME}-store-headless"
DOMAIN = "cluster.local"
GATEWAY: dict[str, Any] = {"gateway": {"enabled": True, "extraHosts": ["etcd.example.com"]}}


def _containers(r: Any, kind: str, name: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in r.one(kind, name)["spec"]["template"]["spec"]["containers"]}


def test_the_gateway_is_off_by_default() -> None:
    r = render({})
    for kind, name in (("StatefulSet", STORE), ("Deployment", f"{FULLNAME}-proxy")):
        for c in _containers(r, kind, name).values():
            assert not any(a.startswith(("--listen-gateway-urls", "--advertise-gateway-urls")) for a in c["args"])
    assert [p["name"] for p in r.one("Service", FULLNAME)["spec"]["ports"]] == ["client", "metrics"]


def test_every_proxy_serves_the_gateway_and_each_store_pod_advertises_its_own() -> None:
    r = render(GATEWAY)
    for doc in r.docs:
        validate(doc)
    assert lint(GATEWAY)["errors"] == []
    pod = f"$(POD_NAME).{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}"
    store = _containers(r, "StatefulSet", STORE)
    assert flags(store["store"]["args"])["--advertise-gateway-urls"] == f"http://{pod}:8080"
    member = store["member-proxy"]
    f = flags(member["args"])
    assert f["--listen-gateway-urls"] == "http://0.0.0.0:8080"
    assert container_port(member, "rg-gateway") == 8080
    assert pod in f["--host-whitelist"].split(",")
    env = {e["name"]: e for e in member["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # $(POD_NAME) expands

    proxy = _containers(r, "Deployment", f"{FULLNAME}-proxy")["proxy"]
    f = flags(proxy["args"])
    assert f["--listen-gateway-urls"] == "http://0.0.0.0:8080"
    assert container_port(proxy, "gateway") == 8080
    service_names = {FULLNAME, f"{FULLNAME}.{NAMESPACE}", f"{FULLNAME}.{NAMESPACE}.svc",
                     f"{FULLNAME}.{NAMESPACE}.svc.{DOMAIN}", "etcd.example.com", "localhost"}
    assert service_names <= set(f["--host-whitelist"].split(","))

    ports = {p["name"]: p for p in r.one("Service", FULLNAME)["spec"]["ports"]}
    assert (ports["gateway"]["port"], ports["gateway"]["targetPort"]) == (8080, "gateway")
    for policy in r.all("NetworkPolicy"):
        admitted = {p["port"] for rule in policy["spec"].get("ingress", []) for p in rule.get("ports", [])}
        if 2379 in admitted:  # the policies of pods with a client port admit the gateway's too
            assert 8080 in admitted, policy["metadata"]["name"]


def test_the_gateway_port_follows_ports_gateway() -> None:
    r = render({**GATEWAY, "ports": {"gateway": 8480}})
    store = _containers(r, "StatefulSet", STORE)
    assert flags(store["store"]["args"])["--advertise-gateway-urls"].endswith(":8480")
    assert flags(store["member-proxy"]["args"])["--listen-gateway-urls"] == "http://0.0.0.0:8480"


def test_the_gateway_is_refused_with_an_https_client_port() -> None:
    with pytest.raises(helm.HelmError, match="gateway.enabled"):
        render({**GATEWAY, "auth": {"client": {"secureTransport": True}}})


@pytest.mark.parametrize("pod_ip", ["10.1.2.3", "fd00::5"])
def test_a_probe_or_scrape_by_pod_address_is_answered(pod_ip: str) -> None:
    """A kubelet httpGet probe of /health (and a scrape of /metrics by pod address) sends ``Host:
    <pod IP>:<port>``: each gateway's --host-whitelist holds the pod's own address (an address is
    no name a rebinding page controls). Before the fix: 421 on every proxy's gateway."""
    r = render(GATEWAY)
    store = _containers(r, "StatefulSet", STORE)
    proxy = _containers(r, "Deployment", f"{FULLNAME}-proxy")["proxy"]
    host = f"[{pod_ip}]:8080" if ":" in pod_ip else f"{pod_ip}:8080"
    for container in (store["member-proxy"], proxy):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", container["name"]
        whitelist = flags(container["args"])["--host-whitelist"].replace("$(POD_IP)", pod_ip)
        assert Access(hosts=parse_hosts(whitelist)).host_allowed(host), (container["name"], whitelist)
    member_env = {e["name"] for e in store["member-proxy"]["env"]}
    assert "POD_NAME" in member_env  # the member proxy's advertised name still expands
