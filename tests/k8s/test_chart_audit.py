"""The chart's audit log values (proxy.audit, sidecar.audit): the flags every proxy container gets,
the emptyDir a file path needs (the root filesystem is read-only), and the schema's refusals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from proxy.config import load
from tests.support.chart_support import CHART_DIR, all_containers, render, validate

AUDIT_FILE = "/var/log/raftgate/audit.log"

APP = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  selector:
    matchLabels: {app: demo}
  template:
    metadata:
      labels: {app: demo}
    spec:
      initContainers:
        {{- include "raftgate.proxySidecar" (dict "values" .Values.raftgate "context" $) | nindent 8 }}
      containers:
        - {name: app, image: "demo:1"}
      volumes:
        {{- include "raftgate.proxySidecarVolumes" (dict "values" .Values.raftgate "context" $) | nindent 8 }}
"""


def proxies(docs: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(workload kind/name) -> (its pod spec, its proxy container)."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = d["spec"]["template"]["spec"]
            for c in all_containers(d["spec"]["template"]):
                if c.get("args", [""])[0] == "proxy":
                    out[f"{d['kind']}/{d['metadata']['name']}"] = (pod, c)
    return out


def audit_args(container: dict[str, Any]) -> list[str]:
    return [a for a in container["args"] if a.startswith("--audit-")]


def test_off_by_default() -> None:
    assert all(not audit_args(c) for _, c in proxies(render().docs).values())


def test_proxy_audit_reaches_the_proxies_and_member_proxies_on_stdout(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    r = render({"proxy": {"audit": {"enabled": True, "level": "all", "failClosed": True}}})
    found = proxies(r.docs)
    for where, (pod, c) in found.items():
        if where.startswith("Job/"):
            assert not audit_args(c)  # the bootstrap Job's own proxy
            continue
        assert audit_args(c) == ["--audit-log=-", "--audit-level=all", "--audit-fail-closed=true"], where
        assert not any(v["name"] == "raftgate-audit" for v in pod["volumes"])
        # the program takes what the chart passes
        cfg = load(["--store-endpoints=127.0.0.1:1", f"--internal-secret-file={secret}", *audit_args(c)], env={})
        assert (cfg.audit_log, cfg.audit_level, cfg.audit_fail_closed) == ("-", "all", True)
    assert {w.split("/")[0] for w in found} >= {"Deployment", "StatefulSet"}


def test_a_file_path_gets_an_empty_dir_at_its_directory() -> None:
    r = render({"proxy": {"audit": {"enabled": True, "path": AUDIT_FILE, "sizeLimit": "2Gi"}}})
    for where, (pod, c) in proxies(r.docs).items():
        if where.startswith("Job/"):
            continue
        assert audit_args(c) == [f"--audit-log={AUDIT_FILE}", "--audit-level=denials"]
        assert {"name": "raftgate-audit", "mountPath": "/var/log/raftgate"} in c["volumeMounts"]
        assert {"name": "raftgate-audit", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    for doc in r.docs:
        validate(doc)


def test_sidecar_audit(tmp_path: Path) -> None:
    app = tmp_path / "app"
    (app / "templates").mkdir(parents=True)
    (app / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "app", "version": "1.0.0",
                                                    "dependencies": [{"name": "raftgate", "version": "0.1.0"}]}))
    (app / "values.yaml").write_text("raftgate:\n  deploy: false\n")
    (app / "templates" / "deployment.yaml").write_text(APP)
    shutil.copytree(CHART_DIR, app / "charts" / "raftgate")
    r = render({"raftgate": {"sidecar": {"audit": {"enabled": True, "path": AUDIT_FILE, "level": "auth"}}}},
               chart=app)
    ((pod, c),) = proxies(r.docs).values()
    assert audit_args(c) == [f"--audit-log={AUDIT_FILE}", "--audit-level=auth"]
    assert {"name": "raftgate-audit", "mountPath": "/var/log/raftgate"} in c["volumeMounts"]
    assert {"name": "raftgate-audit", "emptyDir": {"sizeLimit": "1Gi"}} in pod["volumes"]


@pytest.mark.parametrize("audit", [{"path": "audit.log"}, {"path": "/audit.log"}, {"path": "/tmp/audit.log"},
                                   {"level": "everything"}, {"failClosed": "yes"}])
def test_the_schema_refuses_bad_audit_values(audit: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError, match="audit"):
        render({"proxy": {"audit": {"enabled": True, **audit}}})
