"""Child processes of a raftgate program (``raftgate local``'s nodes and proxies, ``--workers``'
workers): their output passed on as it comes, and a graceful stop with a bound."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

log = logging.getLogger(__name__)


async def forward_output(proc: asyncio.subprocess.Process) -> None:
    """Copies the child's stdout to ours, line by line, until it closes."""
    assert proc.stdout is not None
    async for line in proc.stdout:
        sys.stdout.write(line.decode(errors="replace"))
        sys.stdout.flush()


async def stop_child(proc: asyncio.subprocess.Process | None, timeout: float, name: str | None = None) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; ``name``: log the kill as an error."""
    if proc is None or proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        if name is not None:
            log.error("%s (pid %d) did not stop in %.0fs; killed", name, proc.pid, timeout)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
