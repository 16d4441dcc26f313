"""A test that reads a process's output once it has died sees every line the process wrote
(found by tests/faults/test_crash_points.py failing once: the victim had printed its fail point
line and died, but the thread pumping its output had not read the line yet when the test looked)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.support.processes import Process


class _Printer(Process):
    name = "printer"

    def command(self) -> list[str]:
        return [sys.executable, "-c", "print('last words', flush=True)"]

    def is_ready(self) -> bool:
        return True


def test_output_after_death_holds_what_the_process_wrote(tmp_path: Path, monkeypatch) -> None:
    pump = Process._pump

    def slow_pump(self: Process, proc, log) -> None:  # a reader thread that is late, as on a busy machine
        time.sleep(0.5)
        pump(self, proc, log)

    monkeypatch.setattr(Process, "_pump", slow_pump)
    printer = _Printer(tmp_path)
    printer.start()
    assert printer.proc is not None
    printer.proc.wait(timeout=10)
    assert "last words" in printer.output()
