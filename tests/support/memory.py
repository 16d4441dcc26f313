"""A process's memory from /proc, and the 100 KiB values the watch memory tests put."""

from __future__ import annotations

from pathlib import Path

VALUE = 100 * 1024


def memory_kib(pid: int, field: str) -> int:
    """A /proc/<pid>/status field in KiB (VmRSS; RssAnon leaves out LMDB's file-backed map)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def value(i: int) -> bytes:
    return b"%08d" % i + b"x" * (VALUE - 8)
