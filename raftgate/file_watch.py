"""One way to tell that a file changed, for every reader that follows its files (JWT keys, CRLs,
client TLS files, identity files, workload user maps).

A file's stamp is what changes when it is replaced (Kubernetes swaps a Secret or ConfigMap volume
by symlink: the target's inode) or rewritten in place (mtime, size); ``os.stat`` follows symlinks
to the current content. A directory's stamp adds its entries' (names starting with ``.`` skipped:
Kubernetes keeps its ``..data`` machinery there), so a key added to or removed from it is seen.

:class:`FileWatch` keeps the stamp of the content in force and of the files that last failed to
load: a reader looks (no more than once per ``poll_interval``), reads only when the files are
neither, and so tries a broken file once, not at every look, and reports it once.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: one file's stamp: (path, dev, inode, mtime_ns, size), or (path, None) when it cannot be looked at
Stamp = tuple[Any, ...]


def file_stamp(path: str | Path) -> Stamp:
    """The stamp of one file; raises OSError when it cannot be looked at (naming it in ``filename``)."""
    st = os.stat(path)  # follows symlinks to the current content
    return (str(path), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def stamps(paths: Sequence[str | Path], *, strict: bool = False, dir_entries: int = 0) -> tuple[Stamp, ...]:
    """The stamps of ``paths``; a file that cannot be looked at is ``(path, None)`` (with ``strict``:
    raises OSError). A directory adds the stamps of its first ``dir_entries + 1`` entries by name."""
    out: list[Stamp] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            if strict:
                raise
            out.append((str(p), None))
            continue
        out.append((str(p), st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
        if dir_entries and stat.S_ISDIR(st.st_mode):
            try:
                names = sorted(n for n in os.listdir(p) if not n.startswith("."))[: dir_entries + 1]
            except OSError:
                names = []
            for name in names:
                try:
                    e = os.stat(Path(p) / name)
                    out.append((name, e.st_dev, e.st_ino, e.st_mtime_ns, e.st_size))
                except OSError:
                    out.append((name, None))
    return tuple(out)


def missing(found: tuple[Stamp, ...]) -> bool:
    """Whether a file of ``found`` could not be looked at."""
    return any(len(s) == 2 and s[1] is None for s in found)


class FileWatch:
    """Whether files changed since the content in force was read (callers serialise ``look``,
    ``took`` and ``failed``: they hold their own lock while they read).

    ``look()`` answers the files' stamps when they are due to be looked at (no more than once per
    ``poll_interval``, unless forced) and are neither the ones in force (``took``) nor the ones that
    last failed (``failed``); else None. Take the stamps before reading: a change during the read
    is seen at the next look."""

    def __init__(self, paths: Sequence[str | Path] = (), *, poll_interval: float = 0.0, dir_entries: int = 0,
                 clock: Callable[[], float] = time.monotonic, in_force: tuple[Stamp, ...] | None = None) -> None:
        self.paths = list(paths)
        self.poll_interval = poll_interval
        self.dir_entries = dir_entries
        self._clock = clock
        #: the stamps of the content in force (None: not known)
        self.good = in_force if in_force is not None else (self.stamps() if self.paths else None)
        #: the stamps of the files that last failed to load (None: none did since)
        self.bad: tuple[Stamp, ...] | None = None
        self._checked_at = clock()

    def stamps(self, paths: Sequence[str | Path] | None = None) -> tuple[Stamp, ...]:
        return stamps(self.paths if paths is None else paths, dir_entries=self.dir_entries)

    def due(self, *, force: bool = False) -> bool:
        """True when the files may be looked at now (then not again for ``poll_interval``): a
        clock read and a compare, cheap enough for every token checked."""
        now = self._clock()
        if not force and now - self._checked_at < self.poll_interval:
            return False
        self._checked_at = now
        return True

    def changed(self, paths: Sequence[str | Path] | None = None) -> tuple[Stamp, ...] | None:
        """The files' stamps if they are new (neither in force nor failed), else None; looks now."""
        found = self.stamps(paths)
        return None if found == self.good or found == self.bad else found

    def look(self, *, force: bool = False, paths: Sequence[str | Path] | None = None) -> tuple[Stamp, ...] | None:
        """The files' stamps if they are due and new, else None."""
        return self.changed(paths) if self.due(force=force) else None

    def took(self, found: tuple[Stamp, ...]) -> None:
        """The content read under ``found`` is in force."""
        self.good, self.bad = found, None

    def failed(self, found: tuple[Stamp, ...]) -> bool:
        """The files under ``found`` cannot be used (not read again until they change); True the
        first time they fail, for a reader to report it once."""
        first = found != self.bad
        self.bad = found
        return first
