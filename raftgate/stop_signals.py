"""Graceful stop on SIGTERM/SIGINT, for every long-running program (proxy, store, raftgate local).

The first SIGTERM or SIGINT sets the program's stop event; every later one is ignored for the rest
of the process's life (Ctrl-C reaches the whole process group while `raftgate local` passes SIGTERM
on; a `--workers` worker also gets SIGTERM when its supervisor goes). A stop signal must never meet
its default action meanwhile: asyncio restores it whenever it removes a handler, and when its loop
closes, and a SIGTERM arriving then killed the process with -15 (tests/unit/test_stop_signals.py).
So the signals are ignored first, and then asyncio is made to forget its handlers.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from raftgate.event_loop import is_uvloop

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: A gRPC server option of every raftgate server a client can hold open: a graceful stop's GOAWAY
#: waits for the client's answer to a PING, min(this, 20 s). A client that stopped reading its
#: socket never answers, and held the proxy's stop 20 s, past ``raftgate local``'s 10 s (it killed
#: the proxy) and near a pod's 30 s grace (tests/system/test_clean_start_stop.py). It is also how
#: long a server's keepalive PING (sent after two idle hours) may go unanswered: 5 s, not 20.
STOP_PING_TIMEOUT = ("grpc.keepalive_timeout_ms", 5_000)


def stop_on_signals(stop: asyncio.Event) -> None:
    """Sets ``stop`` on the first SIGTERM or SIGINT; ignores the ones after it, also once the loop
    has closed."""
    loop = asyncio.get_running_loop()

    def stopping() -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # from now on the kernel drops them
            _forget(loop, sig)
        stop.set()

    for sig in STOP_SIGNALS:
        add_signal_handler(loop, sig, stopping)


def add_signal_handler(loop: asyncio.AbstractEventLoop, sig: int, callback: Callable[[], None]) -> None:
    """``loop.add_signal_handler(sig, callback)``, its wake-up socket then quiet (``quiet_wakeup``):
    every signal handler of raftgate's programs is added here, so none asks for the report again."""
    loop.add_signal_handler(sig, callback)
    quiet_wakeup(loop)


def quiet_wakeup(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's wake-up socket reports no full buffer (each ``add_signal_handler`` of asyncio's
    asks for it again: ``add_signal_handler`` above calls this after it). asyncio's loop asks
    CPython for that report, which its C signal handler queues under a lock: a burst of signals
    filling the socket deadlocked the process inside the handler (12 of 20 hung). The signals
    already in the socket wake the loop anyway; uvloop asks for no report."""
    sock = getattr(loop, "_csock", None)  # asyncio's loop; uvloop's is out of reach, and quiet
    if sock is not None:
        signal.set_wakeup_fd(sock.fileno(), warn_on_full_buffer=False)


def _forget(loop: asyncio.AbstractEventLoop, sig: int) -> None:
    """asyncio forgets its handler of ``sig`` without setting the default action (its public
    ``remove_signal_handler`` sets it, for a moment here and for good when the loop closes)."""
    handlers = getattr(loop, "_signal_handlers", None)
    if isinstance(handlers, dict):
        handlers.pop(sig, None)
    elif is_uvloop(loop):
        # uvloop keeps its handlers out of reach, and its remove_signal_handler sets SIG_DFL for
        # a moment (a burst of SIGTERMs killed 7 processes of 20). Its handler is left in place:
        # the signal is ignored now, and uvloop never restores the default once its loop stopped
        # (its removal does nothing then, at close too).
        pass
    else:  # another loop implementation: its own removal, then ignored again at once
        loop.remove_signal_handler(sig)
        signal.signal(sig, signal.SIG_IGN)
