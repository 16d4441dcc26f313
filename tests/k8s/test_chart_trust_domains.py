"""The chart keeps its trust domains apart: the internal port (the store's internal certificate and
the central proxies' client certificate: root-equivalent), the peers (the Raft log), the sidecars
(an ordinary client's powers) and the client port (a client certificate's CN is a raftgate user)
each get a CA of their own, whichever provider issues them.

With one external cert-manager issuer for several domains, anyone allowed to request a
Certificate from it would get the powers of the strongest of them (a shared ClusterIssuer: CN
``root`` on the client port, or a central certificate on the internal port). So with
``tls.certManager.issuerRef`` every domain needs its own issuer, or the chart refuses to render.
"""

from __future__ import annotations

import base64
import itertools
from typing import Any

import helm_python as helm
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.support.chart_support import Rendered, render, validate

FULLNAME = "rg-raftgate"
#: value name → the trust domain its issuer signs
REFS = {
    "issuerRef": "internal",
    "peerIssuerRef": "peer",
    "sidecarIssuerRef": "sidecar",
    "clientIssuerRef": "client",
}
#: Certificate (without the fullname prefix) → the value naming its issuer
CERT_ISSUER = {
    "internal": "issuerRef",
    "proxy": "issuerRef",
    "peer": "peerIssuerRef",
    "sidecar": "sidecarIssuerRef",
    "client": "clientIssuerRef",
}
CLIENT_TLS = {"auth": {"client": {"secureTransport": True, "enableAuthentication": True}}}


def _ref(name: str, kind: str = "Issuer") -> dict[str, str]:
    return {"name": name, "kind": kind, "group": "cert-manager.io"}


def separate(**override: dict[str, str]) -> dict[str, Any]:
    """Values with one issuer per domain (and the client port's certificate issued), with `override`."""
    refs: dict[str, Any] = {key: _ref(f"raftgate-{domain}-ca") for key, domain in REFS.items()}
    refs.update(override)
    return {"tls": {"provider": "certManager", "certManager": refs}} | CLIENT_TLS


def test_one_issuer_for_every_domain_is_refused() -> None:
    """The configuration the chart accepted so far: one issuer (plus the sidecars') signs the
    internal port, the peers and the client port."""
    values = {"tls": {"provider": "certManager", "certManager": {
        "issuerRef": _ref("corp-ca", "ClusterIssuer"), "sidecarIssuerRef": _ref("corp-sidecar-ca", "ClusterIssuer")}}}
    with pytest.raises(helm.HelmError, match=r"tls\.certManager\.peerIssuerRef\.name"):
        render(values)
    with pytest.raises(helm.HelmError, match=r"tls\.certManager\.clientIssuerRef\.name"):
        render(values | CLIENT_TLS)


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(REFS, 2)))
def test_two_domains_sharing_an_issuer_are_refused(a: str, b: str) -> None:
    values = separate(**{b: _ref(f"raftgate-{REFS[a]}-ca")})
    with pytest.raises(helm.HelmError, match=rf"tls\.certManager\.{a} and tls\.certManager\.{b} name the same issuer"):
        render(values)


def test_the_same_issuer_written_two_ways_is_refused() -> None:
    """group defaults to cert-manager.io (as in cert-manager): leaving it empty names the same issuer."""
    values = separate(peerIssuerRef={"name": "raftgate-internal-ca", "kind": "Issuer", "group": ""})
    with pytest.raises(helm.HelmError, match="name the same issuer"):
        render(values)


def test_a_misspelt_issuer_is_refused_by_the_schema() -> None:
    """A typo must not leave a domain on another's issuer (or the value silently unused)."""
    values = separate()
    values["tls"]["certManager"]["peerIssureRef"] = _ref("raftgate-peer-ca")
    with pytest.raises(helm.HelmError, match="peerIssureRef"):
        render(values)


@pytest.mark.parametrize("name", ["raftgate-internal-ca ", "Raftgate-Internal-CA", "a/b"])
def test_an_issuer_name_that_is_no_kubernetes_name_is_refused(name: str) -> None:
    """Not a name cert-manager could resolve, nor one a string compare would find equal to another."""
    with pytest.raises(helm.HelmError, match="peerIssuerRef/name"):
        render(separate(peerIssuerRef={"name": name, "kind": "Issuer", "group": "cert-manager.io"}))


def test_a_null_issuer_ref_means_the_charts_own_cas() -> None:
    r = render({"tls": {"provider": "certManager", "certManager": {"issuerRef": None}}})
    internal = next(c for c in r.all("Certificate") if c["metadata"]["name"] == f"{FULLNAME}-internal")
    assert internal["spec"]["issuerRef"]["name"] == f"{FULLNAME}-internal-ca"


def test_an_issuer_of_a_domain_without_issuer_ref_is_refused() -> None:
    """Without issuerRef the chart makes its own CAs; a peer/sidecar/client issuer would be ignored
    silently, so it is refused instead."""
    for key in ("peerIssuerRef", "sidecarIssuerRef", "clientIssuerRef"):
        values = {"tls": {"provider": "certManager", "certManager": {key: _ref("corp-ca")}}} | CLIENT_TLS
        with pytest.raises(helm.HelmError, match=rf"tls\.certManager\.{key}\.name needs tls\.certManager\.issuerRef"):
            render(values)


def test_separate_issuers_render_with_each_certificate_from_its_own_issuer() -> None:
    r = render(separate())
    for doc in r.docs:
        validate(doc)
    assert not r.all("Issuer"), "the chart makes no CA of its own when the issuers are given"
    certs = {c["metadata"]["name"].removeprefix(f"{FULLNAME}-"): c["spec"] for c in r.all("Certificate")}
    assert set(certs) == set(CERT_ISSUER)
    for cert, key in CERT_ISSUER.items():
        assert certs[cert]["issuerRef"] == _ref(f"raftgate-{REFS[key]}-ca"), cert
    # without the client port's certificate, no client issuer is needed
    values = separate()
    del values["tls"]["certManager"]["clientIssuerRef"]
    del values["auth"]
    r = render(values)
    assert {c["metadata"]["name"] for c in r.all("Certificate")} == {
        f"{FULLNAME}-{cert}" for cert in CERT_ISSUER if cert != "client"}


def test_an_issuer_and_a_cluster_issuer_of_one_name_are_two_issuers() -> None:
    r = render(separate(peerIssuerRef=_ref("raftgate-internal-ca", "ClusterIssuer")))
    peer = next(c for c in r.all("Certificate") if c["metadata"]["name"] == f"{FULLNAME}-peer")
    assert peer["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_notes_warn_when_a_root_equivalent_domain_uses_a_cluster_issuer() -> None:
    """A ClusterIssuer is usable from every namespace: whoever may create a Certificate anywhere
    gets that domain's powers. The notes say so for the internal, peer and client issuers."""
    assert "ClusterIssuer" not in render(separate()).notes
    for key in ("issuerRef", "peerIssuerRef", "clientIssuerRef"):
        notes = render(separate(**{key: _ref(f"raftgate-{REFS[key]}-ca", "ClusterIssuer")})).notes
        assert f"tls.certManager.{key} is a ClusterIssuer" in notes, key
    # the sidecar domain gives an ordinary client's powers only
    notes = render(separate(sidecarIssuerRef=_ref("raftgate-sidecar-ca", "ClusterIssuer"))).notes
    assert "is a ClusterIssuer" not in notes


# ---------------------------------------------------------------------------------------------
# The chart's own CAs (provider generate, cert-manager without issuerRef): one per domain


def test_cert_manager_without_issuer_ref_makes_one_ca_per_domain() -> None:
    r = render({"tls": {"provider": "certManager"}} | CLIENT_TLS)
    certs = {c["metadata"]["name"].removeprefix(f"{FULLNAME}-"): c["spec"] for c in r.all("Certificate")}
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.all("Issuer")}
    domain_of = {"internal": "internal", "proxy": "internal", "peer": "peer", "sidecar": "sidecar", "client": "client"}
    ca_secret = {}
    for cert, domain in domain_of.items():
        issuer = certs[cert]["issuerRef"]
        assert issuer["kind"] == "Issuer" and issuer["name"] == f"{FULLNAME}-{domain}-ca", cert
        ca_secret[domain] = issuers[issuer["name"]]["ca"]["secretName"]
    assert len(set(ca_secret.values())) == 4, ca_secret  # four CAs, not one
    for secret in ca_secret.values():
        ca = next(c for c in certs.values() if c.get("isCA") and c["secretName"] == secret)
        assert ca["issuerRef"]["name"] == f"{FULLNAME}-selfsigned"  # each its own root


def _secret(r: Rendered, name: str) -> dict[str, bytes]:
    doc = next(d for d in r.all("Secret") if d["metadata"]["name"] == name)
    return {k: base64.b64decode(v) for k, v in doc["data"].items()}


def test_generate_makes_one_ca_per_domain_and_each_leaf_verifies_with_its_own_only() -> None:
    r = render()
    cas = _secret(r, f"{FULLNAME}-tls-ca")
    ca = {d: x509.load_pem_x509_certificate(cas[f"{d}-ca.crt"]) for d in ("internal", "peer", "sidecar")}
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len({c.public_key().public_bytes(*spki) for c in ca.values()}) == 3
    domain_of = {"internal": "internal", "proxy": "internal", "peer": "peer", "sidecar": "sidecar"}
    for role, domain in domain_of.items():
        leaf = _secret(r, f"{FULLNAME}-{role}-tls")
        cert = x509.load_pem_x509_certificate(leaf["tls.crt"])
        for other, issuer in ca.items():
            if other == domain:
                cert.verify_directly_issued_by(issuer)
            else:
                with pytest.raises(Exception):  # noqa: B017 - any verification failure
                    cert.verify_directly_issued_by(issuer)


# ---------------------------------------------------------------------------------------------
# What the notes tell operators to copy into an application's namespace


@pytest.mark.parametrize("values", [{}, {"auth": {"token": {"type": "jwt"}}}, {"tls": {"provider": "certManager"}}])
def test_notes_never_tell_to_copy_a_central_credential_to_applications(values: dict[str, Any]) -> None:
    """A sidecar needs the sidecar certificate and the CA that verifies the store; the central
    proxies' certificate and the JWT signing key are root's and stay in the release namespace."""
    notes = render(values).notes
    assert f"{FULLNAME}-sidecar-tls" in notes
    assert f"{FULLNAME}-proxy-tls" not in notes
    assert f"{FULLNAME}-jwt" not in notes
