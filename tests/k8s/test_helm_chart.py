"""The Helm chart, rendered by Helm v4's engine for the default values and several combinations:
helm lint reports no errors, every manifest validates against Kubernetes 1.34 (CRD kinds against
their CRD fields), and the wiring holds — peer URLs, store endpoints, Secrets behind every file
flag, ports, probes, selectors, NetworkPolicy and the sidecar helper an application chart includes.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.app_chart import make_app_chart
from tests.support.chart_support import (
    CHART_DIR,
    NAMESPACE,
    Rendered,
    addr_port,
    all_containers,
    container_port,
    flags,
    lint,
    render,
    selects,
    url_port,
    validate,
)

FULLNAME = "rg-raftgate"
STORE = f"{FULLNAME}-store"
HEADLESS = f"{FULLNAME}-store-headless"
DOMAIN = "cluster.local"

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "jwt": {"auth": {"token": {"type": "jwt"}}},
    "jwt-existing-secret": {
        "auth": {
            "token": {
                "type": "jwt",
                "signMethod": "ES256",
                "privateKey": {"existingSecret": "my-jwt", "filename": "jwt.key"},
                "publicKey": {"filename": "jwt.pub"},
            }
        }
    },
    "existing-secrets": {
        "auth": {"rbac": {"existingSecret": "my-root", "existingSecretPasswordKey": "password"}},
        "tls": {
            "provider": "existingSecret",
            "existingSecret": {"internal": "s-int", "proxy": "s-proxy", "sidecar": "s-sidecar", "peer": "s-peer"},
        },
    },
    "cert-manager": {"tls": {"provider": "certManager"}},
    "gateway": {"gateway": {"enabled": True, "extraHosts": ["etcd.example.com"]}},
    "cert-manager-cluster-issuer": {
        "tls": {"provider": "certManager", "certManager": {
            "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
            "peerIssuerRef": {"name": "corp-peer-ca", "kind": "ClusterIssuer"},
            "sidecarIssuerRef": {"name": "corp-sidecar-ca", "kind": "ClusterIssuer"}}}
    },
    "client-crl": {"tls": {"provider": "certManager"},
                   "auth": {"client": {"secureTransport": True, "enableAuthentication": True,
                                       "crl": {"existingSecret": "client-crl", "key": "crl.pem"}}}},
    "five-replicas": {"replicaCount": 5},
    "one-replica": {"replicaCount": 1, "pdb": {"create": False}, "proxy": {"replicaCount": 1}},
    "metrics-servicemonitor": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}, "scrapeTimeout": "10s"}}
    },
    "networkpolicy-off": {"networkPolicy": {"enabled": False}},
    "networkpolicy-strict": {
        "networkPolicy": {
            "allowExternal": False,
            "proxyNamespaceSelector": {"matchLabels": {"raftgate.io/clients": "true"}},
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
        }
    },
    "dev-shared-secret": {"tls": {"enabled": False}},
    "no-standalone-proxy": {"proxy": {"enabled": False}},
    "no-persistence-hard-affinity": {
        "persistence": {"enabled": False},
        "store": {"podAntiAffinityPreset": "hard"},
        "proxy": {"podAntiAffinityPreset": ""},
    },
    "rbac-off": {"auth": {"rbac": {"create": False}}},
    "lockout-off": {"auth": {"lockout": {"attempts": 0, "duration": "1h30m"}}},
    "everything": {
        "replicaCount": 7,
        "auth": {"token": {"type": "jwt", "signMethod": "PS256"}, "rbac": {"rootPassword": "s3cret"}},
        "tls": {"provider": "certManager"},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "image": {"registry": "registry.example", "digest": "sha256:" + "a" * 64, "pullSecrets": ["regcred"]},
        "commonLabels": {"team": "db"},
        "commonAnnotations": {"owner": "db-team"},
        "persistence": {"storageClass": "fast", "size": "20Gi"},
    },
}

_cache: dict[str, Rendered] = {}


def rendered(name: str) -> Rendered:
    if name not in _cache:
        _cache[name] = render(SCENARIOS[name])
    return _cache[name]


def merged(name: str) -> dict[str, Any]:
    with helm.Chart.load(str(CHART_DIR)) as c:
        return c.merge_values(SCENARIOS[name])


# ---------------------------------------------------------------------------------------------
# Lint and schema validation


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_reports_no_errors_or_warnings(scenario: str) -> None:
    report = lint(SCENARIOS[scenario])
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == [], problems


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_manifest_validates_against_kubernetes(scenario: str) -> None:
    r = rendered(scenario)
    assert r.docs, "nothing rendered"
    for doc in r.docs:
        validate(doc)  # raises on an unknown kind, too
    names = [(d["kind"], d["metadata"]["name"]) for d in r.docs]
    assert len(names) == len(set(names)), f"duplicate resources: {names}"
    for doc in r.docs:
        assert doc["metadata"].get("namespace") in (NAMESPACE, None), doc["metadata"]
        assert len(doc["metadata"]["name"]) <= 63


@pytest.mark.parametrize("count", [2, 4, 6])
def test_even_replica_count_fails_with_a_clear_message(count: int) -> None:
    with pytest.raises(helm.HelmError, match=rf"replicaCount must be odd \(1, 3, 5 or 7\), got {count}"):
        render({"replicaCount": count})


@pytest.mark.parametrize("count", [0, 9, "three"])
def test_replica_count_out_of_range_is_refused_by_the_schema(count: object) -> None:
    with pytest.raises(helm.HelmError, match="replicaCount"):
        render({"replicaCount": count})


def test_bad_combinations_fail_with_a_message() -> None:
    with pytest.raises(helm.HelmError, match=r"tls.existingSecret.peer"):
        render({"tls": {"provider": "existingSecret",
                        "existingSecret": {"internal": "a", "proxy": "b", "sidecar": "c"}}})
    with pytest.raises(helm.HelmError, match=r"tls.existingSecret.sidecar"):
        render({"tls": {"provider": "existingSecret", "existingSecret": {"internal": "a", "proxy": "b", "peer": "c"}}})
    with pytest.raises(helm.HelmError, match=r"tls.certManager.sidecarIssuerRef.name"):
        render({"tls": {"provider": "certManager", "certManager": {"issuerRef": {"name": "corp-ca"}}}})
    with pytest.raises(helm.HelmError, match=r"signMethod=ES256 needs auth.token.privateKey.existingSecret"):
        render({"auth": {"token": {"type": "jwt", "signMethod": "ES256"}}})
    with pytest.raises(helm.HelmError, match="type"):
        render({"auth": {"token": {"type": "oauth"}}})


# ---------------------------------------------------------------------------------------------
# The store: StatefulSet, headless Service, peer URLs


def store_container(r: Rendered) -> dict[str, Any]:
    sts = r.one("StatefulSet", STORE)
    # the store, and its member proxy (the pod's advertised client URL)
    assert [c["name"] for c in sts["spec"]["template"]["spec"]["containers"]] == ["store", "member-proxy"]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "store"
    return container


@pytest.mark.parametrize("scenario", ["default", "five-replicas", "one-replica", "dev-shared-secret", "everything"])
def test_initial_cluster_matches_the_headless_service_dns_names(scenario: str) -> None:
    r = rendered(scenario)
    values = merged(scenario)
    replicas = values["replicaCount"]
    scheme = "https" if values["tls"]["enabled"] else "http"
    sts = r.one("StatefulSet", STORE)
    assert sts["spec"]["replicas"] == replicas
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    headless = r.one("Service", sts["spec"]["serviceName"])
    assert headless["metadata"]["name"] == HEADLESS
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert selects(headless["spec"]["selector"], pod_labels)
    assert selects(sts["spec"]["selector"]["matchLabels"], pod_labels)

    c = store_container(r)
    f = flags(c["args"])
    peer_port = container_port(c, "peer")
    svc_ports = {p["name"]: p for p in headless["spec"]["ports"]}
    assert svc_ports["peer"]["port"] == peer_port and svc_ports["peer"]["targetPort"] == "peer"

    # --initial-cluster: name=URL for each pod 0..n-1, URL = <pod>.<headless>.<ns>.svc.<domain>:<peer>
    members = dict(m.split("=", 1) for m in f["--initial-cluster"].split(","))
    expected = {
        f"{STORE}-{i}": f"{scheme}://{STORE}-{i}.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}:{peer_port}"
        for i in range(replicas)
    }
    assert members == expected
    # Each pod's own name and advertised URL (after Kubernetes expands $(POD_NAME)) are its member entry.
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for pod, url in expected.items():
        assert f["--name"].replace("$(POD_NAME)", pod) == pod
        assert f["--initial-advertise-peer-urls"].replace("$(POD_NAME)", pod) == url
    assert f["--listen-peer-urls"] == f"{scheme}://0.0.0.0:{peer_port}"
    assert f["--listen-internal-urls"] == f"{scheme}://0.0.0.0:{container_port(c, 'internal')}"
    assert f["--initial-cluster-state"] == "new"
    assert f["--initial-cluster-token"]
    # each pod's member proxy, so `etcdctl endpoint status --cluster` reaches every member
    member = r.one("StatefulSet", STORE)["spec"]["template"]["spec"]["containers"][1]
    assert f["--advertise-client-urls"] == f"http://$(POD_NAME).{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}:2379"
    assert url_port(flags(member["args"])["--listen-client-urls"]) == container_port(member, "client") == 2379
    assert flags(member["args"])["--member-store-endpoint"] == f"localhost:{container_port(c, 'internal')}"


def test_store_pod_shape() -> None:
    r = rendered("default")
    sts = r.one("StatefulSet", STORE)
    pod = sts["spec"]["template"]["spec"]
    c = store_container(r)
    f = flags(c["args"])
    # Probes: gRPC health on the plaintext health port, the same port --health-addr binds.
    health = container_port(c, "health")
    assert addr_port(f["--health-addr"]) == health
    assert addr_port(f["--metrics-addr"]) == container_port(c, "metrics")
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"] == {"port": health}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    # Data on the PVC of each pod, sized by persistence.size.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert f["--data-dir"].startswith(mounts["data"]["mountPath"] + "/")
    assert not mounts["data"].get("readOnly")
    # Anti-affinity, preferred by default, on the store pods' own labels.
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(
        term["podAffinityTerm"]["labelSelector"]["matchLabels"], sts["spec"]["template"]["metadata"]["labels"]
    )
    # PodDisruptionBudget: one member at a time.
    pdb = r.one("PodDisruptionBudget", STORE)
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], sts["spec"]["template"]["metadata"]["labels"])


def test_persistence_size_and_class_and_hard_affinity() -> None:
    sts = rendered("everything").one("StatefulSet", STORE)
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    r = rendered("no-persistence-hard-affinity")
    sts = r.one("StatefulSet", STORE)
    assert "volumeClaimTemplates" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["data"]
    assert sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert "affinity" not in r.one("Deployment")["spec"]["template"]["spec"]
    assert not rendered("one-replica").all("PodDisruptionBudget")


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_container_is_locked_down(scenario: str) -> None:
    for workload, pod in rendered(scenario).pod_specs():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in all_containers(pod):
            sc = c["securityContext"]
            where = f"{workload['kind']}/{workload['metadata']['name']}/{c['name']}"
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert c["resources"]["requests"], where
            # A read-only root needs a writable /tmp for the proxy and store containers.
            if c["args"][0] in ("store", "proxy"):
                assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"]), where


def test_every_store_node_gets_the_lockout_policy() -> None:
    """Lockout is decided by the store: auth.lockout becomes its flags (the same on every node)."""
    assert [flags(store_container(rendered(name))["args"])[f"--auth-lockout-{what}"]
            for name in ("default", "lockout-off") for what in ("attempts", "duration")] == ["5", "15m", "0", "1h30m"]


# ---------------------------------------------------------------------------------------------
# Proxies: standalone Deployment, bootstrap Job's sidecar


def proxy_containers(r: Rendered) -> list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(workload, pod template, container) for every container running `raftgate proxy`."""
    out = []
    for workload, pod in r.pod_specs():
        for c in all_containers(pod):
            if c["args"][0] == "proxy":
                out.append((workload, pod, c))
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_proxies_seed_from_the_headless_service_and_learn_each_pod(scenario: str) -> None:
    r = rendered(scenario)
    values = merged(scenario)
    proxies = proxy_containers(r)
    expected_kinds = {"StatefulSet", "Deployment"} if values["proxy"]["enabled"] else {"StatefulSet"}
    if values["auth"]["rbac"]["create"]:
        expected_kinds.add("Job")
    assert {w["kind"] for w, _, _ in proxies} == expected_kinds
    if not proxies:
        return
    store = store_container(r)
    internal = container_port(store, "internal")
    headless = r.one("Service", HEADLESS)
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["internal"] == internal
    sts = r.one("StatefulSet", STORE)
    # The seed is the headless Service (every store pod); each pod advertises its own name, which
    # the proxies learn from the member list and follow.
    domain = f"{sts['spec']['serviceName']}.{NAMESPACE}.svc.{DOMAIN}"
    store_flags = flags(store["args"])
    scheme = store_flags["--listen-internal-urls"].split("://")[0]
    assert store_flags["--advertise-internal-urls"] == f"{scheme}://$(POD_NAME).{domain}:{internal}"
    for _, _, c in proxies:
        f = flags(c["args"])
        assert f["--store-endpoints"] == f"{domain}:{internal}"
        # Both sides agree on the transport.
        if store_flags["--listen-internal-urls"].startswith("https://"):
            assert {"--internal-cert", "--internal-key", "--internal-ca"} <= f.keys()
            assert "--internal-secret-file" not in f
        else:
            assert "--internal-secret-file" in f and "--internal-cert" not in f


def test_scaling_the_store_leaves_every_proxy_pod_unchanged() -> None:
    """The proxies follow the member list, so a new replicaCount (after `etcdctl member add` /
    `member remove`) renders the same proxy pods: scaling up or down restarts no proxy."""
    three, five = rendered("default"), rendered("five-replicas")
    assert three.one("StatefulSet", STORE)["spec"]["replicas"] == 3
    assert five.one("StatefulSet", STORE)["spec"]["replicas"] == 5
    for kind, name in (("Deployment", f"{FULLNAME}-proxy"),):
        assert three.one(kind, name)["spec"]["template"] == five.one(kind, name)["spec"]["template"]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_service_ports_agree_with_container_ports_and_probes(scenario: str) -> None:
    r = rendered(scenario)
    workloads = list(r.pod_specs())
    for svc in r.all("Service"):
        targets = [
            (w, pod)
            for w, pod in workloads
            if w["kind"] != "Job" and selects(svc["spec"]["selector"], pod["metadata"]["labels"])
        ]
        assert len(targets) == 1, f"Service {svc['metadata']['name']} selects {len(targets)} workloads"
        _, pod = targets[0]
        c = pod["spec"]["containers"][0]  # the store or the proxy (a store pod's member proxy is second)
        for port in svc["spec"]["ports"]:
            assert container_port(c, port["targetPort"]) == port["port"], (svc["metadata"]["name"], port)
    for w, _pod, c in proxy_containers(r):
        f = flags(c["args"])
        prefix = "rg-" if w["kind"] in ("Job", "StatefulSet") else ""
        health = container_port(c, f"{prefix}health")
        assert addr_port(f["--health-addr"]) == health
        assert addr_port(f["--metrics-addr"]) == container_port(c, f"{prefix}metrics")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in c:
                assert c[probe]["grpc"] == {"port": health}
        if w["kind"] in ("Deployment", "StatefulSet"):
            assert url_port(f["--listen-client-urls"]) == container_port(c, "client")
    if r.find("Service", FULLNAME):
        client = r.one("Service", FULLNAME)
        assert {p["name"]: p["port"] for p in client["spec"]["ports"]}["client"] == 2379


def test_bootstrap_job_runs_its_own_proxy_as_a_native_sidecar() -> None:
    r = rendered("default")
    job = r.one("Job", f"{FULLNAME}-bootstrap-auth")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    pod = job["spec"]["template"]
    (sidecar,) = pod["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert "startupProbe" in sidecar
    (main,) = pod["spec"]["containers"]
    f = flags(main["args"])
    assert main["args"][0] == "bootstrap-auth"
    listen = flags(sidecar["args"])["--listen-client-urls"]
    assert listen == f"http://{f['--endpoints']}"
    assert f["--endpoints"].startswith("127.0.0.1:")
    assert int(f["--timeout"]) > 0


# ---------------------------------------------------------------------------------------------
# Secrets behind every file flag


FILE_FLAGS = {
    "--cert-file", "--key-file", "--trusted-ca-file", "--peer-cert-file", "--peer-key-file", "--peer-trusted-ca-file",
    "--internal-secret-file", "--peer-secret-file", "--internal-cert", "--internal-key", "--internal-ca",
    "--identity-file", "--identity-jwt-file", "--identity-oidc-token-file", "--root-password-file",
    "--initial-root-password-file",
    "--sidecar-trusted-ca-file", "--sidecar-secret-file",
}  # fmt: skip


def file_args(c: dict[str, Any]) -> dict[str, str]:
    f = flags(c["args"])
    out = {k: v for k, v in f.items() if k in FILE_FLAGS}
    token = f.get("--auth-token", "")
    if token.startswith("jwt"):
        for opt in token.split(",")[1:]:
            key, _, value = opt.partition("=")
            if key in ("priv-key", "pub-key"):
                out[f"--auth-token {key}"] = value
    return out


def source_of(pod: dict[str, Any], c: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """The volume a file path is read from and the file's key inside it ("" for the whole volume)."""
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    whole = [m for m in c["volumeMounts"] if m["mountPath"].rstrip("/") == path.rstrip("/")]
    if whole:  # a directory flag (--identity-file): the Secret volume itself
        return volumes[whole[0]["name"]], ""
    mounts = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{c['name']}: nothing is mounted where {path} is read"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    rel = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    assert "/" not in rel, path
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert mount["name"] in volumes, f"volume {mount['name']} is mounted but not defined"
    volume = volumes[mount["name"]]
    key = rel
    if "secret" in volume and volume["secret"].get("items"):
        by_path = {i["path"]: i["key"] for i in volume["secret"]["items"]}
        assert rel in by_path, f"{path}: the Secret volume projects only {sorted(by_path)}"
        key = by_path[rel]
    return volume, key


def secret_keys(r: Rendered, name: str) -> set[str] | None:
    """Keys of a Secret the release creates (rendered or via cert-manager), or None if it comes from outside."""
    secret = r.find("Secret", name)
    if secret is not None:
        return set(secret.get("data", {})) | set(secret.get("stringData", {}))
    for cert in r.all("Certificate"):
        if cert["spec"]["secretName"] == name:
            return {"tls.crt", "tls.key", "ca.crt"}
    return None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_secrets_are_mounted_where_the_flags_read_them(scenario: str) -> None:
    r = rendered(scenario)
    values = merged(scenario)
    external = {
        values["auth"]["rbac"]["existingSecret"]: {values["auth"]["rbac"]["existingSecretPasswordKey"]},
        values["auth"]["token"]["privateKey"]["existingSecret"]: {
            values["auth"]["token"]["privateKey"]["filename"],
            values["auth"]["token"]["publicKey"]["filename"],
        },
        **{name: {"tls.crt", "tls.key", "ca.crt"} for name in values["tls"]["existingSecret"].values()},
        values["auth"]["client"]["crl"]["existingSecret"]: {values["auth"]["client"]["crl"]["key"]},
    }
    external.pop("", None)
    checked = 0
    for _, pod in r.pod_specs():
        for c in all_containers(pod):
            for flag, path in file_args(c).items():
                volume, key = source_of(pod, c, path)
                if "projected" in volume:
                    (source,) = volume["projected"]["sources"]
                    assert source["serviceAccountToken"]["path"] == key
                    continue
                name = volume["secret"]["secretName"]
                if key == "":  # the whole Secret as a directory: only --identity-file reads one
                    assert flag == "--identity-file", flag
                    continue
                keys = secret_keys(r, name)
                if keys is None:
                    assert name in external, f"{flag}: Secret {name} is neither created nor configured"
                    keys = external[name]
                assert key in keys, f"{c['name']} {flag}={path}: Secret {name} has no key {key} ({sorted(keys)})"
                checked += 1
    assert checked >= 3


def _pem_certs(r: Rendered, name: str) -> dict[str, Any]:
    data = r.one("Secret", name)["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


def test_generated_tls_two_cas_and_the_right_names() -> None:
    r = rendered("default")
    ca = _pem_certs(r, f"{FULLNAME}-tls-ca")
    internal_ca = x509.load_pem_x509_certificate(ca["internal-ca.crt"])
    peer_ca = x509.load_pem_x509_certificate(ca["peer-ca.crt"])
    assert internal_ca.subject != peer_ca.subject
    leaves = {role: _pem_certs(r, f"{FULLNAME}-{role}-tls") for role in ("internal", "proxy", "peer")}
    assert r.one("Secret", f"{FULLNAME}-internal-tls")["type"] == "kubernetes.io/tls"
    for role, issuer in (("internal", internal_ca), ("proxy", internal_ca), ("peer", peer_ca)):
        cert = x509.load_pem_x509_certificate(leaves[role]["tls.crt"])
        cert.verify_directly_issued_by(issuer)
        assert leaves[role]["ca.crt"] == (ca["internal-ca.crt"] if issuer is internal_ca else ca["peer-ca.crt"])
        key = serialization.load_pem_private_key(leaves[role]["tls.key"], None)
        assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    # The proxies' client certificate is worthless on the peer port: another CA signed it.
    proxy_cert = x509.load_pem_x509_certificate(leaves["proxy"]["tls.crt"])
    with pytest.raises(Exception):  # noqa: B017 - any verification failure
        proxy_cert.verify_directly_issued_by(peer_ca)
    # Store certificates cover every pod's DNS name (wildcard over the headless Service).
    for role in ("internal", "peer"):
        cert = x509.load_pem_x509_certificate(leaves[role]["tls.crt"])
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
        assert f"*.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}" in sans
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert x509.ExtendedKeyUsageOID.SERVER_AUTH in usages and x509.ExtendedKeyUsageOID.CLIENT_AUTH in usages
    # The CA is kept on uninstall, so the next install re-issues leaves from the same CA.
    assert r.one("Secret", f"{FULLNAME}-tls-ca")["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_cert_manager_issues_from_two_cas_or_the_given_issuer() -> None:
    r = rendered("cert-manager")
    certs = {c["metadata"]["name"]: c["spec"] for c in r.all("Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.all("Issuer")}
    assert certs[f"{FULLNAME}-internal"]["issuerRef"]["name"] == certs[f"{FULLNAME}-proxy"]["issuerRef"]["name"]
    assert certs[f"{FULLNAME}-internal"]["issuerRef"]["name"] != certs[f"{FULLNAME}-peer"]["issuerRef"]["name"]
    # sidecars' certificates come from a CA of their own (the store tells the classes apart by it)
    assert certs[f"{FULLNAME}-sidecar"]["issuerRef"]["name"] not in {
        certs[f"{FULLNAME}-proxy"]["issuerRef"]["name"], certs[f"{FULLNAME}-peer"]["issuerRef"]["name"]}
    for spec in certs.values():
        issuer = spec["issuerRef"]["name"]
        assert issuer in issuers
        if "ca" in issuers[issuer]:
            assert issuers[issuer]["ca"]["secretName"] in {c["secretName"] for c in certs.values() if c.get("isCA")}
    assert f"*.{HEADLESS}.{NAMESPACE}.svc.{DOMAIN}" in certs[f"{FULLNAME}-peer"]["dnsNames"]
    assert "client auth" in certs[f"{FULLNAME}-proxy"]["usages"]
    assert {"server auth", "client auth"} <= set(certs[f"{FULLNAME}-peer"]["usages"])
    assert not r.all("Secret") or all(s["metadata"]["name"].endswith("-auth") for s in r.all("Secret"))

    r = rendered("cert-manager-cluster-issuer")
    assert not r.all("Issuer")
    own = {f"{FULLNAME}-sidecar": "corp-sidecar-ca", f"{FULLNAME}-peer": "corp-peer-ca"}
    for cert in r.all("Certificate"):
        name = own.get(cert["metadata"]["name"], "corp-ca")
        assert cert["spec"]["issuerRef"] == {"name": name, "kind": "ClusterIssuer", "group": "cert-manager.io"}


def test_jwt_key_is_generated_as_rsa_and_wired_into_auth_token() -> None:
    r = rendered("jwt")
    data = r.one("Secret", f"{FULLNAME}-jwt")["data"]
    key = serialization.load_pem_private_key(base64.b64decode(data["jwt-token.pem"]), None)
    assert isinstance(key, rsa.RSAPrivateKey)
    (_, _, c) = next(p for p in proxy_containers(r) if p[0]["kind"] == "Deployment")
    assert flags(c["args"])["--auth-token"] == "jwt,priv-key=/etc/raftgate/jwt/jwt-token.pem,sign-method=RS256,ttl=10m"
    r = rendered("jwt-existing-secret")
    assert not r.find("Secret", f"{FULLNAME}-jwt")
    (_, pod, c) = next(p for p in proxy_containers(r) if p[0]["kind"] == "Deployment")
    token = flags(c["args"])["--auth-token"]
    assert token == "jwt,pub-key=/etc/raftgate/jwt/jwt.pub,priv-key=/etc/raftgate/jwt/jwt.key,sign-method=ES256,ttl=10m"
    assert {v["name"]: v for v in pod["spec"]["volumes"]}["raftgate-jwt"]["secret"]["secretName"] == "my-jwt"
    assert flags(c["args"])["--auth-token-ttl"] == "300"


def test_root_password_generated_or_given() -> None:
    generated = base64.b64decode(rendered("default").one("Secret", f"{FULLNAME}-auth")["data"]["root-password"])
    assert len(generated) == 20 and generated.isalnum()
    given = rendered("everything").one("Secret", f"{FULLNAME}-auth")["data"]["root-password"]
    assert base64.b64decode(given) == b"s3cret"
    r = rendered("existing-secrets")
    assert not r.find("Secret", f"{FULLNAME}-auth")
    job = r.one("Job")
    (item,) = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "root-password")["secret"][
        "items"
    ]
    assert item == {"key": "password", "path": "root-password"}
    assert not rendered("rbac-off").all("Job")


@pytest.mark.parametrize("scenario", ["default", "existing-secrets", "everything", "rbac-off"])
def test_store_starts_a_new_cluster_with_root_from_the_root_secret(scenario: str) -> None:
    """Trust item 2: no window with auth off - the store pods create root and enable auth as the
    first log entries, from the same Secret and key the bootstrap Job checks root against."""
    r = rendered(scenario)
    values = merged(scenario)
    sts = r.one("StatefulSet", STORE)
    pod = sts["spec"]["template"]
    c = store_container(r)
    f = flags(c["args"])
    if not values["auth"]["rbac"]["create"]:
        assert "--initial-root-password-file" not in f
        return
    assert f["--bcrypt-cost"] == str(values["auth"]["bcryptCost"])
    store_volume, store_key = source_of(pod, c, f["--initial-root-password-file"])
    job = r.one("Job", f"{FULLNAME}-bootstrap-auth")["spec"]["template"]
    (main,) = job["spec"]["containers"]
    job_volume, job_key = source_of(job, main, flags(main["args"])["--root-password-file"])
    assert store_volume["secret"]["secretName"] == job_volume["secret"]["secretName"]
    assert store_key == job_key
    expected = values["auth"]["rbac"]["existingSecret"] or f"{FULLNAME}-auth"
    assert store_volume["secret"]["secretName"] == expected
    assert store_volume["secret"]["defaultMode"] == 0o440
    mount = next(m for m in c["volumeMounts"] if m["name"] == store_volume["name"])
    assert mount["readOnly"] is True


def test_dev_mode_shares_secrets_and_keeps_the_peer_secret_from_proxies() -> None:
    r = rendered("dev-shared-secret")
    assert not r.all("Certificate") and not r.find("Secret", f"{FULLNAME}-tls-ca")
    f = flags(store_container(r)["args"])
    assert f["--listen-internal-urls"].startswith("http://") and f["--peer-secret-file"]
    for _, pod, _c in proxy_containers(r):
        volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "raftgate-shared-secret")
        assert [i["key"] for i in volume["secret"]["items"]] == ["internal-secret"]


# ---------------------------------------------------------------------------------------------
# NetworkPolicy, ServiceMonitor, NOTES


def _rule_for(policy: dict[str, Any], port: int) -> dict[str, Any]:
    (rule,) = [r for r in policy["spec"]["ingress"] if any(p["port"] == port for p in r["ports"])]
    return rule


@pytest.mark.parametrize("scenario", ["default", "networkpolicy-strict", "dev-shared-secret", "no-standalone-proxy"])
def test_network_policy_only_proxies_reach_internal_only_store_pods_reach_peer(scenario: str) -> None:
    r = rendered(scenario)
    policy = r.one("NetworkPolicy", STORE)
    sts = r.one("StatefulSet", STORE)
    store_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"]["matchLabels"], store_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    store = store_container(r)
    internal = _rule_for(policy, container_port(store, "internal"))
    peer = _rule_for(policy, container_port(store, "peer"))
    # Peer: store pods only.
    (peer_from,) = peer["from"]
    assert set(peer_from) == {"podSelector"}
    assert selects(peer_from["podSelector"]["matchLabels"], store_labels)
    # Internal: every pod running a proxy of this release matches, no store pod and nothing else
    # (a store pod's member proxy reaches its store over loopback, which no policy governs).
    for w, pod, _ in proxy_containers(r):
        if w["kind"] == "StatefulSet":
            continue
        labels = pod["metadata"]["labels"]
        assert any(
            set(src) == {"podSelector"} and selects(src["podSelector"]["matchLabels"], labels)
            for src in internal["from"]
        ), w["metadata"]["name"]
    for src in internal["from"]:
        assert src["podSelector"]["matchLabels"], "an empty selector would admit every pod"
        assert not selects(src["podSelector"]["matchLabels"], store_labels)
    # Every port the store pod listens on (the store's, its member proxy's) is covered by exactly one rule.
    listened = [p["containerPort"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
    covered = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert sorted(covered) == sorted(listened)


def test_network_policy_strict_and_off() -> None:
    r = rendered("networkpolicy-strict")
    store = store_container(r)
    internal = _rule_for(r.one("NetworkPolicy", STORE), container_port(store, "internal"))
    cross_ns = [src for src in internal["from"] if "namespaceSelector" in src]
    assert cross_ns == [
        {"namespaceSelector": {"matchLabels": {"raftgate.io/clients": "true"}},
         "podSelector": {"matchLabels": {"raftgate.io/proxy-for": FULLNAME}}}
    ]  # fmt: skip
    client = _rule_for(r.one("NetworkPolicy", f"{FULLNAME}-proxy"), 2379)
    assert client["from"] == [{"podSelector": {"matchLabels": {f"{FULLNAME}-client": "true"}}}]
    metrics = _rule_for(r.one("NetworkPolicy", STORE), container_port(store, "metrics"))
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    assert not rendered("networkpolicy-off").all("NetworkPolicy")


def test_service_monitors_select_services_with_a_metrics_port() -> None:
    r = rendered("metrics-servicemonitor")
    monitors = r.all("ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {f"{FULLNAME}-store", f"{FULLNAME}-proxy"}
    for m in monitors:
        assert m["metadata"]["labels"]["release"] == "prometheus"
        services = [
            s for s in r.all("Service") if selects(m["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        ]
        assert len(services) == 1, m["metadata"]["name"]
        (endpoint,) = m["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
        assert endpoint["path"] == "/metrics" and endpoint["scrapeTimeout"] == "10s"
    assert not rendered("default").all("ServiceMonitor")


def test_notes_show_the_etcdctl_command_to_try() -> None:
    notes = rendered("default").notes
    assert f"svc/{FULLNAME} 2379:2379" in notes
    assert "etcdctl --endpoints=127.0.0.1:2379 auth status" in notes
    assert f"kubectl get secret -n {NAMESPACE} {FULLNAME}-auth" in notes
    assert 'include "raftgate.proxySidecar"' in notes


def test_image_reference() -> None:
    with helm.Chart.load(str(CHART_DIR)) as c:
        assert c.values["image"]["tag"] == c.metadata["appVersion"]
    for _, pod in rendered("default").pod_specs():
        assert {c["image"] for c in all_containers(pod)} == {"raftgate:0.1.0"}
    for _, pod in rendered("everything").pod_specs():
        assert {c["image"] for c in all_containers(pod)} == {"registry.example/raftgate@sha256:" + "a" * 64}
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]


# ---------------------------------------------------------------------------------------------
# The sidecar helper, included by an application chart


def test_sidecar_helper_in_an_application_chart(tmp_path: Path) -> None:
    app = make_app_chart(tmp_path)
    values = {
        "raftgate": {
            "replicaCount": 5,
            "auth": {"token": {"type": "jwt"}},
            "sidecar": {
                "store": {"fullname": "raftgate", "namespace": "raftgate"},
                "identity": {"existingSecret": "app-identity"},
                "listenClientUrls": "unix:///run/raftgate/etcd.sock",
            },
        }
    }
    r = render(values, chart=app, release="shop", namespace="apps")
    # deploy=false: raftgate itself renders nothing; only the application's Deployment.
    assert [(d["kind"], d["metadata"]["name"]) for d in r.docs] == [("Deployment", "shop-app")]
    (deployment,) = r.docs
    validate(deployment)
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["raftgate.io/proxy-for"] == "raftgate"
    (sidecar,) = pod["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    f = flags(sidecar["args"])
    assert f["--store-endpoints"] == "raftgate-store-headless.raftgate.svc.cluster.local:23790"
    assert f["--listen-client-urls"] == "unix:///run/raftgate/etcd.sock"
    assert f["--identity-file"] == "/etc/raftgate/identity"
    assert addr_port(f["--health-addr"]) == container_port(sidecar, "rg-health") == 9191
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["raftgate-sidecar-tls"]["secret"]["secretName"] == "raftgate-sidecar-tls"
    assert volumes["raftgate-store-ca"]["secret"]["secretName"] == "raftgate-internal-tls"
    assert "raftgate-jwt" not in volumes and "raftgate-proxy-tls" not in volumes
    assert f["--sidecar"] == "true" and "--auth-token" not in f
    assert volumes["raftgate-identity"]["secret"]["secretName"] == "app-identity"
    for flag, path in file_args(sidecar).items():
        volume, key = source_of(pod, sidecar, path)
        assert volume["name"].startswith("raftgate-"), flag
    # The Unix socket's directory is a shared emptyDir the application container can mount too.
    assert "emptyDir" in volumes["raftgate-run"]
    assert any(m["name"] == "raftgate-run" and m["mountPath"] == "/run/raftgate" for m in sidecar["volumeMounts"])


def test_sidecar_helper_defaults_to_the_same_release(tmp_path: Path) -> None:
    app = make_app_chart(tmp_path)
    r = render({}, chart=app, release="shop", namespace="apps")
    (deployment,) = r.docs
    (sidecar,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert flags(sidecar["args"])["--store-endpoints"] == "shop-raftgate-store-headless.apps.svc.cluster.local:23790"
    assert deployment["spec"]["template"]["metadata"]["labels"]["raftgate.io/proxy-for"] == "shop-raftgate"


@pytest.mark.parametrize("values", [
    {"auth": {"token": {"type": "jwt"}}},
    {"auth": {"token": {"type": "jwt"}}, "tls": {"provider": "certManager"}},
    {"tls": {"enabled": False}},
], ids=["generate-jwt", "cert-manager-jwt", "shared-secret"])
def test_sidecar_mounts_no_private_key_and_no_central_credential(tmp_path: Path, values: dict[str, Any]) -> None:
    """A sidecar's volumes hold its own sidecar-class credential and public CA certificates only:
    no JWT key, no central proxy certificate, no store key, no central shared secret (issue 12)."""
    app = make_app_chart(tmp_path)
    r = render({"raftgate": values}, chart=app, release="shop", namespace="apps")
    (deployment,) = r.docs
    pod = deployment["spec"]["template"]
    (sidecar,) = pod["spec"]["initContainers"]
    f = flags(sidecar["args"])
    assert f["--sidecar"] == "true"
    assert not any(k.startswith("--auth-token") for k in f)
    mounted = {m["name"] for m in sidecar["volumeMounts"]}
    volumes = [v for v in pod["spec"]["volumes"] if v["name"] in mounted]
    secrets = {v["secret"]["secretName"]: v["secret"].get("items") for v in volumes if "secret" in v}
    assert "shop-raftgate-jwt" not in secrets and "shop-raftgate-proxy-tls" not in secrets
    for name, items in secrets.items():
        keys = {i["key"] for i in items or ()}
        if name == "shop-raftgate-internal-tls":  # the store's Secret: its CA certificate alone
            assert keys == {"ca.crt"}
        elif name == "shop-raftgate-sidecar-tls":
            assert keys == {"tls.crt", "tls.key"}
        elif name == "shop-raftgate-shared-secret":
            assert items == [{"key": "sidecar-secret", "path": "internal-secret"}]
        else:
            raise AssertionError(f"unexpected Secret {name} in the sidecar")
    # the store, on its side, trusts the sidecar CA (or secret) for sidecar-class callers only
    store = render(values).one("StatefulSet", STORE)["spec"]["template"]["spec"]
    store_flags = flags(store["containers"][0]["args"])
    assert ("--sidecar-trusted-ca-file" in store_flags) == values.get("tls", {}).get("enabled", True)
    assert store_flags["--auth-token"].startswith("simple" if "auth" not in values else "jwt")


# ---------------------------------------------------------------------------------------------
# The programs accept every flag the chart passes


def _program_flags(command: str) -> set[str]:
    import re
    import subprocess
    import sys

    from tests.support.chart_support import REPO_ROOT

    done = subprocess.run(
        [sys.executable, "-m", "raftgate.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", done.stdout))


def test_the_programs_accept_every_flag_the_chart_passes(tmp_path: Path) -> None:
    used: dict[str, set[str]] = {"store": set(), "proxy": set(), "bootstrap-auth": set()}
    renders = [rendered(name) for name in SCENARIOS]
    app = make_app_chart(tmp_path)
    renders.append(
        render(
            {"raftgate": {"auth": {"workloadIdentity": {"enabled": True}},
                          "sidecar": {"identity": {"serviceAccountToken": {"enabled": True}}}}},
            chart=app,
        )
    )
    for r in renders:
        for _, pod in r.pod_specs():
            for c in all_containers(pod):
                if c.get("args"):
                    used[c["args"][0]] |= set(flags(c["args"]))
    missing = {command: sorted(names - _program_flags(command)) for command, names in used.items()}
    assert missing == {"store": [], "proxy": [], "bootstrap-auth": []}
