"""Crash points for fault tests, as etcd's gofail: off unless ``RAFTGATE_FAILPOINTS`` names them.

``RAFTGATE_FAILPOINTS="name=terms,name=terms"`` is read once, at start-up. ``terms`` is gofail's
small language: ``[N*]action`` steps chained with ``->``; ``N*`` runs a step on the next N hits
only, then moves on to the next step (``100*off->kill``: the 101st hit kills). Actions:

* ``off``: nothing;
* ``kill``: SIGKILL to this process (a crash as ``kill -9``: nothing is flushed or cleaned up);
* ``exit``: ``os._exit(1)`` (ends at once, as ``kill``, but with an exit code);
* ``panic``: raises :class:`FailpointPanic` where the point is, to exercise the fail-stop path.

With no variable set, :func:`hit` is one test of an empty dict. Every point is listed in
:data:`POINTS`; a name outside it is a configuration error, so a misspelt point cannot turn a
crash test into one that never crashes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Mapping

ENV = "RAFTGATE_FAILPOINTS"

#: Every point, with where it is.
POINTS: dict[str, str] = {
    "raftBeforeFsync": "log entries written to the WAL, not yet fsync'd (authstore/node/wal.py)",
    "raftAfterFsync": "the WAL fsync'd; a follower's acks not yet sent, a leader's commits not yet applied",
    "applyBeforeCommit": "a batch applied in its LMDB transaction, not yet committed",
    "raftMidSnapshotInstall": "a leader's snapshot replaced the store, the log does not record it yet",
    "walMidCheckpoint": "log compaction: the new WAL segment written, older segments not yet deleted",
}

ACTIONS = frozenset({"off", "kill", "exit", "panic"})


class FailpointError(ValueError):
    """RAFTGATE_FAILPOINTS names an unknown point or action."""


class FailpointPanic(Exception):
    """A point armed with ``panic`` was hit."""


class _Point:
    def __init__(self, name: str, terms: list[tuple[int | None, str]]) -> None:
        self.name = name
        self.terms = terms
        self.lock = threading.Lock()

    def next_action(self) -> str:
        with self.lock:
            while self.terms:
                count, action = self.terms[0]
                if count is None:
                    return action
                if count > 0:
                    self.terms[0] = (count - 1, action)
                    return action
                self.terms.pop(0)
            return "off"


_armed: dict[str, _Point] = {}


def parse(spec: str) -> dict[str, list[tuple[int | None, str]]]:
    """``name=terms,...`` -> {name: [(count or None, action), ...]}; raises FailpointError."""
    out: dict[str, list[tuple[int | None, str]]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, text = item.partition("=")
        if not sep or name not in POINTS:
            raise FailpointError(f"{ENV}: unknown fail point {name!r} (known: {', '.join(POINTS)})")
        terms: list[tuple[int | None, str]] = []
        for term in text.split("->"):
            count_text, star, action = term.strip().rpartition("*") if "*" in term else ("", "", term.strip())
            count = None
            if star:
                if not count_text.strip().isdigit():
                    raise FailpointError(f"{ENV}: bad count in {item!r}")
                count = int(count_text)
            if action.strip() not in ACTIONS:
                raise FailpointError(f"{ENV}: unknown action {action.strip()!r} in {item!r}")
            terms.append((count, action.strip()))
        out[name] = terms
    return out


def load(environ: Mapping[str, str]) -> list[str]:
    """Arms the points the environment names (once, at start-up); returns their names."""
    _armed.clear()
    for name, terms in parse(environ.get(ENV, "")).items():
        _armed[name] = _Point(name, terms)
    return sorted(_armed)


def hit(name: str) -> None:
    """Called where the point is; does nothing unless the point is armed."""
    if not _armed:
        return
    point = _armed.get(name)
    if point is None:
        return
    action = point.next_action()
    if action == "off":
        return
    # One line on stderr first, so a test can tell which point ended the process.
    os.write(sys.stderr.fileno(), f"raftgate store: fail point {name} hit: {action}\n".encode())
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "exit":
        os._exit(1)
    raise FailpointPanic(f"fail point {name}")
