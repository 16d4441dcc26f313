"""Rendering and validating the Helm chart offline: Helm v4's own engine (``helm-python-sdk``, no
helm binary), Kubernetes' OpenAPI schemas (``kubernetes-validate``) and, for the two CRD kinds the
chart can emit (cert-manager, Prometheus Operator), the subset of their CRD schemas the chart uses.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "raftgate"
#: The Kubernetes version manifests are validated against (a current release; the chart needs >= 1.29).
KUBE_VERSION = "1.34.0"
RELEASE = "rg"
NAMESPACE = "db"


@dataclass
class Rendered:
    """One render: the manifests by kind and name, and NOTES.txt."""

    values: dict[str, Any]
    docs: list[dict[str, Any]] = field(default_factory=list)
    notes: str = ""
    sources: dict[str, str] = field(default_factory=dict)

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        return found[0]

    def find(self, kind: str, name: str) -> dict[str, Any] | None:
        found = [d for d in self.all(kind) if d["metadata"]["name"] == name]
        return found[0] if found else None

    def pod_specs(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(workload, its pod template) for every Deployment, StatefulSet and Job."""
        for d in self.docs:
            if d["kind"] in ("Deployment", "StatefulSet", "Job"):
                yield d, d["spec"]["template"]


def render(
    values: dict[str, Any] | None = None, *, chart: Path = CHART_DIR, release: str = RELEASE, namespace: str = NAMESPACE
) -> Rendered:
    values = copy.deepcopy(values or {})
    with helm.Chart.load(str(chart)) as c:
        out = c.render(values=values, name=release, namespace=namespace, is_install=True)
    result = Rendered(values=values, sources=out)
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            result.notes += text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__source__"] = path
                result.docs.append(doc)
    return result


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return helm.lint(str(CHART_DIR), copy.deepcopy(values or {}), namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")


# ---------------------------------------------------------------------------------------------
# Validation


def _strict(obj: dict[str, Any]) -> dict[str, Any]:
    """Objects with additionalProperties false all the way down, as the API server's pruning would flag."""
    if obj.get("type") == "object" and "properties" in obj:
        obj.setdefault("additionalProperties", False)
        for sub in obj["properties"].values():
            _strict(sub)
    if obj.get("type") == "array" and "items" in obj:
        _strict(obj["items"])
    return obj


_STR = {"type": "string"}
_STRS = {"type": "array", "items": {"type": "string"}}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": _STR, "namespace": _STR, "labels": _LABELS, "annotations": _LABELS},
}
_ISSUER_REF = {"type": "object", "required": ["name"], "properties": {"name": _STR, "kind": _STR, "group": _STR}}
_KEY_USAGES = [
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
    "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
    "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
]  # fmt: skip
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _LABELS,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "properties": {
                    "key": _STR,
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": _STRS,
                },
            },
        },
    },
}
_RELABELINGS = {"type": "array", "items": {"type": "object"}}
#: Prometheus' duration syntax (monitoring.coreos.com/v1 Duration).
_PROM_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"

#: The fields of cert-manager.io/v1 and monitoring.coreos.com/v1 the chart may set, with their types
#: and enums from the CRDs (cert-manager 1.x `cert-manager.io_*.yaml`, prometheus-operator
#: `monitoring.coreos.com_servicemonitors.yaml`,
#: `monitoring.coreos.com_prometheusrules.yaml`). Anything else the chart emitted would fail here.
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("cert-manager.io/v1", "Issuer"): _strict(
        {
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": _STR,
                "kind": _STR,
                "metadata": _METADATA,
                "spec": {
                    "type": "object",
                    "minProperties": 1,
                    "maxProperties": 1,
                    "properties": {
                        "selfSigned": {"type": "object", "properties": {"crlDistributionPoints": _STRS}},
                        "ca": {
                            "type": "object",
                            "required": ["secretName"],
                            "properties": {
                                "secretName": _STR,
                                "crlDistributionPoints": _STRS,
                                "issuingCertificateURLs": _STRS,
                                "ocspServers": _STRS,
                            },
                        },
                    },
                },
            },
        }
    ),
    ("cert-manager.io/v1", "Certificate"): _strict(
        {
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": _STR,
                "kind": _STR,
                "metadata": _METADATA,
                "spec": {
                    "type": "object",
                    "required": ["issuerRef", "secretName"],
                    "properties": {
                        "commonName": {"type": "string", "maxLength": 64},
                        "dnsNames": _STRS,
                        "ipAddresses": _STRS,
                        "duration": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"},
                        "renewBefore": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"},
                        "isCA": {"type": "boolean"},
                        "issuerRef": _ISSUER_REF,
                        "secretName": _STR,
                        "usages": {"type": "array", "items": {"enum": _KEY_USAGES}},
                        "privateKey": {
                            "type": "object",
                            "properties": {
                                "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                                "encoding": {"enum": ["PKCS1", "PKCS8"]},
                                "rotationPolicy": {"enum": ["Never", "Always"]},
                                "size": {"type": "integer"},
                            },
                        },
                    },
                },
            },
        }
    ),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _strict(
        {
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": _STR,
                "kind": _STR,
                "metadata": _METADATA,
                "spec": {
                    "type": "object",
                    "required": ["selector"],
                    "properties": {
                        "jobLabel": _STR,
                        "namespaceSelector": {
                            "type": "object",
                            "properties": {"any": {"type": "boolean"}, "matchNames": _STRS},
                        },
                        "selector": _LABEL_SELECTOR,
                        "endpoints": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "port": _STR,
                                    "path": _STR,
                                    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                                    "interval": {
                                        "type": "string",
                                        "pattern": _PROM_DURATION,
                                    },
                                    "scrapeTimeout": {
                                        "type": "string",
                                        "pattern": _PROM_DURATION,
                                    },
                                    "relabelings": _RELABELINGS,
                                    "metricRelabelings": _RELABELINGS,
                                },
                            },
                        },
                    },
                },
            },
        }
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _strict(
        {
            "type": "object",
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": _STR,
                "kind": _STR,
                "metadata": _METADATA,
                "spec": {
                    "type": "object",
                    "properties": {
                        "groups": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {"type": "string", "minLength": 1},
                                    "interval": {"type": "string", "pattern": _PROM_DURATION},
                                    "rules": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "required": ["expr"],
                                            "properties": {
                                                "alert": _STR,
                                                "record": _STR,
                                                "expr": {"type": ["string", "integer"]},
                                                "for": {"type": "string", "pattern": _PROM_DURATION},
                                                "labels": _LABELS,
                                                "annotations": _LABELS,
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        }
    ),
}


def validate(doc: dict[str, Any]) -> str:
    """Validate one manifest; return what it was validated against. Raises on any problem."""
    doc = {k: v for k, v in doc.items() if k != "__source__"}
    crd = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        jsonschema.validate(doc, crd)
        return f"CRD subset {doc['apiVersion']}/{doc['kind']}"
    # Raises SchemaNotFoundError for a kind Kubernetes does not know: never skipped.
    version = kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    return f"Kubernetes {version}"


# ---------------------------------------------------------------------------------------------
# Reading manifests


def flags(args: list[str]) -> dict[str, str]:
    """``--flag=value`` arguments → {flag: value} (every flag the chart sets uses the = form)."""
    out: dict[str, str] = {}
    for arg in args:
        if arg.startswith("--"):
            name, sep, value = arg.partition("=")
            assert sep, f"flag without =: {arg}"
            assert name not in out, f"flag given twice: {name}"
            out[name] = value
    return out


def url_port(url: str) -> int:
    m = re.fullmatch(r"[a-z]+://[^/]*:(\d+)/?", url)
    assert m, f"not a URL with a port: {url}"
    return int(m.group(1))


def addr_port(addr: str) -> int:
    host, _, port = addr.rpartition(":")
    assert host and port.isdigit(), f"not HOST:PORT: {addr}"
    return int(port)


def container_port(container: dict[str, Any], name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    assert name in ports, f"container {container['name']} has no port named {name}: {ports}"
    return int(ports[name])


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
