"""One `raftgate local` with auth on, and the users, grants and puts the watch-token tests make on it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import RaftgateLocal
from tests.support.wclient import login, md

ROOT_PW = "rootpw"


PERM = auth_pb2.Permission


def _setup(srv: RaftgateLocal) -> None:
    for args in [("user", "add", f"root:{ROOT_PW}"), ("role", "add", "root"), ("user", "grant-role", "root", "root"),
                 ("auth", "enable")]:
        rc, out, err = srv.ctl(*args)
        assert rc == 0 or "already exists" in err, (args, out, err)


@pytest.fixture(scope="module")
def simple(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaftgateLocal]:
    srv = RaftgateLocal(tmp_path_factory.mktemp("simple"), extra_args=["--nodes", "1"])
    srv.start()
    try:
        _setup(srv)
        yield srv
    finally:
        srv.stop()


def run(srv: RaftgateLocal, scenario) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        async with grpc.aio.insecure_channel(srv.target) as ch:
            await scenario(ch)

    asyncio.run(main())


async def reader(ch: grpc.aio.Channel, name: str, prefix: bytes) -> None:
    """Adds user ``name`` (password ``pw``) with READ on ``prefix``*, and a value there (history).

    A fresh root token for each change: a JWT's revision is old after any auth change (etcd)."""
    auth = pbg.AuthStub(ch)

    async def root() -> tuple[tuple[str, str], ...] | None:
        return md(await login(ch, "root", ROOT_PW))

    await auth.UserAdd(pb.AuthUserAddRequest(name=name, password="pw"), metadata=await root())
    await auth.RoleAdd(pb.AuthRoleAddRequest(name=f"r-{name}"), metadata=await root())
    await auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
        name=f"r-{name}", perm=PERM(permType=PERM.READ, key=prefix, range_end=_end(prefix))), metadata=await root())
    await auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user=name, role=f"r-{name}"), metadata=await root())
    await put(ch, prefix + b"history", b"secret")


def _end(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


async def put(ch: grpc.aio.Channel, key: bytes, value: bytes) -> int:
    root = await login(ch, "root", ROOT_PW)
    return (await pbg.KVStub(ch).Put(pb.PutRequest(key=key, value=value), metadata=md(root))).header.revision
