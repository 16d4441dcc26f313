"""An auth store in LMDB with root and alice's roles, and authorize called on it (the authorization tests)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import pytest
from google.protobuf.message import Message

from authstore.state.auth.authorize import authorize
from authstore.state.auth.store import AuthStore
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err, EtcdError

READ, WRITE, READWRITE = auth_pb2.Permission.READ, auth_pb2.Permission.WRITE, auth_pb2.Permission.READWRITE


HASH = base64.b64encode(b"$2b$04$abcdefghijklmnopqrstuu5Jm0bq2b3DNHYXjJSOJ5WbWbYHJ8bTa").decode()


LEASES: dict[int, list[bytes]] = {
    1: [b"w1", b"w2"],  # alice may write both
    2: [b"w1", b"zz"],  # alice may not write zz
    3: [],  # no keys
    4: [b"a1", b"k"],  # alice may read a1 but not k (k is write-only)
}


def lease_keys(lease_id: int) -> list[bytes]:
    if lease_id not in LEASES:
        raise EtcdError(Err.LEASE_NOT_FOUND)
    return LEASES[lease_id]


class World:
    """Auth enabled; root; alice holds role r: READ [a,c), READWRITE prefix w, WRITE key k."""

    def __init__(self, path: Path) -> None:
        self.env = lmdb.open(str(path), max_dbs=32, map_size=1 << 30)
        self.auth = AuthStore(self.env)
        calls: list[tuple[str, Message]] = [
            ("user_add", pb.AuthUserAddRequest(name="root", hashedPassword=HASH)),
            ("user_grant_role", pb.AuthUserGrantRoleRequest(user="root", role="root")),
            ("user_add", pb.AuthUserAddRequest(name="alice", hashedPassword=HASH)),
            ("user_add", pb.AuthUserAddRequest(name="bob", hashedPassword=HASH)),
            ("role_add", pb.AuthRoleAddRequest(name="r")),
            ("role_add", pb.AuthRoleAddRequest(name="other")),
            ("user_grant_role", pb.AuthUserGrantRoleRequest(user="alice", role="r")),
        ]
        for t, k, e in [(READ, b"a", b"c"), (READWRITE, b"w", b"x"), (WRITE, b"k", b"")]:
            perm = auth_pb2.Permission(permType=t, key=k, range_end=e)
            calls.append(("role_grant_permission", pb.AuthRoleGrantPermissionRequest(name="r", perm=perm)))
        calls.append(("enable", pb.AuthEnableRequest()))
        with self.env.begin(write=True) as txn:
            for method, req in calls:
                getattr(self.auth, method)(txn, req)
            self.rev = self.auth.revision(txn)

    def check(
        self,
        kind: str,
        body: Message,
        user: str = "alice",
        *,
        rev: int | None = None,
        read: bool = False,
        all_leases: Callable[[], list[int]] | None = lambda: sorted(LEASES),
    ) -> Err | None:
        req = ipb.InternalRaftRequest()
        getattr(req, kind).CopyFrom(body)
        header = ipb.RequestHeader(username=user, auth_revision=self.rev if rev is None else rev)
        if not user and rev is None:
            header.auth_revision = 0
        req.header.CopyFrom(header)
        with self.env.begin() as txn:
            try:
                authorize(self.auth, txn, req.header, req, lease_keys, read=read, all_leases=all_leases)
            except EtcdError as exc:
                return exc.err
        return None

    def mutate(self, method: str, req: Message) -> None:
        with self.env.begin(write=True) as txn:
            getattr(self.auth, method)(txn, req)
            self.rev = self.auth.revision(txn)


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = World(tmp_path)
    yield world
    world.env.close()


def put(key: bytes, **kw: Any) -> pb.PutRequest:
    return pb.PutRequest(key=key, value=b"v", **kw)
