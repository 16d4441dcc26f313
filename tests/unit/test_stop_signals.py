"""A stop signal never falls back to its default action while a program stops, nor after its loop closed.

Found in a full run: after a Ctrl-C, `raftgate local`'s client proxy exited with -15 (killed by
SIGTERM) without logging that it stopped. Ctrl-C reaches every process of the group and `raftgate
local` passes SIGTERM on at the same moment; the first signal's handler took asyncio's handlers
away (asyncio restores the default action when it does) before ignoring the signals, and a
SIGTERM landing between the two killed the process. A first fix (handlers replaced, not removed)
left the signals to their default action once the loop closed: a `--workers` worker then died
with -15 of the SIGTERM that comes while it winds down. The proxy and the store share the handler.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from raftgate.stop_signals import stop_on_signals


def test_sigterm_never_gets_its_default_action_while_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    dispositions: list[tuple[int, Any]] = []
    real = signal.signal

    def recording(sig: int, handler: Any) -> Any:
        dispositions.append((sig, handler))
        return real(sig, handler)

    async def run() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        monkeypatch.setattr(signal, "signal", recording)
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does
        await asyncio.wait_for(stop.wait(), 10)
        os.kill(os.getpid(), signal.SIGTERM)  # what raftgate local passes on: ignored
        await asyncio.sleep(0.05)
        monkeypatch.setattr(signal, "signal", real)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        asyncio.run(run())
        # the loop has closed; the process still winds down (a worker's supervisor may be gone, and
        # its SIGTERM arrives now): still ignored
        after_close = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # the closed loop's wake-up socket is still the process's (its handlers were forgotten, not
        # removed): a later loop in this process (tests/system/test_event_loop.py) restoring it failed
        signal.set_wakeup_fd(-1)
    assert (signal.SIGTERM, signal.SIG_DFL) not in dispositions, dispositions
    assert after_close == (signal.SIG_IGN, signal.SIG_IGN)
