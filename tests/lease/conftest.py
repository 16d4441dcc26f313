"""Lease tests reuse the conformance suite's etcdctl step runner (tests/conformance/ctl_steps.py)."""

from __future__ import annotations

import sys
from pathlib import Path

_CONFORMANCE = str(Path(__file__).resolve().parent.parent / "conformance")
if _CONFORMANCE not in sys.path:
    sys.path.insert(0, _CONFORMANCE)
