"""A test that reads a process's output once it has died sees every line the process wrote
(found by tests/faults/test_crash_points.py failing once: the victim had printed its fail point
line and died, but the thread pumping its output had not read the line yet when the test looked).
The printer stays alive until the test lets it go: one that exited at once failed its start, under
load, as a process dead before ready (found by a helper's stress runs of the unit tests)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.support.processes import Process


class _Printer(Process):
    """Prints its last words, then exits once ``go`` exists (it is ready at once): alive until the
    test lets it go, however late its start looks."""

    name = "printer"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.go = Path(workdir) / "go"

    def command(self) -> list[str]:
        wait = (f"import os, time; print('last words', flush=True); end = time.monotonic() + 30\n"
                f"while not os.path.exists({str(self.go)!r}) and time.monotonic() < end: time.sleep(0.01)")
        return [sys.executable, "-c", wait]

    def is_ready(self) -> bool:
        return True


def test_output_after_death_holds_what_the_process_wrote(tmp_path: Path, monkeypatch) -> None:
    pump = Process._pump

    def slow_pump(self: Process, proc, log) -> None:  # a reader thread that is late, as on a busy machine
        time.sleep(0.5)
        pump(self, proc, log)

    wait_ready = Process._wait_ready_or_dead

    def late_start(self: Process, timeout: float) -> None:  # a start that looks late, as on a busy machine
        time.sleep(0.3)
        wait_ready(self, timeout)

    monkeypatch.setattr(Process, "_pump", slow_pump)
    monkeypatch.setattr(Process, "_wait_ready_or_dead", late_start)
    printer = _Printer(tmp_path)
    printer.start()
    assert printer.proc is not None
    printer.go.touch()
    printer.proc.wait(timeout=30)
    assert "last words" in printer.output()
