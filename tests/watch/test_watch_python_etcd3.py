"""Watch through real clients, side by side against real etcd 3.5.1 and raftgate.

* python-etcd3 0.12 (tests/clients/etcd3_watch_client.py, run in a subprocess: its protos clash
  with ours): key and prefix watches on one stream, puts/deletes in order, cancel, history with
  start_revision and prev_kv, compaction, a denied and an anonymous watch, and a permission revoked
  while a watch is open. Expected values are etcd 3.7.1's; where 3.5.1 differs the etcd run carries
  an override, so every other key is asserted identical on both servers.
* periodic progress_notify (raw gRPC, tests/support/wclient.py): raftgate's store reads
  RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL, etcd takes --experimental-watch-progress-notify-interval.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import (
    BACKENDS,
    REPO_ROOT,
    EtcdServer,
    RaftgateLocal,
    client_script_env,
    etcdctl,
    new_server,
    side_by_side,
    skip_unless_available,
    stop_together,
)
from tests.support.wclient import WatchStream, login, md

pytestmark = pytest.mark.slow

Server = EtcdServer | RaftgateLocal
PROGRESS_INTERVAL = 0.3  # seconds, for both servers
ROOT = "root:rootpw"
SETUP = [
    ("user", "add", ROOT),
    ("user", "add", "wu:pw"),
    ("role", "add", "w-rw"),
    ("role", "add", "w-rv"),
    ("role", "grant-permission", "w-rw", "readwrite", "/w/", "--prefix"),
    ("role", "grant-permission", "w-rv", "read", "/rv/", "--prefix"),
    ("user", "grant-role", "wu", "w-rw"),
    ("user", "grant-role", "wu", "w-rv"),
    ("auth", "enable"),
]


def put(key: str, value: str, rel: int, prev: str | None = None) -> list[Any]:
    return ["PutEvent", key, value, rel] + ([prev] if prev is not None else [])


def delete(key: str, rel: int, prev: str | None = None) -> list[Any]:
    return ["DeleteEvent", key, "", rel] + ([prev] if prev is not None else [])


# etcd 3.7.1 as python-etcd3 sees it; revisions relative to the first put (see the script).
EXPECTED: dict[str, Any] = {
    "key_watch_id": {"ok": 0},
    "key_events": [put("/w/k", "1", 1), put("/w/k", "2", 3), delete("/w/k", 5), put("/w/k", "3", 10)],
    "prefix_events": [put("/w/p/a", "1", 2), put("/w/p/b", "2", 4), delete("/w/p/a", 6), put("/w/p/c", "3", 11)],
    "cancel_key": {"ok": None},
    "prefix_iterator_ended": True,
    "after_cancel_key": [],
    "after_cancel_prefix": [],
    "next_watch_id": {"ok": 2},  # ids are never reused on a stream
    "next_watch_events": [put("/w/k2", "n", 14)],
    "history_watch": {"ok": True},
    "history_events": [put("/w/k", "0", 0), put("/w/k", "1", 1, "0"), put("/w/k", "2", 3, "1"),
                       delete("/w/k", 5, "2"), put("/w/k", "3", 10), put("/w/k", "4", 12, "3")],
    # python-etcd3 raises nothing for a denied watch: add_watch_callback returns the response's
    # watch_id and the callback never fires (created+canceled responses are not passed on).
    "denied_key_watch_id": {"ok": -1},
    "denied_prefix_watch_id": {"ok": -1},
    "denied_key_events": [],
    "denied_prefix_events": [],
    "after_denied_watch": {"ok": True},  # the stream stays usable
    "after_denied_events": [put("/w/k3", "ok", 17)],
    "anonymous_watch_id": {"ok": -1},
    "anonymous_events": [],
    "compacted_watch": {"ok": True},
    "compacted_events": [["error", "RevisionCompactedError", 19]],
    "revoke_watch": {"ok": True},
    "survivor_watch": {"ok": True},
    "revoke_before": [put("/rv/a", "1", 20)],
    "survivor_events": [put("/w/s/x", "3", 22)],
    "revoke_get_after": {"error": {"code": "PERMISSION_DENIED", "details": "etcdserver: permission denied"}},
    # raftgate (beyond etcd): the revoke cancels the open watch; python-etcd3 does not surface the
    # cancel, the events just stop. The /w/s/ watch on the same stream keeps going.
    "revoke_after": [],
}
ETCD_351 = {
    # 3.5.1 echoes the requested watch id (0: auto) in a denial; 3.5.8+/3.6/3.7.1 answer -1.
    "denied_key_watch_id": {"ok": 0},
    "denied_prefix_watch_id": {"ok": 0},
    "anonymous_watch_id": {"ok": 0},
    # etcd never re-checks an open watch: the event after the revoke is delivered.
    "revoke_after": [put("/rv/b", "2", 21)],
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    """Both servers, auth set up, with a short progress-notify interval; stopped at the end."""
    started: dict[str, Server] = {}
    try:
        for kind in BACKENDS:
            try:
                skip_unless_available(kind)
            except pytest.skip.Exception:
                continue
            workdir = tmp_path_factory.mktemp(f"e3watch-{kind}")
            if kind == "etcd":
                srv = new_server(kind, workdir, extra_args=[
                    f"--experimental-watch-progress-notify-interval={int(PROGRESS_INTERVAL * 1000)}ms"])
                srv.start()
            else:
                srv = new_server(kind, workdir, extra_args=["--nodes", "1"])
                # The store processes inherit the environment `raftgate local` is started with.
                with pytest.MonkeyPatch.context() as mp:
                    mp.setenv("RAFTGATE_WATCH_PROGRESS_NOTIFY_INTERVAL", f"{PROGRESS_INTERVAL}s")
                    srv.start()
            started[kind] = srv
            for args in SETUP:
                rc, out, err = etcdctl(srv.endpoint, *args, user=None if args[:2] == ("user", "add") else ROOT)
                assert rc == 0, (kind, args, out, err)
        yield started
    finally:
        stop_together(list(started.values()))


@pytest.fixture(scope="module")
def etcd3_results(servers: dict[str, Server]) -> dict[str, dict[str, Any]]:
    def run(kind: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "clients" / "etcd3_watch_client.py"),
                               servers[kind].target], capture_output=True, text=True, env=client_script_env(),
                              timeout=90)
        assert proc.returncode == 0, f"{kind}: etcd3_watch_client.py failed:\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout)  # type: ignore[no-any-return]

    return side_by_side(list(servers), run)


def expected_for(kind: str) -> dict[str, Any]:
    return {**EXPECTED, **ETCD_351} if kind == "etcd" else dict(EXPECTED)


@pytest.mark.parametrize("kind", BACKENDS)
def test_python_etcd3_watch(etcd3_results: dict[str, dict[str, Any]], kind: str) -> None:
    if kind not in etcd3_results:
        pytest.skip(f"{kind} not available")
    got, want = etcd3_results[kind], expected_for(kind)
    diffs = {k: {"got": got.get(k), "want": v} for k, v in want.items() if got.get(k) != v}
    assert not diffs, json.dumps(diffs, indent=1, sort_keys=True)
    assert set(got) == set(want), set(got) ^ set(want)


def test_python_etcd3_watch_same_as_etcd_where_versions_agree(etcd3_results: dict[str, dict[str, Any]]) -> None:
    if "etcd" not in etcd3_results:
        pytest.skip("real etcd not available")
    same = set(EXPECTED) - set(ETCD_351)
    assert {k: etcd3_results["raftgate"][k] for k in same} == {k: etcd3_results["etcd"][k] for k in same}


# ---- periodic progress_notify ----------------------------------------------------------------------


async def progress_scenario(srv: Server) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(srv.target) as ch:
        token = await login(ch, "root", "rootpw")
        kv = pbg.KVStub(ch)
        ws = WatchStream(ch, token)
        with_notify = await ws.create(b"/pn/a", progress_notify=True)
        without = await ws.create(b"/pn/b")
        seen: list[tuple[int, int, int, bool]] = []  # (watch_id, revision, events, canceled)
        inbox: asyncio.Queue[pb.WatchResponse] = asyncio.Queue()

        async def pump() -> None:  # one reader: a timed-out read would cancel the whole call
            while True:
                inbox.put_nowait(await ws.call.read())

        reader = asyncio.get_running_loop().create_task(pump())

        async def gather(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                try:
                    r = await asyncio.wait_for(inbox.get(), left)
                except TimeoutError:
                    return
                seen.append((r.watch_id, r.header.revision, len(r.events), r.canceled))

        await gather(PROGRESS_INTERVAL * 4)
        quiet_phase = list(seen)
        seen.clear()
        # writes elsewhere move the revision: the next notification carries it
        rev = (await kv.Put(pb.PutRequest(key=b"/pn/x", value=b"1"), metadata=md(token))).header.revision
        rev = (await kv.Put(pb.PutRequest(key=b"/pn/b", value=b"2"), metadata=md(token))).header.revision
        await gather(PROGRESS_INTERVAL * 3)
        reader.cancel()
        ws.close()
        return {"ids": (with_notify.watch_id, without.watch_id), "start": with_notify.header.revision,
                "quiet": quiet_phase, "after": list(seen), "rev": rev}


@pytest.mark.parametrize("kind", BACKENDS)
def test_periodic_progress_notify(servers: dict[str, Server], kind: str) -> None:
    """Only the watch created with progress_notify gets empty responses (its own watch_id, the
    current revision), about once per interval while it has no events, on both servers."""
    if kind not in servers:
        pytest.skip(f"{kind} not available")
    got = asyncio.run(progress_scenario(servers[kind]))
    assert got["ids"] == (0, 1), got
    start, rev = got["start"], got["rev"]
    # 4 intervals of silence: at least 2 ticks reached the watch (timing slack either side)
    assert 2 <= len(got["quiet"]) <= 5, got
    assert set(got["quiet"]) == {(0, start, 0, False)}, got
    after = got["after"]
    assert (1, rev, 1, False) in after, got  # the event for /pn/b
    notices = [r for r in after if r[0] == 0]
    assert len(notices) >= 2 and notices[-1] == (0, rev, 0, False), got
    # a tick may fall between the phases or between the two puts: revisions only move forward
    assert all(start <= r[1] <= rev and r[2:] == (0, False) for r in notices), got
    assert [r[1] for r in notices] == sorted(r[1] for r in notices), got
    assert len(after) == 1 + len(notices), got
