"""The chart's Kubernetes workload identity: auth.workloadIdentity (--oidc-* on every proxy, the user
map as a ConfigMap) and sidecar.identity.serviceAccountToken (the pod's projected token lent by the
sidecar, --identity-oidc-token-file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.app_chart import make_app_chart
from tests.support.chart_support import all_containers, flags, render, validate

RULES = [{"match": "system:serviceaccount:shop:*", "user": "shop"}]
ON = {"enabled": True, "userMap": RULES}


def proxies(r: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(pod, c) for _, pod in r.pod_specs() for c in all_containers(pod) if c.get("args", [""])[0] == "proxy"]


def test_every_proxy_verifies_workload_tokens_with_the_user_map() -> None:
    r = render({"auth": {"workloadIdentity": ON}})
    cm = r.one("ConfigMap", "rg-raftgate-workload-identity")
    validate(cm)
    assert json.loads(cm["data"]["user-map.json"]) == RULES
    found = proxies(r)
    assert {c["name"] for _, c in found} >= {"proxy", "member-proxy"}
    for pod, c in found:
        f = flags(c["args"])
        assert f["--oidc-issuer"] == "https://kubernetes.default.svc.cluster.local"
        assert f["--oidc-audience"] == "raftgate"
        assert f["--oidc-user-map"] == "/etc/raftgate/workload/user-map.json"
        assert f["--oidc-ca-file"] == "/etc/raftgate/workload-keys/ca.crt"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["raftgate-workload"] == "/etc/raftgate/workload"
        assert volumes["raftgate-workload"]["configMap"]["name"] == "rg-raftgate-workload-identity"
        assert volumes["raftgate-workload-keys"]["configMap"]["name"] == "kube-root-ca.crt"
    for _, pod in r.pod_specs():
        assert not any("--identity-oidc-token-file" in str(c.get("args")) for c in all_containers(pod))


def test_keys_from_a_jwks_configmap_instead_of_discovery() -> None:
    r = render({"auth": {"workloadIdentity": {**ON, "jwksConfigMap": "cluster-jwks"}}})
    for pod, c in proxies(r):
        f = flags(c["args"])
        assert f["--oidc-jwks-file"] == "/etc/raftgate/workload-keys/jwks.json" and "--oidc-ca-file" not in f
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["raftgate-workload-keys"]["configMap"]["name"] == "cluster-jwks"


def test_off_by_default() -> None:
    r = render({})
    assert r.find("ConfigMap", "rg-raftgate-workload-identity") is None
    assert not any("--oidc-issuer" in flags(c["args"]) for _, c in proxies(r))


def test_sidecar_lends_the_pods_projected_token(tmp_path: Path) -> None:
    app = make_app_chart(tmp_path)
    values = {"raftgate": {
        "auth": {"workloadIdentity": ON},
        "sidecar": {"identity": {"serviceAccountToken": {"enabled": True}}},
    }}
    r = render(values, chart=app, release="shop", namespace="apps")
    cm = r.one("ConfigMap", "shop-raftgate-workload-identity")  # in the application's namespace
    assert cm["metadata"]["namespace"] == "apps"
    deployment = r.one("Deployment", "shop-app")
    validate(deployment)
    pod = deployment["spec"]["template"]
    (sidecar,) = pod["spec"]["initContainers"]
    f = flags(sidecar["args"])
    assert f["--identity-oidc-token-file"] == "/var/run/secrets/raftgate/token"
    assert f["--oidc-user-map"] == "/etc/raftgate/workload/user-map.json"
    assert "--identity-jwt-file" not in f
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (sa,) = volumes["raftgate-sa-token"]["projected"]["sources"]
    assert sa["serviceAccountToken"] == {"audience": "raftgate", "expirationSeconds": 600, "path": "token"}
    assert volumes["raftgate-workload"]["configMap"]["name"] == "shop-raftgate-workload-identity"
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert mounts["raftgate-sa-token"] == "/var/run/secrets/raftgate"


@pytest.mark.parametrize(("values", "message"), [
    ({"sidecar": {"identity": {"serviceAccountToken": {"enabled": True}}}}, "needs auth.workloadIdentity"),
    ({"auth": {"workloadIdentity": ON},
      "sidecar": {"identity": {"serviceAccountToken": {"enabled": True, "audience": "etcd"}}}}, "must equal"),
    ({"auth": {"workloadIdentity": ON},
      "sidecar": {"identity": {"existingSecret": "x", "serviceAccountToken": {"enabled": True}}}},
     "mutually exclusive"),
])
def test_inconsistent_values_fail_to_render(tmp_path: Path, values: dict[str, Any], message: str) -> None:
    app = make_app_chart(tmp_path)
    with pytest.raises(Exception, match=message):
        render({"raftgate": values}, chart=app, release="shop", namespace="apps")


@pytest.mark.parametrize("jwks", ["", "cluster-jwks"])
def test_the_store_verifies_workload_tokens_sidecars_forward(jwks: str) -> None:
    """A sidecar cannot verify a workload token (it may not ask the store which users exist): the
    store does, with the proxies' issuer, keys and user map."""
    r = render({"auth": {"workloadIdentity": {**ON, "jwksConfigMap": jwks}}})
    sts = r.one("StatefulSet", "rg-raftgate-store")
    validate(sts)
    pod = sts["spec"]["template"]
    (store,) = [c for c in all_containers(pod) if c.get("args", [""])[0] == "store"]
    f = flags(store["args"])
    assert f["--oidc-issuer"] == "https://kubernetes.default.svc.cluster.local"
    assert f["--oidc-audience"] == "raftgate"
    assert f["--oidc-user-map"] == "/etc/raftgate/workload/user-map.json"
    keys = "--oidc-jwks-file" if jwks else "--oidc-ca-file"
    assert f[keys] == "/etc/raftgate/workload-keys/" + ("jwks.json" if jwks else "ca.crt")
    mounts = {m["name"]: m["mountPath"] for m in store["volumeMounts"]}
    assert mounts["raftgate-workload"] == "/etc/raftgate/workload"
    assert mounts["raftgate-workload-keys"] == "/etc/raftgate/workload-keys"
    off = render({})
    (plain,) = [c for c in all_containers(off.one("StatefulSet", "rg-raftgate-store")["spec"]["template"])
                if c.get("args", [""])[0] == "store"]
    assert "--oidc-issuer" not in flags(plain["args"])
