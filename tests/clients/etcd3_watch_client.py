"""python-etcd3 0.12 watches against an auth-enabled server; prints one JSON object of observations.

Run as a SUBPROCESS only (etcd3 ships its own copies of etcd's protos) with
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python (see tests/support/processes.py client_script_env).

Usage: etcd3_watch_client.py HOST:PORT
Expects root/rootpw (auth enabled) and user `wu`/`pw` holding role `w-rw` (READWRITE on the prefix
`/w/`) and role `w-rv` (READ on the prefix `/rv/`), and nothing on `hoo`.

Revisions are reported relative to the first put (`base`), so servers whose setup wrote a
different number of revisions still compare equal. Every wait for an event is bounded; a watch
that must stay silent is observed for a short, fixed window (there is nothing else to wait for).

Scenarios, in order (later ones rely on earlier writes):
  key / prefix   two watches on one client stream (one via callbacks, one via the iterator API),
                 puts and deletes interleaved, events outside the watched interval
  cancel         cancel both; later writes arrive nowhere; the next watch gets a fresh id
  history        start_revision=base with prev_kv: every revision of the key since base
  denied         a watch on a key / prefix `wu` cannot READ: what python-etcd3 surfaces
  anonymous      a watch without a token
  compacted      start_revision below the compaction: the callback receives RevisionCompactedError
  revoked        `w-rv` loses READ on `/rv/` while a watch on it is open (etcd keeps streaming;
                 raftgate cancels it, which python-etcd3 does not surface: the events just stop);
                 a watch on `/w/` on the same stream is unaffected
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time
from typing import Any

from etcd3 import etcdrpc
from etcd3_client import TokenClient, attempt  # same directory: sys.path[0] when run as a script

QUIET = 0.5  # seconds a watch that must stay silent is observed


class Sink:
    """A watch callback: keeps every response (or error) python-etcd3 hands over, in order."""

    def __init__(self) -> None:
        self.q: queue.Queue[Any] = queue.Queue()
        self.base = 0

    def __call__(self, item: Any) -> None:
        self.q.put(item)

    def _one(self, item: Any) -> list[Any]:
        if isinstance(item, Exception):
            return [["error", type(item).__name__, getattr(item, "compacted_revision", 0) - self.base]]
        if item is None:
            return [["end"]]
        return [event(ev, self.base) for ev in item.events] or [["progress", item.header.revision - self.base]]

    def take(self, n: int, timeout: float = 10.0) -> list[Any]:
        """The next `n` events (or errors/progress notices); fewer if they do not come in time."""
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            try:
                out.extend(self._one(self.q.get(timeout=max(0.0, deadline - time.monotonic()))))
            except queue.Empty:
                break
        return out

    def quiet(self, within: float = QUIET) -> list[Any]:
        """Whatever arrives within `within` seconds (expected: nothing)."""
        out: list[Any] = []
        deadline = time.monotonic() + within
        while True:
            try:
                out.extend(self._one(self.q.get(timeout=max(0.0, deadline - time.monotonic()))))
            except queue.Empty:
                return out


def event(ev: Any, base: int) -> list[Any]:
    kind = type(ev).__name__  # PutEvent / DeleteEvent
    row = [kind, ev.key.decode(), ev.value.decode(), ev.mod_revision - base]
    if ev._event.HasField("prev_kv"):  # noqa: SLF001 - etcd3's Event hides the raw message
        row.append(ev.prev_value.decode())
    return row


def drain_iterator(it: Any, sink: Sink) -> threading.Thread:
    """python-etcd3's blocking event iterator, pumped into `sink` (None when it ends)."""

    def run() -> None:
        try:
            for ev in it:
                sink.q.put(_Wrapped(ev))
        except Exception as exc:  # noqa: BLE001 - an error is an observation
            sink.q.put(exc)
        sink.q.put(None)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class _Wrapped:
    """One event from the event iterator, shaped like a response with one event."""

    def __init__(self, ev: Any) -> None:
        self.events = [ev]


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    r: dict[str, Any] = {}

    def client() -> TokenClient:
        return TokenClient(host=host, port=int(port), timeout=10)

    root, u = client(), client()
    root.login("root", "rootpw")
    u.login("wu", "pw")
    base = root.put("/w/k", "0").header.revision

    def sink() -> Sink:
        s = Sink()
        s.base = base
        return s

    # ---- key + prefix on one stream ----
    kq, pq = sink(), sink()
    r["key_watch_id"] = attempt(lambda: u.add_watch_callback("/w/k", kq))
    pit, pcancel = u.watch_prefix("/w/p/")
    pthread = drain_iterator(pit, pq)
    for op, key, value in [("put", "/w/k", "1"), ("put", "/w/p/a", "1"), ("put", "/w/k", "2"), ("put", "/w/p/b", "2"),
                           ("del", "/w/k", ""), ("del", "/w/p/a", ""), ("put", "/w/q", "x"), ("put", "/w/kk", "x"),
                           ("put", "/w/p", "x"), ("put", "/w/k", "3"), ("put", "/w/p/c", "3")]:
        if op == "put":
            root.put(key, value)
        else:
            root.delete(key)
    r["key_events"] = kq.take(4) + kq.quiet(0.2)
    r["prefix_events"] = pq.take(4) + pq.quiet(0.2)

    # ---- cancel ----
    r["cancel_key"] = attempt(lambda: u.cancel_watch(r["key_watch_id"].get("ok")))
    pcancel()
    pthread.join(5)
    r["prefix_iterator_ended"] = not pthread.is_alive()
    root.put("/w/k", "4")
    root.put("/w/p/d", "4")
    r["after_cancel_key"] = kq.quiet()
    r["after_cancel_prefix"] = [x for x in pq.quiet(0.1) if x != ["end"]]
    nq = sink()
    r["next_watch_id"] = attempt(lambda: u.add_watch_callback("/w/k2", nq))
    root.put("/w/k2", "n")
    r["next_watch_events"] = nq.take(1)

    # ---- history with prev_kv ----
    hq = sink()
    r["history_watch"] = attempt(lambda: u.add_watch_callback("/w/k", hq, start_revision=base, prev_kv=True) >= 0)
    r["history_events"] = hq.take(6) + hq.quiet(0.2)

    # ---- denied: READ missing on the key / prefix ----
    dq, dpq = sink(), sink()
    r["denied_key_watch_id"] = attempt(lambda: u.add_watch_callback("hoo", dq))
    r["denied_prefix_watch_id"] = attempt(lambda: u.add_watch_prefix_callback("/w", dpq))
    root.put("hoo", "secret")
    root.put("/wx", "secret")
    r["denied_key_events"] = dq.quiet()
    r["denied_prefix_events"] = dpq.quiet(0.1)
    aq = sink()  # the stream is still usable
    r["after_denied_watch"] = attempt(lambda: u.add_watch_callback("/w/k3", aq) >= 0)
    root.put("/w/k3", "ok")
    r["after_denied_events"] = aq.take(1)

    # ---- anonymous ----
    anon = client()
    anq = sink()
    r["anonymous_watch_id"] = attempt(lambda: anon.add_watch_callback("/w/k", anq))
    root.put("/w/k", "5")
    r["anonymous_events"] = anq.quiet()

    # ---- compacted start revision ----
    compact_at = root.put("/w/c", "c").header.revision
    root.compact(compact_at)
    cq = sink()
    r["compacted_watch"] = attempt(lambda: u.add_watch_callback("/w/k", cq, start_revision=base) >= 0)
    r["compacted_events"] = cq.take(1, timeout=5) + cq.quiet(0.2)

    # ---- revoked while open (beyond etcd) ----
    rq, sq = sink(), sink()
    r["revoke_watch"] = attempt(lambda: u.add_watch_prefix_callback("/rv/", rq) >= 0)
    r["survivor_watch"] = attempt(lambda: u.add_watch_prefix_callback("/w/s/", sq) >= 0)
    root.put("/rv/a", "1")
    r["revoke_before"] = rq.take(1)
    auth = etcdrpc.AuthStub(root.channel)
    auth.RoleRevokePermission(etcdrpc.AuthRoleRevokePermissionRequest(role="w-rv", key=b"/rv/", range_end=b"/rv0"),
                              metadata=root.metadata, timeout=10)
    root.put("/rv/b", "2")
    root.put("/w/s/x", "3")
    r["survivor_events"] = sq.take(1)
    r["revoke_after"] = rq.quiet()
    r["revoke_get_after"] = attempt(lambda: u.get("/rv/a")[0])

    # No close(): python-etcd3's watch thread would re-open its stream on the closed channel and
    # log a traceback; the process ends here anyway.
    print(json.dumps(r, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
