"""Keys fetched from a source, and how long they are trusted: the one fetch-and-freshness policy.

Used by etcd's ``jwks-url`` follower (raftgate/jwt_keys.py ``JwksFollower``, periodic, on the event
loop, feeding a ``KeyRing``) and by workload identity's issuer keys (raftgate/workload_identity.py
``KeySet``, lazy, in whichever thread verifies). Each brings its source (a fetch that raises
``OSError`` or ``ValueError``) and its :class:`Freshness`; the rules are the same for both:

* keys older than ``max_age`` are due to be fetched again (the follower fetches every
  ``max_age``; the key set when it is next asked);
* a token naming an unknown ``kid`` fetches again, at most once per ``refetch_interval`` counted
  from the start of the last fetch (:meth:`FetchedKeys.refetch_wait` says how long until then:
  the follower's callers on the event loop wait that out, a workload token is refused meanwhile);
* a failed fetch keeps the keys fetched before while the last good fetch is younger than
  ``max_stale``, then they stop verifying (a new generation); ``max_stale`` 0 drops them at the
  first failure (a file that was deleted: nothing is waiting to come back);
* a failure is logged once, then again only after a success; the drop is logged once.

One fetch at a time, made outside the lock: while it waits on a slow source, known keys are
still answered. ``generation()`` moves whenever the keys in force change (fetched anew and
different, or dropped), so results cached under an older one are not answered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Sized)


@dataclass(frozen=True)
class Freshness:
    """How long fetched keys are fresh, how often an unknown kid may fetch, how long they may
    outlive failed fetches (seconds)."""

    max_age: float
    refetch_interval: float
    max_stale: float


class FetchedKeys(Generic[K]):
    """The keys ``fetch`` returns, kept as :class:`Freshness` says; thread-safe.

    ``same(old, new)`` tells whether a fetch brought the keys already in force (then no new
    generation). ``what`` starts every log line (it names the source, never a key).
    ``on_fetch(ok)`` is told each fetch's outcome (the metrics)."""

    def __init__(self, fetch: Callable[[], K], what: str, freshness: Freshness, *,
                 same: Callable[[K, K], bool], clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger = log, on_fetch: Callable[[bool], None] | None = None) -> None:
        self._fetch = fetch
        self.what = what
        self.freshness = freshness
        self._same = same
        self._clock = clock
        self._log = logger
        self._on_fetch = on_fetch or (lambda ok: None)
        self._lock = threading.Condition()
        self._keys: K | None = None
        self._generation = 0
        self._fetched_at: float | None = None  # last successful fetch
        self._tried_at: float | None = None  # last attempt's start
        self._fetching = False
        self._failing = False  # a failure was logged; the next is not, until a fetch succeeds
        #: fetches started (tests and metrics count them)
        self.fetches = 0

    # -- what is in force
    def keys(self) -> K | None:
        """The keys in force (None: none), without those past ``max_stale``; no I/O, no lock
        unless the keys are just now too old."""
        keys, fetched_at = self._keys, self._fetched_at
        if keys is None or fetched_at is None or not self._too_old(fetched_at, self._clock()):
            return keys
        with self._lock:
            self._drop_if_too_old(self._clock())
            return self._keys

    def generation(self) -> int:
        """The keys in force now (those past ``max_stale`` dropped first; no I/O)."""
        with self._lock:
            self._drop_if_too_old(self._clock())
            return self._generation

    def _too_old(self, fetched_at: float, now: float) -> bool:
        return self.freshness.max_stale > 0 and now - fetched_at >= self.freshness.max_stale

    def _drop_if_too_old(self, now: float) -> None:
        """With the lock held: keys past ``max_stale`` since their fetch leave (a new generation)."""
        if self._keys and self._fetched_at is not None and self._too_old(self._fetched_at, now):
            self._log.error("%s: keys too old (no successful fetch for %.0f s): they no longer verify until a "
                            "fetch succeeds", self.what, now - self._fetched_at)
            self._drop()

    def _drop(self) -> None:
        self._keys = None
        self._generation += 1

    # -- when to fetch
    def due(self, now: float) -> bool:
        """Whether the keys are older than ``max_age`` (and no attempt was made since, within the
        refetch interval)."""
        f = self.freshness
        return ((self._fetched_at is None or now - self._fetched_at >= f.max_age)
                and (self._tried_at is None or now - self._tried_at >= min(f.refetch_interval, f.max_age)))

    def refresh_due(self) -> bool:
        """Whether the keys are due to be fetched again and no fetch is under way."""
        with self._lock:
            return not self._fetching and self.due(self._clock())

    def refetch_wait(self, now: float) -> float:
        """Seconds until an unknown kid may fetch again (0: now): ``refetch_interval`` after the
        last fetch started."""
        if self._tried_at is None:
            return 0.0
        return max(0.0, self._tried_at + self.freshness.refetch_interval - now)

    def may_refetch(self, now: float) -> bool:
        return self.refetch_wait(now) <= 0

    def started_since(self, when: float) -> bool:
        """Whether a fetch started at or after ``when`` (a caller that came then shares it)."""
        return self._tried_at is not None and self._tried_at >= when

    # -- fetching
    def refresh_if_due(self) -> str | None:
        """Fetches now if the keys are due and no fetch is under way; may block on I/O."""
        return self.refresh(self.due, wait=False)

    def refresh_now(self, *, wait: bool = True) -> str | None:
        """Fetches now (a fetch under way is waited for instead, with ``wait``)."""
        return self.refresh(lambda now: True, wait=wait)

    def refresh(self, due: Callable[[float], bool], *, wait: bool) -> str | None:
        """Fetches the keys if ``due(now)`` and no fetch is under way; with ``wait``, a fetch under
        way is waited for instead. Returns why the fetch failed, or None."""
        with self._lock:
            if self._fetching:
                if wait:
                    self._lock.wait_for(lambda: not self._fetching)
                return None
            if not due(self._clock()):
                return None
            self._fetching = True
            self._tried_at = self._clock()
            self.fetches += 1
        keys: K | None = None
        error: str | None = None
        try:
            keys = self._fetch()
        except (OSError, ValueError) as e:
            error = str(e) or type(e).__name__
        finally:
            with self._lock:
                self._fetching = False
                self._lock.notify_all()
                if keys is not None:
                    self._fetched(keys)
                elif error is not None:
                    self._failed(error)
        self._on_fetch(keys is not None)
        return error

    def _fetched(self, keys: K) -> None:
        """With the lock held: a good fetch."""
        if self._keys is None or not self._same(self._keys, keys):
            self._generation += 1
            self._log.info("%s: now %d key(s)", self.what, len(keys))
        self._keys = keys
        self._fetched_at = self._clock()
        if self._failing:
            self._log.info("%s: keys fetched again (%d)", self.what, len(keys))
        self._failing = False

    def _failed(self, error: str) -> None:
        """With the lock held: logs the first failure; drops the keys if they may not outlive it."""
        if not self._failing:
            max_stale = self.freshness.max_stale
            kept = ("no keys are trusted until it succeeds" if max_stale <= 0 else
                    f"the keys fetched before are kept for at most {max_stale:.0f} s")
            self._log.warning("%s: cannot fetch keys, not refreshed (%s; logged once until a fetch succeeds): %s",
                              self.what, kept, error)
            self._failing = True
        if self.freshness.max_stale <= 0 and self._keys is not None:
            self._drop()
        self._drop_if_too_old(self._clock())
