"""The watch caps hold for every create, a ``resume`` included (issue 21, item 4).

``resume`` on the store's WatchBatches stream marks a create that re-opens a watch the proxy held
on an earlier leader. Any sidecar-class caller can set it. One store (caps of 2 per stream and 2
per user, auth on) and a caller with only the sidecar secret and one valid simple token: resumed
creates on one stream, and spread over many streams, never leave the user more than 2 watches;
the others are canceled under their own ids with etcd's cap reason.

And the legitimate resume still works: three store nodes behind a proxy, a user at both caps, the
leader killed -9: every watch the proxy re-opens on the new leader keeps delivering with no cancel,
and the caps still refuse a new watch afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from protos.storepb import store_pb2 as spb
from raftgate.errors import Err, EtcdError
from raftgate.secret_proof import INTERNAL, Prover
from tests.support.cluster import program_cluster
from tests.support.processes import Program, free_port, proxy_program, stop_together, store_program, wait_serving
from tests.support.wclient import WatchStream

pytestmark = pytest.mark.slow

SIDECAR_SECRET = "sidecar-secret-for-tests-0123456789"
WATCH_BATCHES = "/raftgate.storepb.Store/WatchBatches"
PER_STREAM = EtcdError(Err.TOO_MANY_WATCHES_STREAM).status_string()
PER_USER = EtcdError(Err.TOO_MANY_WATCHES_USER).status_string()


@dataclass
class Setup:
    store: str
    central: str
    token: str  # app's simple token
    root_md: tuple[tuple[str, str], ...]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    work: Path = tmp_path_factory.mktemp("watch-resume-caps")
    (work / "sidecar-secret").write_text(SIDECAR_SECRET)
    store, internal = store_program(work, "--sidecar-secret-file", str(work / "sidecar-secret"),
                                    "--max-watches-per-stream", "2", "--max-watches-per-user", "2",
                                    "--bcrypt-cost", "4")
    started: list[Program] = []
    try:
        store.start()
        started.append(store)
        port = free_port()
        central = proxy_program(work, internal, f"http://127.0.0.1:{port}")
        central.start()
        started.append(central)
        wait_serving(f"127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            auth = pbg.AuthStub(ch)
            auth.UserAdd(pb.AuthUserAddRequest(name="root", password="rootpw"), timeout=10)
            auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
            auth.UserAdd(pb.AuthUserAddRequest(name="app", password="apppw"), timeout=10)
            auth.RoleAdd(pb.AuthRoleAddRequest(name="app"), timeout=10)
            auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(name="app", perm={
                "permType": "READWRITE", "key": b"app/", "range_end": b"app0"}), timeout=10)
            auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="app", role="app"), timeout=10)
            auth.AuthEnable(pb.AuthEnableRequest(), timeout=10)
            root = auth.Authenticate(pb.AuthenticateRequest(name="root", password="rootpw"), timeout=10).token
            app = auth.Authenticate(pb.AuthenticateRequest(name="app", password="apppw"), timeout=10).token
        yield Setup(internal, f"127.0.0.1:{port}", app, (("token", root),))
    finally:
        stop_together(started)


def _resume(watch_id: int, token: str) -> bytes:
    create = pb.WatchCreateRequest(key=b"app/k", watch_id=watch_id, start_revision=0)
    return spb.WatchStreamRequest(request=pb.WatchRequest(create_request=create), resume=True,
                                  token=token).SerializeToString()


async def _attack(setup: Setup, streams: int, per_stream: int) -> tuple[set[int], dict[int, str]]:
    """`streams` sidecar WatchBatches streams with `per_stream` resumed creates each (distinct ids);
    then one put: (ids that got the event, ids canceled -> reason)."""
    async with grpc.aio.insecure_channel(setup.store) as ch:
        md = await Prover(ch, SIDECAR_SECRET.encode(), INTERNAL).metadata()  # the sidecar secret, proven
        method = ch.stream_stream(WATCH_BATCHES, request_serializer=None, response_deserializer=None)
        calls = [method(metadata=md) for _ in range(streams)]
        ids = iter(range(1, streams * per_stream + 1))
        for call in calls:
            for _ in range(per_stream):
                await call.write(_resume(next(ids), setup.token))
        # a marker create (not a resume) after the resumes: its answer says they were all handled
        for i, call in enumerate(calls):
            await call.write(spb.WatchStreamRequest(request=pb.WatchRequest(create_request=pb.WatchCreateRequest(
                key=b"app/marker", watch_id=10_000 + i)), token=setup.token).SerializeToString())
        canceled: dict[int, str] = {}
        events: set[int] = set()

        async def read_until(call: object, pred: object) -> None:
            while not pred():  # type: ignore[operator]
                raw = await asyncio.wait_for(call.read(), 20)  # type: ignore[attr-defined]
                assert raw is not grpc.aio.EOF, "the store ended the stream"
                for data in spb.WatchBatch.FromString(raw).responses:
                    r = pb.WatchResponse.FromString(data)
                    if r.created:
                        seen_marker.add(id(call))
                    elif r.canceled:
                        canceled[r.watch_id] = r.cancel_reason
                    elif r.events:
                        events.add(r.watch_id)

        seen_marker: set[int] = set()
        for call in calls:
            await read_until(call, lambda c=call: id(c) in seen_marker)
        async with grpc.aio.insecure_channel(setup.central) as cch:
            put = await pbg.KVStub(cch).Put(pb.PutRequest(key=b"app/k", value=b"v"), metadata=setup.root_md,
                                            timeout=10)
        resumed = set(range(1, streams * per_stream + 1))
        for i, call in enumerate(calls):
            mine = set(range(i * per_stream + 1, (i + 1) * per_stream + 1))
            await read_until(call, lambda m=mine: m <= events | set(canceled))
        assert put.header.revision > 0
        for call in calls:
            call.cancel()
        return events & resumed, {k: v for k, v in canceled.items() if k in resumed}


def test_resumes_on_one_stream_stay_within_the_caps(setup: Setup) -> None:
    events, canceled = asyncio.run(_attack(setup, streams=1, per_stream=50))
    assert len(events) <= 2, f"{len(events)} resumed watches open with caps of 2"
    assert len(events) + len(canceled) == 50
    assert set(canceled.values()) <= {PER_STREAM, PER_USER}, canceled


def test_resumes_over_many_streams_stay_within_the_user_cap(setup: Setup) -> None:
    events, canceled = asyncio.run(_attack(setup, streams=25, per_stream=2))
    assert len(events) <= 2, f"{len(events)} resumed watches open for one user with a cap of 2"
    assert len(events) + len(canceled) == 50
    assert set(canceled.values()) <= {PER_USER}, canceled


def test_watches_at_the_caps_survive_a_leader_kill(tmp_path: Path) -> None:
    """The proxy re-opens on the new leader exactly the watches it held: none refused, none more."""
    flags = ["--max-watches-per-stream", "2", "--max-watches-per-user", "3"]
    with program_cluster(tmp_path, nodes=3, store_flags=flags) as cluster:
        async def main() -> None:
            async with grpc.aio.insecure_channel(cluster.endpoint) as ch:
                kv = pbg.KVStub(ch)
                a, b = WatchStream(ch), WatchStream(ch)
                for ws, key in ((a, b"w/a0"), (a, b"w/a1"), (b, b"w/b0")):
                    r = await ws.create(key)
                    assert r.created and not r.canceled, r
                r = await a.create(b"w/a2")
                assert (r.canceled, r.cancel_reason) == (True, PER_STREAM), r
                r = await b.create(b"w/b1")
                assert (r.canceled, r.cancel_reason) == (True, PER_USER), r

                async def put_all(tag: bytes) -> None:
                    for key in (b"w/a0", b"w/a1", b"w/b0"):
                        while True:
                            try:
                                await kv.Put(pb.PutRequest(key=key, value=tag), timeout=5)
                                break
                            except grpc.aio.AioRpcError:
                                await asyncio.sleep(0.1)

                async def delivered(ws: WatchStream, tag: bytes, want: set[tuple[int, bytes]]) -> None:
                    """Until every (watch id, key) in `want` has had an event with value `tag`."""
                    got: set[tuple[int, bytes]] = set()
                    while not want <= got:
                        r = await ws.recv(timeout=30)
                        assert not r.canceled, r
                        got |= {(r.watch_id, e.kv.key) for e in r.events if e.kv.value == tag}
                    assert got == want, got

                await put_all(b"before")
                await delivered(a, b"before", {(0, b"w/a0"), (1, b"w/a1")})
                await delivered(b, b"before", {(0, b"w/b0")})
                leader = await asyncio.to_thread(cluster.leader)
                await asyncio.to_thread(cluster.kill, leader)
                await put_all(b"after")
                await delivered(a, b"after", {(0, b"w/a0"), (1, b"w/a1")})
                await delivered(b, b"after", {(0, b"w/b0")})
                # the caps still hold on the new leader
                r = await a.create(b"w/a2")
                assert (r.canceled, r.cancel_reason) == (True, PER_STREAM), r
                c = WatchStream(ch)
                r = await c.create(b"w/c0")
                assert (r.canceled, r.cancel_reason) == (True, PER_USER), r
                for ws in (a, b, c):
                    ws.close()

        asyncio.run(main())
