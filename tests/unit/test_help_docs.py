"""`raftgate --help` and each subcommand's `--help` name the docs page that tells more, and that
page exists (issue 23: the help says briefly what the docs say)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# command → the pages its help must name (the page that holds its flags or its subject).
PAGES = {
    "": {"docs/README.md"},
    "store": {"docs/operations.md", "docs/configuration.md"},
    "proxy": {"docs/configuration.md", "docs/kubernetes.md"},
    "local": {"docs/configuration.md", "docs/operations.md"},
    "bootstrap-auth": {"docs/kubernetes.md"},
    "snapshot": {"docs/operations.md"},
    "bench": {"docs/benchmarks.md"},
}


def _help(command: str) -> str:
    argv = [sys.executable, "-m", "raftgate.cli", *([command] if command else []), "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", sorted(PAGES), ids=lambda c: c or "raftgate")
def test_help_names_the_docs_page(command: str) -> None:
    text = " ".join(_help(command).split())  # argparse wraps the epilog
    named = set(re.findall(r"docs/[A-Za-z-]+\.md|README\.md", text))
    assert PAGES[command] <= named, (command, sorted(named))
    for page in named:
        assert (ROOT / page).is_file(), page
