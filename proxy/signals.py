"""SIGHUP reopens the audit log (the graceful stop on SIGTERM/SIGINT: raftgate/stop_signals.py)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable


def reopen_on_sighup(reopen: Callable[[], None]) -> None:
    """SIGHUP calls ``reopen`` (logrotate's signal to reopen a log file) instead of ending the
    process. Installed only when there is a file to reopen, so SIGHUP's usual meaning stays."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reopen)
