"""The chart's client-port TLS (auth.client.*, bitnami's names): the proxy Deployment and the store
pods' member proxies get etcd's flags and the mounted Secret; cert-manager issues the certificate
from a client CA when no Secret is given; sidecars stay plain (loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from proxy import config as proxy_config
from tests.support.chart_support import Rendered, all_containers, flags, lint, render, validate

FULLNAME = "rg-raftgate"
CLIENT_TLS = "/etc/raftgate/tls/client"
CERT_MANAGER = {"tls": {"provider": "certManager"},
                "auth": {"client": {"secureTransport": True, "enableAuthentication": True}}}
EXISTING = {"auth": {"client": {"secureTransport": True, "existingSecret": "my-client-tls"}}}


def proxies(r: Rendered) -> dict[str, dict[str, Any]]:
    """Every proxy container by workload kind (Deployment, StatefulSet: the member proxy, Job: the
    bootstrap job's own proxy), with its pod's volumes."""
    out = {}
    for workload, pod in r.pod_specs():
        for c in all_containers(pod):
            if c.get("args", [None])[0] == "proxy":
                out[workload["kind"]] = c | {"__volumes__": pod["spec"].get("volumes", [])}
    return out


def test_cert_manager_issues_the_client_port_certificate_and_the_proxies_serve_https() -> None:
    r = render(CERT_MANAGER)
    for doc in r.docs:
        validate(doc)
    certs = {c["metadata"]["name"]: c["spec"] for c in r.all("Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.all("Issuer")}
    client = certs[f"{FULLNAME}-client"]
    assert client["secretName"] == f"{FULLNAME}-client-tls"
    assert client["usages"][-1] == "server auth" and "client auth" not in client["usages"]
    assert client["issuerRef"]["name"] == f"{FULLNAME}-client-ca" and "ca" in issuers[f"{FULLNAME}-client-ca"]
    assert {FULLNAME, f"{FULLNAME}.db.svc", f"*.{FULLNAME}-store-headless.db.svc.cluster.local"} <= set(
        client["dnsNames"])
    found = proxies(r)
    for kind in ("Deployment", "StatefulSet"):
        c = found[kind]
        f = flags(c["args"])
        assert f["--listen-client-urls"].startswith("https://0.0.0.0:")
        assert (f["--cert-file"], f["--key-file"], f["--trusted-ca-file"]) == (
            f"{CLIENT_TLS}/tls.crt", f"{CLIENT_TLS}/tls.key", f"{CLIENT_TLS}/ca.crt")
        assert f["--client-cert-auth"] == "true"
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == CLIENT_TLS)
        volume = next(v for v in c["__volumes__"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == f"{FULLNAME}-client-tls"
    # the bootstrap job's own proxy (loopback) stays plain
    assert "--cert-file" not in flags(found["Job"]["args"])
    sts = r.one("StatefulSet", f"{FULLNAME}-store")
    store_args = flags(sts["spec"]["template"]["spec"]["containers"][0]["args"])
    assert store_args["--advertise-client-urls"].startswith("https://")


def test_an_existing_secret_without_client_certificates() -> None:
    r = render(EXISTING)
    assert not r.all("Certificate")
    c = proxies(r)["Deployment"]
    f = flags(c["args"])
    assert f["--cert-file"] == f"{CLIENT_TLS}/tls.crt" and "--trusted-ca-file" not in f
    assert "--client-cert-auth" not in f
    assert any(v.get("secret", {}).get("secretName") == "my-client-tls" for v in c["__volumes__"])
    assert lint(EXISTING)["errors"] == []


def test_off_by_default() -> None:
    c = proxies(render())["Deployment"]
    assert flags(c["args"])["--listen-client-urls"].startswith("http://") and "--cert-file" not in flags(c["args"])


def test_bad_combinations_fail_with_a_message() -> None:
    with pytest.raises(helm.HelmError, match="enableAuthentication needs auth.client.secureTransport"):
        render({"auth": {"client": {"enableAuthentication": True}}})
    with pytest.raises(helm.HelmError, match="secureTransport needs auth.client.existingSecret"):
        render({"auth": {"client": {"secureTransport": True}}})
    with pytest.raises(helm.HelmError, match="secureTransport"):
        render({"auth": {"client": {"secureTransport": "yes"}}})


def test_the_proxy_accepts_the_flags_the_chart_passes(tmp_path: Path) -> None:
    from tests.support.processes import write_test_pki

    pki = write_test_pki(tmp_path, [])
    (tmp_path / "secret").write_text("x\n")
    args = flags(proxies(render(CERT_MANAGER))["Deployment"]["args"])
    argv = [f"--listen-client-urls={args['--listen-client-urls']}", "--store-endpoints=127.0.0.1:1",
            f"--internal-secret-file={tmp_path / 'secret'}", f"--cert-file={pki['server.crt']}",
            f"--key-file={pki['server.key']}", f"--trusted-ca-file={pki['ca']}",
            f"--client-cert-auth={args['--client-cert-auth']}"]
    cfg = proxy_config.load(argv, env={})
    assert cfg.client_tls is not None and cfg.client_tls.client_cert_auth and cfg.tls_listen


CLIENT_CRL = "/etc/raftgate/tls/client-crl"
WITH_CRL = {"tls": {"provider": "certManager"},
            "auth": {"client": {"secureTransport": True, "enableAuthentication": True,
                                "crl": {"existingSecret": "my-client-crl"}}}}


def test_a_crl_secret_revokes_client_certificates_on_every_client_port_proxy() -> None:
    r = render(WITH_CRL)
    for doc in r.docs:
        validate(doc)
    found = proxies(r)
    for kind in ("Deployment", "StatefulSet"):
        c = found[kind]
        assert flags(c["args"])["--client-crl-file"] == f"{CLIENT_CRL}/ca.crl"
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == CLIENT_CRL)
        volume = next(v for v in c["__volumes__"] if v["name"] == mount["name"])
        assert volume["secret"]["secretName"] == "my-client-crl" and mount["readOnly"]
    assert "--client-crl-file" not in flags(found["Job"]["args"])  # the bootstrap job's proxy is plain
    custom = render({**WITH_CRL, "auth": {"client": {**WITH_CRL["auth"]["client"],  # type: ignore[index]
                                                     "crl": {"existingSecret": "x", "key": "crl.pem"}}}})
    assert flags(proxies(custom)["Deployment"]["args"])["--client-crl-file"] == f"{CLIENT_CRL}/crl.pem"
    assert lint(WITH_CRL)["errors"] == []
    with pytest.raises(helm.HelmError, match="auth.client.crl needs auth.client.enableAuthentication"):
        render({"auth": {"client": {"secureTransport": True, "existingSecret": "s",
                                    "crl": {"existingSecret": "my-client-crl"}}}})
    assert "--client-crl-file" not in flags(proxies(render(CERT_MANAGER))["Deployment"]["args"])
