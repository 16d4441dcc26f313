"""Child processes and the data dir they use, for every raftgate program that starts others.

``raftgate local`` (its store nodes and proxies), ``raftgate proxy --workers`` (its workers), the
store (its data-dir lock) and the bench (the systems it measures) each had a copy of these; the
copies had begun to differ. One place now for: starting a child and waiting for its ready line,
passing its output on, passing a signal on to it, stopping it (SIGTERM, then SIGKILL after a
bound), whether a port can be listened on before a child is started on it, telling a child the
stop reached before its own handlers from a failed one, and the exclusive lock on a data dir.
The graceful stop on SIGTERM/SIGINT itself: raftgate/stop_signals.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from raftgate.stop_signals import add_signal_handler

log = logging.getLogger(__name__)

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
#: In a data dir, locked (flock) by the process that uses it; holds that process's pid.
LOCK_FILE = "raftgate.lock"
#: The exit codes of a child that a stop signal ended before its own handler was set (asyncio's
#: negative signal number, or the shell's 128 + n from raftgate.cli's early handler).
STOPPED_BY_SIGNAL = frozenset({-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT})


class Child:
    """A child process (``sys.executable`` + ``args``) whose stdout is ours: lines before its ready
    line are passed on (the ready line too with ``echo_ready``), then every line as it comes."""

    def __init__(self, name: str, args: Sequence[str], *, ready_prefix: str, echo_ready: bool = True,
                 env: Mapping[str, str] | None = None, log_kill: bool = False) -> None:
        self.name = name
        self.args = list(args)
        self.ready_prefix = ready_prefix
        self.echo_ready = echo_ready
        self.env = None if env is None else dict(env)
        #: a child that must be killed is logged as an error (a worker: it should have stopped)
        self.log_kill = log_kill
        self.proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        #: printed its ready line (its own signal handlers are set: a signal may be passed on)
        self.ready = False

    async def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Starts it and returns once its ready line came; RuntimeError if it exits first or does
        not say ready within ``timeout`` seconds."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, *self.args, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
            env=self.env,
        )  # fmt: skip
        assert self.proc.stdout is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                async with asyncio.timeout_at(max(deadline, loop.time() + 0.01)):
                    line = await self.proc.stdout.readline()
            except TimeoutError:
                raise RuntimeError(f"{self.name} did not become ready in {timeout:.0f}s") from None
            if not line:
                code = await self.proc.wait()
                raise RuntimeError(f"{self.name} exited with code {code} before it was ready")
            text = line.decode(errors="replace")
            ready = text.startswith(self.ready_prefix)
            if not ready or self.echo_ready:
                sys.stdout.write(text)
            if ready:
                break
        sys.stdout.flush()
        self.ready = True
        self._pump = loop.create_task(forward_output(self.proc))

    def signal(self, sig: int) -> None:
        """Passes ``sig`` on once the child is ready (before, its default action could end it)."""
        if self.ready and self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        await stop_child(self.proc, timeout, self.name if self.log_kill else None)


def pass_on(sig: int, children: Iterable[Child]) -> None:
    """``sig`` to every ready child (SIGHUP: each reopens its log; one still starting opens it anyway)."""
    for child in children:
        child.signal(sig)


def on_sighup(handler: Callable[[], None]) -> None:
    """SIGHUP calls ``handler`` (logrotate's signal to reopen a log file) instead of ending the
    process. Installed only when there is a file to reopen, so SIGHUP's usual meaning stays."""
    add_signal_handler(asyncio.get_running_loop(), signal.SIGHUP, handler)


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
        async with asyncio.timeout(timeout):
            await proc.wait()
    except TimeoutError:
        if name is not None:
            log.error("%s (pid %d) did not stop in %.0fs; killed", name, proc.pid, timeout)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def stop_group(proc: subprocess.Popen[bytes], timeout: float = STOP_TIMEOUT) -> None:
    """The blocking stop of a child started in a session of its own (``start_new_session``):
    SIGTERM to its whole group, then SIGKILL to whatever of it is left after ``timeout`` seconds."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def check_listenable(host: str, port: int) -> None:
    """Raises OSError unless ``host:port`` can be listened on now, as the servers listen
    (SO_REUSEADDR: a port in TIME_WAIT is free). Checked before starting a server that would
    otherwise fail later and less clearly."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    socket.create_server((host, port), family=family).close()


class DataDirInUse(Exception):
    """Another process holds the data dir's lock; ``str()`` names it as the refusal to start."""


def lock_data_dir(data_dir: Path, user: str = "process") -> int:
    """An exclusive lock on ``data_dir`` for the life of the process, taken before anything in it
    is opened: two programs on one data dir corrupt it or stall a cluster (etcd locks its WAL
    files). The kernel drops the lock when the process ends, however it ends. Returns the lock
    file's descriptor (kept open); raises DataDirInUse naming the holder's pid, ``user`` saying
    what may use a data dir ("one <user> per data dir"), or OSError."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 20, 0).decode("ascii", "replace").strip()
        os.close(fd)
        pid = f" (pid {holder})" if holder.isdigit() else ""
        raise DataDirInUse(f"the data dir {data_dir.resolve()} is in use by another raftgate process{pid}; refusing to "
                           f"start (one {user} per data dir)") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
