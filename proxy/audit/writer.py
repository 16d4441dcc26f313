"""The audit log's writer: a queue bounded in bytes, drained by one thread (``--audit-log``).

Writes never block the event loop: records go into the queue and one writer thread drains it with
plain ``os.write`` calls. At the bound a record is dropped and counted
(``raftgate_proxy_audit_records_dropped_total``); with ``--audit-fail-closed`` a request is
admitted only when the log is writable and its record is sure to fit (room is reserved when the
request arrives). A write that fails is kept and tried again (every ``RETRY_SECONDS``, or at once
on SIGHUP, which also reopens the file for logrotate), so a full disk loses nothing until the
queue is full.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time

import grpc

from proxy import metrics
from proxy.audit.records import AUTH_METHODS, MAX_RECORD_BYTES, is_refusal
from raftgate.byte_queue import ByteBudget
from raftgate.methods import Method

log = logging.getLogger("proxy.audit")

STDOUT = "-"
LEVELS = ("auth", "denials", "all")
DEFAULT_LEVEL = "denials"
#: Bytes of records (and reservations) the queue holds at most.
QUEUE_BYTES = 8 << 20
RETRY_SECONDS = 1.0  # a log that cannot be written is tried again this often
BATCH_BYTES = 256 << 10  # written with one os.write


class AuditLogError(OSError):
    """The audit log cannot be opened at start-up."""


class AuditLog:
    """The queue (bounded in bytes) and the writer thread behind ``--audit-log``.

    The event loop only calls ``admit``/``submit``/``release``/``reopen`` (a short lock, no I/O);
    the writer thread does every open and write.
    """

    def __init__(self, path: str, level: str = DEFAULT_LEVEL, *, fail_closed: bool = False,
                 queue_bytes: int = QUEUE_BYTES) -> None:
        if level not in LEVELS:
            raise ValueError(f"audit level {level!r} is not one of {', '.join(LEVELS)}")
        self.path = path
        self.level = level
        self.fail_closed = fail_closed
        self.queue_bytes = queue_bytes
        self._lock = threading.Condition(threading.Lock())
        self._lines: collections.deque[bytes] = collections.deque()
        #: bytes in _lines and _unwritten, and MAX_RECORD_BYTES per reservation: at most
        #: ``queue_bytes`` (a record that does not fit is dropped, a request refused; nobody waits
        #: on its room, which the writer thread sets: a threading.Event)
        self._budget = ByteBudget(queue_bytes + 1, queue_bytes, room=threading.Event())
        self._reservations = 0  # rooms promised to admitted requests
        self._unwritten = b""  # the rest of a batch whose write failed: written first, never dropped
        self._writable = True
        self._reopen = False
        self._closing = False
        self._dropping = False  # logged once per episode
        self._fd: int | None = None
        self._thread: threading.Thread | None = None

    # -- life

    def start(self) -> None:
        """Opens the file (an AuditLogError if it cannot: better to stop than to serve unaudited)
        and starts the writer thread."""
        try:
            self._fd = self._open()
        except OSError as e:
            raise AuditLogError(f"--audit-log: cannot open {self.path!r}: {e.strerror}") from None
        metrics.AUDIT_WRITABLE.set(1)
        self._thread = threading.Thread(target=self._run, name="raftgate-audit", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Writes what is queued (for at most ``timeout`` seconds), then stops the thread."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._fd is not None and self.path != STDOUT and (self._thread is None or not self._thread.is_alive()):
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def reopen(self) -> None:
        """SIGHUP: the writer closes and opens the file again (logrotate), and retries at once."""
        with self._lock:
            self._reopen = True
            self._lock.notify_all()

    # -- the event loop's side

    def wants(self, method: Method, code: grpc.StatusCode | None) -> bool:
        """Whether this level records a call of ``method`` that ended with ``code``."""
        if self.level == "all" or method in AUTH_METHODS:
            return True
        return self.level == "denials" and is_refusal(code)

    def admit(self) -> bool:
        """Fail-closed admission: the log is writable and one record's room is reserved (give it
        back with ``submit(..., reserved=True)`` or ``release``). Without fail-closed: True."""
        if not self.fail_closed:
            return True
        with self._lock:
            if self._writable and self._budget.fits(MAX_RECORD_BYTES):
                self._budget.charge(MAX_RECORD_BYTES)
                self._reservations += 1
                return True
        metrics.AUDIT_REFUSALS.inc()
        return False

    def release(self, count: int = 1) -> None:
        if self.fail_closed and count:
            with self._lock:
                self._unreserve(count)

    def submit(self, line: bytes, *, reserved: bool = False) -> bool:
        """Queues one record; False (dropped, counted) when it does not fit."""
        with self._lock:
            if reserved and self.fail_closed:
                self._unreserve(1)  # the record takes its place
            elif not self._budget.fits(len(line)):
                first = not self._dropping
                self._dropping = True
                metrics.AUDIT_DROPPED.inc()
                if first:
                    log.warning("audit log queue full (%d bytes): records are dropped and counted in "
                                "raftgate_proxy_audit_records_dropped_total", self.queue_bytes)
                return False
            self._lines.append(line)
            self._budget.charge(len(line))
            metrics.AUDIT_QUEUE_BYTES.set(self._queued)
            self._lock.notify_all()
            return True

    def _unreserve(self, count: int) -> None:
        """Under the lock: ``count`` reservations given back (no more than are held)."""
        count = min(count, self._reservations)
        self._reservations -= count
        self._budget.release(count * MAX_RECORD_BYTES)

    @property
    def _queued(self) -> int:
        """Bytes of records waiting (in _lines and _unwritten), reservations left out."""
        return self._budget.bytes - self._reservations * MAX_RECORD_BYTES

    @property
    def writable(self) -> bool:
        return self._writable

    # -- the writer thread

    def _open(self) -> int:
        if self.path == STDOUT:
            return 1
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _run(self) -> None:
        retry_at = 0.0  # while the log cannot be written: when to try again
        while True:
            with self._lock:
                while not (self._closing or self._reopen):
                    if not self._writable:
                        left = retry_at - time.monotonic()
                        if left <= 0:
                            break
                        self._lock.wait(left)
                    elif self._lines or self._unwritten:
                        break
                    else:
                        self._lock.wait()
                reopen, self._reopen = self._reopen, False
                closing = self._closing
                # only the lines are taken here (the event loop waits for this lock at every
                # request); the batch is joined outside it, in linear time
                parts = [self._unwritten] if self._unwritten else []
                size = len(self._unwritten)
                while self._lines and size < BATCH_BYTES:
                    parts.append(self._lines.popleft())
                    size += len(parts[-1])
                self._unwritten = b""
            batch = b"".join(parts)
            if closing and not batch and not reopen:
                return
            written, error = self._write(batch, reopen)
            with self._lock:
                self._unwritten = batch[written:]
                self._budget.release(written)
                metrics.AUDIT_QUEUE_BYTES.set(self._queued)
                if written:
                    metrics.AUDIT_WRITTEN.inc(batch.count(b"\n", 0, written))
                if error is None:
                    if not self._writable:
                        log.warning("audit log %s is writable again", self.path)
                    self._writable, self._dropping = True, False
                else:
                    metrics.AUDIT_WRITE_ERRORS.inc()
                    if self._writable:
                        log.error("audit log %s cannot be written (%s): records wait in the queue (at most %d "
                                  "bytes); %s", self.path, error.strerror or error, self.queue_bytes,
                                  "requests are refused (--audit-fail-closed)" if self.fail_closed
                                  else "beyond it they are dropped")
                    self._writable = False
                    retry_at = time.monotonic() + RETRY_SECONDS
                metrics.AUDIT_WRITABLE.set(1 if self._writable else 0)
                if closing and (error is not None or not (self._lines or self._unwritten)):
                    return

    def _write(self, batch: bytes, reopen: bool) -> tuple[int, OSError | None]:
        """Writes ``batch`` (reopening first if asked or if the file is not open); returns the bytes
        written and the error that stopped it."""
        try:
            if reopen or self._fd is None:
                if self._fd is not None and self.path != STDOUT:
                    with contextlib.suppress(OSError):
                        os.close(self._fd)
                self._fd = None
                self._fd = self._open()
        except OSError as e:
            return 0, e
        written = 0
        view = memoryview(batch)
        try:
            while written < len(batch):
                written += os.write(self._fd, view[written:])
        except OSError as e:
            return written, e
        return written, None
