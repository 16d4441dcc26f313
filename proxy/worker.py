"""``python -m proxy.worker INDEX FLAGS…``: one worker of ``raftgate proxy --workers N`` (started by
proxy/workers.py, never by hand)."""

import signal
import sys

from proxy.workers import stop_with_supervisor, worker_main

if __name__ == "__main__":
    # Until the worker sets up its graceful stop, a stop signal ends it quietly (no traceback).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(128 + signal.SIGINT))
    stop_with_supervisor()
    sys.exit(worker_main(sys.argv[1:]))
