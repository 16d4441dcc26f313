"""A small asyncio Watch client over raw etcd protos, for tests against raftgate (or etcd)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg

PERMISSION_DENIED = "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
INVALID_TOKEN = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"
USER_EMPTY = "rpc error: code = InvalidArgument desc = etcdserver: user name is empty"


async def login(ch: grpc.aio.Channel, name: str, password: str) -> str:
    resp = await pbg.AuthStub(ch).Authenticate(pb.AuthenticateRequest(name=name, password=password), timeout=10)
    return resp.token


async def next_events(call: Any, n: int, timeout: float = 120.0) -> list[pb.Event]:
    """The next ``n`` events or more (whole answers) a Watch call gets, none of them a cancel."""
    got: list[pb.Event] = []
    async with asyncio.timeout(timeout):
        while len(got) < n:
            resp = await call.read()
            assert not resp.canceled, resp
            got.extend(resp.events)
    return got


def md(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("token", token),) if token else None


class WatchStream:
    def __init__(self, ch: grpc.aio.Channel, token: str | None = None) -> None:
        self.call: Any = pbg.WatchStub(ch).Watch(metadata=md(token))

    async def send(self, **kw: Any) -> None:
        await self.call.write(pb.WatchRequest(**kw))

    async def create(self, key: bytes, **kw: Any) -> pb.WatchResponse:
        await self.send(create_request=pb.WatchCreateRequest(key=key, **kw))
        return await self.recv()

    async def recv(self, timeout: float = 10.0) -> pb.WatchResponse:
        async with asyncio.timeout(timeout):
            return await self.call.read()

    async def nothing(self, within: float = 0.5) -> None:
        try:
            async with asyncio.timeout(within):
                got = await self.call.read()
        except TimeoutError:
            return
        raise AssertionError(f"unexpected watch response: {got}")

    def close(self) -> None:
        self.call.cancel()
