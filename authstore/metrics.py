"""Every Prometheus metric of a store node, defined once (etcd keeps its auth metrics in one file too).

Names follow Prometheus conventions: ``raftgate_store_`` prefix, counters end in ``_total``,
durations are ``_seconds``. Label values come only from bounded sets (request kinds are the
``InternalRaftRequest`` field names, stages are ``apply``/``read``): never a user name, a key, a
token or anything else a client chooses.

The apply stage and the authorization function call these themselves; the consensus driver
(node, WAL, watch hub) calls the helpers below at the points documented on each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from raftgate.errors import Err
from raftgate.fast_histogram import FastHistogram

# The *_created series double every counter and histogram for no use in dashboards or alerts.
disable_created_metrics()

#: Where a refusal was decided: in the apply stage (every node, in log order) or on a read path
#: (only on the node that answered the read).
STAGES = ("apply", "read")

_DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: etcd's etcd_disk_wal_fsync_duration_seconds buckets: 1 ms doubling to about 8 s.
_FSYNC_BUCKETS = tuple(0.001 * 2**i for i in range(14))
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)

PERMISSION_DENIALS = Counter(
    "raftgate_store_permission_denials_total",
    "Requests refused with 'permission denied', by request kind and stage.",
    ["kind", "stage"],
)
OLD_REVISION_REFUSALS = Counter(
    "raftgate_store_old_revision_refusals_total",
    "Requests refused with 'revision of auth store is old', by request kind and stage.",
    ["kind", "stage"],
)
AUTH_REVISION = Gauge("raftgate_store_auth_revision", "The auth revision of this node's applied state.")
PROPOSALS = Counter("raftgate_store_proposals_total", "Requests this node proposed to the Raft log.")
PROPOSAL_BATCH_SIZE = Histogram(
    "raftgate_store_proposal_batch_size",
    "Log entries made durable per write-ahead-log write (the group-commit batch).",
    buckets=_BATCH_BUCKETS,
)
APPLY_DURATION = Histogram(
    "raftgate_store_apply_duration_seconds",
    "Time to apply one batch of committed entries (one LMDB write transaction).",
    buckets=_DURATION_BUCKETS,
)
APPLIED_ENTRIES = Counter("raftgate_store_applied_entries_total", "Log entries applied by this node.")
APPLY_LAG = Gauge("raftgate_store_apply_lag_entries", "Committed log entries not yet applied (committed - applied).")
LEADER_CHANGES = Counter("raftgate_store_leader_changes_total", "Leader changes this node has seen.")
IS_LEADER = Gauge("raftgate_store_is_leader", "1 when this node is the Raft leader, else 0.")
RAFT_TERM = Gauge("raftgate_store_raft_term", "The Raft term this node is in.")
OPEN_WATCHES = Gauge("raftgate_store_open_watches", "Watches open on this node.")
AUTH_LOCKOUTS = Counter(
    "raftgate_store_auth_lockouts_total",
    "User names locked out by failed Authenticate calls (--auth-lockout-attempts), counted as applied.",
)
AUTH_LOCKED_NAMES = Gauge(
    "raftgate_store_auth_locked_names",
    "User names locked out now, in this node's applied state at its clock (names that do not exist too).",
)
# Always on, so each costs what raftgate/fast_histogram.py costs (well under 1 µs), and each is
# observed from one thread only: the raft-io thread, the apply thread, the event loop.
WAL_FSYNC_DURATION = FastHistogram(
    "raftgate_store_wal_fsync_duration_seconds", "Time of one write-ahead-log fsync.", buckets=_FSYNC_BUCKETS
)
#: 50 µs doubling to about 0.8 s: an LMDB commit of a small batch can take well under a WAL fsync.
_COMMIT_BUCKETS = tuple(0.00005 * 2**i for i in range(15))
LMDB_COMMIT_DURATION = FastHistogram(
    "raftgate_store_lmdb_commit_duration_seconds",
    "Time of one applied batch's LMDB commit (its data and the sync to disk), on the apply thread.",
    buckets=_COMMIT_BUCKETS,
)
LINK_CALLS_PER_MESSAGE = FastHistogram(
    "raftgate_store_link_calls_per_message",
    "Calls in one message from a proxy on its DoStream (DoBatch size).",
    buckets=_BATCH_BUCKETS,
)
LINK_ANSWERS_PER_MESSAGE = FastHistogram(
    "raftgate_store_link_answers_per_message",
    "Answers (and answer parts) in one message to a proxy on its DoStream (DoResultBatch size).",
    buckets=_BATCH_BUCKETS,
)
#: The alarm types etcd raises (AlarmType less NONE); a closed set.
ALARM_TYPES = ("NOSPACE", "CORRUPT")
ALARM_ACTIVE = Gauge(
    "raftgate_store_alarm_active",
    "1 while this node's applied state holds an alarm of that type (NOSPACE: writes are refused), else 0.",
    ["alarm"],
)
for _alarm in ALARM_TYPES:
    ALARM_ACTIVE.labels(_alarm)


def count_refusal(err: Err, kind: str, *, read: bool) -> None:
    """Counts a permission denial or old-revision refusal; other errors are not refusals here.

    ``kind`` must be a request kind (an ``InternalRaftRequest`` field name), a bounded set.
    """
    stage = "read" if read else "apply"
    if err is Err.PERMISSION_DENIED:
        PERMISSION_DENIALS.labels(kind, stage).inc()
    elif err is Err.AUTH_OLD_REVISION:
        OLD_REVISION_REFUSALS.labels(kind, stage).inc()


#: the stopwatch the apply stage times its batches with; it lives here because the state machine
#: itself has no clock (an import contract): what it applies carries its own time
stopwatch = time.perf_counter


def observe_apply(seconds: float, entries: int, auth_revision: int) -> None:
    """The apply stage calls this after each batch's transaction commits."""
    APPLY_DURATION.observe(seconds)
    APPLIED_ENTRIES.inc(entries)
    AUTH_REVISION.set(auth_revision)


def observe_alarms(active: Iterable[str]) -> None:
    """The applier calls this with the alarm type names its state holds (on open and after each batch)."""
    names = set(active)
    for alarm in ALARM_TYPES:
        ALARM_ACTIVE.labels(alarm).set(1 if alarm in names else 0)


def observe_proposal() -> None:
    """The driver calls this for each request the Raft node accepted as a proposal."""
    PROPOSALS.inc()


def observe_batch(entries: int) -> None:
    """The driver calls this for each Ready whose entries it writes to the log (one fsync)."""
    if entries:
        PROPOSAL_BATCH_SIZE.observe(entries)


def observe_indexes(committed: int, applied: int) -> None:
    """The driver calls this whenever the commit or applied index moves."""
    APPLY_LAG.set(max(0, committed - applied))


def observe_open_watches(count: int) -> None:
    """The watch hub calls this whenever a watcher joins or leaves its delivery set."""
    OPEN_WATCHES.set(count)


class _Leadership:
    """Turns the (leader, term) the driver sees into the leader gauges and a change counter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leader: int | None = None

    def observe(self, *, leader: int, term: int, me: int) -> None:
        with self._lock:
            if leader and leader != self._leader:
                if self._leader is not None:
                    LEADER_CHANGES.inc()
                self._leader = leader
            elif not leader and self._leader:
                self._leader = 0  # leaderless; the next leader counts as a change
        IS_LEADER.set(1 if leader and leader == me else 0)
        RAFT_TERM.set(term)


_leadership = _Leadership()


def observe_leadership(*, leader: int, term: int, me: int) -> None:
    """The driver calls this on every Raft soft-state change (leader id 0 = no leader known).

    The first leader a node learns of after start-up is not counted as a change (etcd counts it;
    a restart would then look like an election).
    """
    _leadership.observe(leader=leader, term=term, me=me)
