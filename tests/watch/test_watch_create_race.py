"""Trust 1, raced: watch creates in flight while the stream's token dies.

A stream sends many creates while, concurrently, the user's password is changed (on the same
proxy, through another connection). Each create is either refused with etcd's cancel or created
and then canceled with ``invalid auth token``; no watch stays open, and no event written after
the change (nor history, for a create the change refused) reaches the stream.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import RaftgateLocal
from tests.support.watch_auth import ROOT_PW, _end, put, reader, run, simple  # noqa: F401 - fixture
from tests.support.wclient import INVALID_TOKEN, WatchStream, login, md

pytestmark = pytest.mark.slow
CREATES = 60


@pytest.mark.parametrize("round_", range(3))
def test_creates_racing_a_password_change_leave_no_watch_open(simple: RaftgateLocal, round_: int) -> None:  # noqa: F811
    async def scenario(ch: grpc.aio.Channel) -> None:
        name = f"race{round_}"
        prefix = name.encode() + b"/"
        await reader(ch, name, prefix)
        ws = WatchStream(ch, await login(ch, name, "pw"))
        root = await login(ch, "root", ROOT_PW)

        async def creates() -> None:
            for i in range(CREATES):
                await ws.send(create_request=pb.WatchCreateRequest(key=prefix, range_end=_end(prefix)))
                if i == CREATES // 3:
                    await asyncio.sleep(0)

        async def change() -> None:
            await pbg.AuthStub(ch).UserChangePassword(
                pb.AuthUserChangePasswordRequest(name=name, password="new"), metadata=md(root))

        await asyncio.gather(creates(), change())
        after = prefix + b"after-the-change"
        await put(ch, after, b"secret")
        answered = 0
        open_ids: set[int] = set()
        closed: set[int] = set()
        while answered < CREATES or open_ids:
            resp = await ws.recv(timeout=30)
            for ev in resp.events:
                assert ev.kv.key != after, resp
            if resp.created:
                answered += 1
                if resp.canceled:
                    assert (resp.watch_id, resp.cancel_reason) == (-1, INVALID_TOKEN), resp
                    assert not resp.events, resp
                else:
                    open_ids.add(resp.watch_id)
            elif resp.canceled:
                assert resp.cancel_reason == INVALID_TOKEN, resp
                open_ids.discard(resp.watch_id)
                closed.add(resp.watch_id)
        await put(ch, after, b"secret again")
        await ws.nothing()
        ws.close()

    run(simple, scenario)
