"""``python -m authstore.etcd_format.export STORE_COPY_DIR OUT STORE_PID``: writes a client snapshot in
etcd's format from a copy of the store, in a process of its own.

Writing etcd's file is Python work over every revision (seconds for a few hundred thousand); in
the store's process it would hold the GIL the event loop serving clients needs. The store runs it
here and waits in a worker thread. The process ends itself when the store (STORE_PID, its
parent) dies, so a store killed mid-snapshot leaves no writer behind; the store names itself
because it may be gone before this process runs its first line.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

#: how often the writer checks that the store that started it is still there (seconds)
PARENT_CHECK = 0.5


def command(store_copy: Path, out: Path) -> list[str]:
    """How the store starts this writer: it names itself (this process's parent) last."""
    return [sys.executable, "-m", "authstore.etcd_format.export", str(store_copy), str(out), str(os.getpid())]


def _exit_with_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(PARENT_CHECK)  # a watchdog's period, not a wait for a condition


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit():
        print("usage: python -m authstore.etcd_format.export STORE_COPY_DIR OUT STORE_PID", file=sys.stderr)
        return 2
    if os.getppid() != int(argv[2]):
        return 3  # the store is gone already
    threading.Thread(target=_exit_with_parent, args=(int(argv[2]),), daemon=True).start()
    source, out = Path(argv[0]), Path(argv[1])
    if not (source / "data.mdb").is_file():  # gone: the store removed it (a cancelled snapshot)
        print(f"no store copy in {source}", file=sys.stderr)
        return 1
    from authstore.etcd_format.snapshot import write_etcd_file  # after the watchdog: imports take a while

    write_etcd_file(source, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
