"""raftgate/process.py, the one child-process and data-dir-lock code of every launcher (raftgate
local, proxy --workers, the store, the bench): what a user sees of it, a child at a time."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from raftgate.process import LOCK_FILE, Child, DataDirInUse, lock_data_dir

#: prints a line, its ready line, and one more, then waits for SIGTERM and exits 0 (a clean stop)
SERVES = """
import signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGHUP])
print("starting", flush=True)
print("READY on 1", flush=True)
print("after ready", flush=True)
while (got := signal.sigwait([signal.SIGTERM, signal.SIGHUP])) == signal.SIGHUP:
    print("reopened", flush=True)
print("stopping", flush=True)
"""


def test_second_lock_on_a_data_dir_is_refused_naming_the_holder(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path, "raftgate local")
    try:
        assert (tmp_path / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(DataDirInUse) as refused:
            lock_data_dir(tmp_path, "raftgate local")
        assert str(refused.value) == (
            f"the data dir {tmp_path.resolve()} is in use by another raftgate process (pid {os.getpid()}); "
            "refusing to start (one raftgate local per data dir)")
    finally:
        os.close(fd)
    os.close(lock_data_dir(tmp_path))  # free again once the holder closes it


def test_child_passes_output_on_signals_and_stops(capfd: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> int | None:
        child = Child("server", ["-c", SERVES], ready_prefix="READY")
        await child.start()
        assert child.ready
        child.signal(signal.SIGHUP)
        while "reopened" not in capfd.readouterr().out:
            await asyncio.sleep(0.05)  # polls a condition
        await child.stop()
        assert child.proc is not None
        return child.proc.returncode

    assert asyncio.run(scenario()) == 0


def test_child_ready_line_can_be_kept_back(capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        child = Child("worker 1", ["-c", SERVES], ready_prefix="READY", echo_ready=False)
        await child.start()
        await child.stop()

    asyncio.run(scenario())
    out = capsys.readouterr().out
    assert "starting\n" in out and "READY" not in out


def test_child_that_exits_before_ready_is_an_error() -> None:
    async def scenario() -> None:
        await Child("store node1", ["-c", "import sys; print('no'); sys.exit(3)"], ready_prefix="READY").start()

    with pytest.raises(RuntimeError, match=r"^store node1 exited with code 3 before it was ready$"):
        asyncio.run(scenario())


def test_child_that_ignores_sigterm_is_killed(caplog: pytest.LogCaptureFixture) -> None:
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('READY', flush=True)\n" \
              "while True: time.sleep(1)"

    async def scenario() -> int | None:
        child = Child("worker 2", ["-c", ignores], ready_prefix="READY", log_kill=True)
        await child.start()
        await child.stop(timeout=0.2)
        assert child.proc is not None
        return child.proc.returncode

    assert asyncio.run(scenario()) == -signal.SIGKILL
    assert "worker 2 (pid" in caplog.text and "did not stop in 0s; killed" in caplog.text
