"""A stop signal never meets its default action while a program stops, on either event loop.

Ctrl-C reaches every process of the group while `raftgate local` passes SIGTERM on, and a
`--workers` worker gets its supervisor's SIGTERM too: a program that stops gets several signals
at once. raftgate/stop_signals.py ignores them after the first; on asyncio's loop it makes the
loop forget its handlers without restoring the default action, but uvloop has no such dict, and its
``remove_signal_handler`` sets SIG_DFL for a moment before the signal was ignored again.

Finding (attack on the uvloop change): under a burst of SIGTERMs, 7 of 20 processes on uvloop were
killed by SIGTERM (-15) instead of stopping with 0 (failed before the fix).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.processes import REPO_ROOT

CHILD = """
import asyncio, os, signal, sys
from raftgate import event_loop
from raftgate.stop_signals import stop_on_signals

async def main() -> None:
    loop = asyncio.get_running_loop()
    if sys.argv[2] == "inject":  # a SIGTERM lands right after the loop's handler is removed
        remove = loop.remove_signal_handler

        def removing(sig):
            done = remove(sig)
            os.kill(os.getpid(), signal.SIGTERM)
            return done

        loop.remove_signal_handler = removing
    stop = asyncio.Event()
    stop_on_signals(stop)
    print("ready", flush=True)
    await stop.wait()
    print("stopped", flush=True)

event_loop.run(main(), sys.argv[1])
"""


def _stop(loop: str, how: str) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, loop, how], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C does
    end = time.monotonic() + (0.3 if how == "burst" else 0)
    while proc.poll() is None and time.monotonic() < end:  # what raftgate local passes on, many times
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_sigterm_right_after_the_handler_is_removed_is_ignored(loop: str) -> None:
    code, out = _stop(loop, "inject")
    assert (code, out) == (0, "stopped\n")


def test_a_burst_of_stop_signals_stops_the_process_cleanly() -> None:
    """(uvloop only: on asyncio's loop such a burst can leave the process stuck in its signal
    handler's wake-up write, a limit of asyncio's self-pipe; the store and the proxy run on uvloop.)"""
    codes = [_stop("uvloop", "burst")[0] for _ in range(8)]
    assert codes == [0] * 8, codes
