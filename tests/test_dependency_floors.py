"""pyproject.toml's runtime requirements admit no version with a known security advisory.

A floor is what `pip install raftgate` may choose when something else holds a package back (an
old distribution package, another application's pin), and what the image gets on a cache: a
floor that admits PyJWT 2.10.0 ships its issuer check by substring. The table below records, per
advisory, the first version without it (GitHub advisory database; `pip index versions NAME` for
what exists); every runtime requirement must exclude everything older. A dependency added to
pyproject.toml fails here until it is reviewed: an advisory row, or a line in REVIEWED_CLEAN.
Review again when a dependency is raised, and when its advisories change.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import Specifier, SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY = ("raftgate", "proxy", "authstore", "protos")


@dataclass(frozen=True)
class Advisory:
    package: str
    #: the first version the advisory does not affect (for an advisory fixed per release series,
    #: the fix in the newest affected series)
    fixed: str
    advisory: str
    what: str


ADVISORIES: tuple[Advisory, ...] = (
    # PyJWT (the JWT tokens, the workload identity tokens)
    Advisory("PyJWT", "2.4.0", "GHSA-ffqj-6fqr-9h24 (CVE-2022-29217)", "algorithm confusion with public key formats"),
    Advisory("PyJWT", "2.10.1", "GHSA-75c5-xw7c-p5pm (CVE-2024-53861)", "iss compared as a substring"),
    Advisory("PyJWT", "2.12.0", "GHSA-752w-5fwx-jx9f (CVE-2026-32597)", "unknown `crit` header extensions accepted"),
    Advisory("PyJWT", "2.13.0", "GHSA-xgmm-8j9v-c9wx (CVE-2026-48526)", "a public JWK accepted as an HMAC secret"),
    Advisory("PyJWT", "2.13.0", "GHSA-993g-76c3-p5m4 (CVE-2026-48522)", "PyJWKClient fetches non-HTTP(S) URIs"),
    Advisory("PyJWT", "2.13.0", "GHSA-jq35-7prp-9v3f (CVE-2026-48523)", "algorithm policy bypass (PyJWKClient)"),
    Advisory("PyJWT", "2.13.0", "GHSA-fhv5-28vv-h8m8 (CVE-2026-48524)", "one of the five PyJWT 2.13.0 fixes"),
    Advisory("PyJWT", "2.13.0", "GHSA-w7vc-732c-9m39 (CVE-2026-48525)", "CPU amplification with a detached JWS"),
    # cryptography (raftgate imports it: X.509 for the caller classes and TLS, JWK/PEM keys)
    Advisory("cryptography", "42.0.4", "GHSA-6vqw-3v5j-54x4 (CVE-2024-26130)", "NULL dereference in PKCS#12"),
    Advisory("cryptography", "46.0.5", "GHSA-r6ph-v2qm-q3c2", "EC public keys outside the prime-order subgroup"),
    Advisory("cryptography", "46.0.7", "GHSA-p423-j2cm-9vmq (CVE-2026-39892)", "overflow on non-contiguous buffers"),
    Advisory("cryptography", "48.0.1", "GHSA-537c-gmf6-5ccf", "OpenSSL in the wheels: ASN.1 OOB read"),
    Advisory("cryptography", "49.0.0", "GHSA-jwv3-5hgf-82ww (CVE-2026-69249)", "exponential chain building"),
    Advisory("cryptography", "50.0.0", "GHSA-g6cj-pr64-35w5 (CVE-2026-69247)", "Bleichenbacher oracle (PKCS#7)"),
    # aiohttp (the JSON gateway, an HTTP/1.1 server facing clients)
    Advisory("aiohttp", "3.9.2", "GHSA-5h86-8mv2-jq9f (CVE-2024-23334)", "static file path traversal"),
    Advisory("aiohttp", "3.10.11", "GHSA-8495-4g3g-x7pr (CVE-2024-52304)", "request smuggling via chunk extensions"),
    Advisory("aiohttp", "3.12.14", "GHSA-9548-qrrj-x5pj (CVE-2025-53643)", "request smuggling via trailer sections"),
    Advisory("aiohttp", "3.13.3", "GHSA-jj3x-wxrx-4x23 (CVE-2025-69227)", "infinite loop on a POST body (and 7 more)"),
    Advisory("aiohttp", "3.13.4", "GHSA-c427-h43c-vf67 (CVE-2026-34525)", "several Host headers accepted (and 9 more)"),
    Advisory("aiohttp", "3.14.0", "GHSA-jg22-mg44-37j8 (CVE-2026-34993)", "CookieJar.load() unpickles input"),
    Advisory("aiohttp", "3.14.1", "GHSA-4fvr-rgm6-gqmc (CVE-2026-54273)", "unbounded pipelined requests (and 7 more)"),
    Advisory("aiohttp", "3.14.1", "GHSA-63hw-fmq6-xxg2 (CVE-2026-54277)", "max_line_size bypass in the C parser"),
    Advisory("aiohttp", "3.14.2", "GHSA-mfx4-hv73-q22v (CVE-2026-69243)", "request smuggling via WebSocket upgrades"),
    Advisory("aiohttp", "3.14.4", "GHSA-2g87-pp6c-29x5", "unbounded memory and CPU use"),
    Advisory("aiohttp", "3.14.4", "GHSA-9xw5-w5jj-pvcg", "file descriptor exhaustion with multipart bodies"),
    # fixed by 3.14.5 at the latest (whether 3.14.4 already had them is not recorded here)
    Advisory("aiohttp", "3.14.5", "GHSA-5wr8-gcqf-gqf3", "no initial request or header timeout on the server side"),
    Advisory("aiohttp", "3.14.5", "GHSA-494j-54xm-rwp3", "Secure cookie attribute not enforced"),
    # gRPC (advisories are filed against grpcio; reflection and health checking wrap it)
    Advisory("grpcio", "1.56.2", "GHSA-496j-2rq6-j6cc (CVE-2023-33953)", "HPACK table excessive iteration"),
    Advisory("grpcio", "1.65.4", "CVE-2024-7246", "HPACK table poisoning across proxies"),
    Advisory("grpcio", "1.83.1", "GHSA-hf3w-6hpw-qp67", "heap exhaustion in the HTTP/2 transport"),
    # uvloop (the event loop): advisories of the libuv it bundles
    Advisory("uvloop", "0.20.0", "CVE-2024-24806 (libuv < 1.48.0)", "uv_getaddrinfo truncates long host names"),
    # protobuf
    Advisory("protobuf", "6.31.1", "GHSA-8qvm-5x2c-j2w7 (CVE-2025-4565)", "recursion in the pure-Python parser"),
    Advisory("protobuf", "6.33.5", "GHSA-7gcm-g887-7qv7 (CVE-2026-0994)", "json_format recursion bypass via Any"),
    # lmdb (py-lmdb bundles liblmdb)
    Advisory("lmdb", "2.1.0", "CVE-2019-16224..16228", "crashes and writes out of bounds on a crafted data file"),
)

#: Runtime dependencies with no advisory known when last reviewed (2026-12), and why.
REVIEWED_CLEAN: dict[str, str] = {
    "bcrypt": "pyca/bcrypt: none since the 3.1.0 wraparound fix (floor 4.1)",
    "prometheus-client": "none (reports against it name the Go client or Prometheus itself)",
    "grpcio-reflection": "advisories are filed against grpcio (same release line, floor equal)",
    "grpcio-health-checking": "advisories are filed against grpcio (same release line, floor equal)",
    "google-crc32c": "googleapis/python-crc32c: none in the GitHub advisory database (reviewed 2026-12-06)",
}


def runtime_requirements() -> dict[NormalizedName, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(line) for line in project["dependencies"]]
    return {canonicalize_name(r.name): r for r in reqs}


def lowest_admitted(spec: SpecifierSet) -> Version | None:
    """The lowest version `spec` can admit, from its lower bounds (None: no lower bound at all)."""
    bounds = []
    for s in spec:
        assert isinstance(s, Specifier)
        if s.operator in (">=", ">", "~=", "==", "==="):
            assert "*" not in s.version, f"a wildcard floor is not checked: {s}"
            bounds.append(Version(s.version))
    return max(bounds, default=None)


def admits_older_than(spec: SpecifierSet, fixed: Version) -> bool:
    """Whether `spec` admits any version before `fixed` (pre-releases included)."""
    low = lowest_admitted(spec)
    return low is None or low < fixed


@pytest.mark.parametrize("advisory", ADVISORIES, ids=lambda a: f"{a.package}-{a.advisory.split()[0]}")
def test_no_floor_admits_a_version_with_a_known_advisory(advisory: Advisory) -> None:
    reqs = runtime_requirements()
    name = canonicalize_name(advisory.package)
    assert name in reqs, f"{advisory.package} is used but not declared in pyproject.toml's dependencies"
    spec = reqs[name].specifier
    assert not admits_older_than(spec, Version(advisory.fixed)), (
        f"{advisory.package}{spec} admits versions before {advisory.fixed}: {advisory.advisory} ({advisory.what})"
    )


def test_the_checker_itself() -> None:
    fixed = Version("2.10.1")
    assert admits_older_than(SpecifierSet(">=2.10"), fixed)
    assert admits_older_than(SpecifierSet(""), fixed)
    assert admits_older_than(SpecifierSet("<3,!=2.9"), fixed)
    assert not admits_older_than(SpecifierSet(">=2.10.1"), fixed)
    assert not admits_older_than(SpecifierSet(">=2.13,!=3.0.0"), fixed)
    assert not admits_older_than(SpecifierSet("~=2.11"), fixed)


def test_every_runtime_dependency_was_reviewed() -> None:
    reviewed = {canonicalize_name(a.package) for a in ADVISORIES} | {canonicalize_name(n) for n in REVIEWED_CLEAN}
    unreviewed = sorted(set(runtime_requirements()) - reviewed)
    assert not unreviewed, f"review these for advisories and add them to the table: {unreviewed}"


def _imported_top_level_modules() -> set[str]:
    names: set[str] = set()
    for package in FIRST_PARTY:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "generate.py" and package == "protos":
                continue  # `make protos` only: grpc_tools is a test dependency
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - set(FIRST_PARTY) - {"__future__", "bench"}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """A package raftgate imports itself (cryptography) gets a floor of its own: it must not rely
    on whatever another dependency's extra happens to pull in."""
    declared = set(runtime_requirements())
    owners = importlib.metadata.packages_distributions()
    missing = {}
    for module in sorted(_imported_top_level_modules()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        assert dists, f"no installed distribution provides {module!r}"
        if not dists & declared:
            missing[module] = sorted(dists)
    assert not missing, f"imported but not declared in pyproject.toml's dependencies: {missing}"


def test_the_protobuf_floor_admits_no_runtime_the_generated_code_refuses() -> None:
    """The committed *_pb2.py files check the runtime at import: an older protobuf fails there."""
    gencode = set()
    for path in (ROOT / "protos").rglob("*_pb2.py"):
        m = re.search(r"# Protobuf Python Version: (\S+)", path.read_text())
        assert m, path
        gencode.add(Version(m.group(1)))
    spec = runtime_requirements()[canonicalize_name("protobuf")].specifier
    assert not admits_older_than(spec, max(gencode)), f"protobuf{spec} admits runtimes older than {max(gencode)}"
