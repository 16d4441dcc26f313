"""The audit writer thread shares one lock with the event loop (``admit``/``submit`` take it at
every request): what it does while holding it must stay proportional to what it takes out of the
queue. Building a 256 KiB batch with ``batch += line`` copied the growing batch once per line
(quadratic: ~100 ms for 900 lines of 300 bytes on the development machine), all under the lock,
so a busy ``--audit-level all`` log stalled every request's submit behind it."""

from __future__ import annotations

from pathlib import Path

from proxy.audit.writer import AuditLog

LINE = b"x" * 299 + b"\n"


def test_the_writer_copies_each_byte_a_bounded_number_of_times_under_the_lock(tmp_path: Path) -> None:
    audit = AuditLog(str(tmp_path / "audit.log"), "all")
    copied_under_lock = [0]

    def held() -> bool:
        if audit._lock.acquire(blocking=False):  # noqa: SLF001 - the lock is what the test is about
            audit._lock.release()  # noqa: SLF001
            return False
        return True

    class Line(bytes):
        """Counts the bytes a concatenation with it copies while the queue's lock is held."""

        def __radd__(self, other: bytes) -> bytes:
            if held():
                copied_under_lock[0] += len(other) + len(self)
            return bytes(other) + bytes(self)

    count = 2000
    for _ in range(count):
        assert audit.submit(Line(LINE))
    audit.start()
    audit.close()
    assert (tmp_path / "audit.log").read_bytes() == LINE * count
    assert copied_under_lock[0] <= 2 * len(LINE) * count
