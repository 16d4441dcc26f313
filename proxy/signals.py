"""Graceful stop on SIGTERM/SIGINT for the proxy and ``raftgate local``; SIGHUP reopens the audit log."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: asyncio.Event) -> None:
    """The first SIGTERM or SIGINT sets ``stop``; later ones are ignored for the rest of the
    process's life. asyncio restores the default action when its loop closes, so a second signal
    while the process winds down (Ctrl-C reaches the whole process group, then ``raftgate local``
    passes SIGTERM on to its children) would otherwise kill it with -15 or a KeyboardInterrupt."""
    loop = asyncio.get_running_loop()

    def stopping() -> None:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)
        stop.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stopping)


def reopen_on_sighup(reopen: Callable[[], None]) -> None:
    """SIGHUP calls ``reopen`` (logrotate's signal to reopen a log file) instead of ending the
    process. Installed only when there is a file to reopen, so SIGHUP's usual meaning stays."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reopen)
