"""Graceful stop on SIGTERM/SIGINT, for every long-running program (proxy, store, raftgate local).

The first SIGTERM or SIGINT sets the program's stop event; later ones are ignored while it winds
down (Ctrl-C reaches the whole process group, and `raftgate local` passes SIGTERM on at the same
moment). The handlers are replaced by one that does nothing, never removed, while the loop runs:
asyncio restores a signal's default action when its handler is removed, and a SIGTERM arriving in
that moment killed the process with -15 (tests/unit/test_stop_signals.py).
"""

from __future__ import annotations

import asyncio
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def stop_on_signals(stop: asyncio.Event) -> None:
    """Sets ``stop`` on the first SIGTERM or SIGINT; ignores the ones after it."""
    loop = asyncio.get_running_loop()

    def stopping() -> None:
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, _ignored)  # replaces the handler: no default action meanwhile
        stop.set()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stopping)


def _ignored() -> None:
    """A stop signal after the first: the program is already stopping."""
