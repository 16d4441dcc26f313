"""Trust 1, as a property: random auth changes (grant/revoke a permission, revoke the role,
change the password, delete the user, disable/enable auth) interleaved with watch creates on
streams opened earlier never deliver an event the user could not read.

A model follows the auth state after every step. An event is allowed when its key was readable
by the stream's identity in every state from the watch's create up to the put that made the event
(for history, at the create): a watch lives only while its rights and its token do. One
`raftgate local` serves every example; each example works on its own user, role and prefix.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import grpc
import grpc.aio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from protos.authpb import auth_pb2
from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import RaftgateLocal
from tests.support.wclient import WatchStream, login, md

pytestmark = pytest.mark.slow

ROOT_PW = "rootpw"
PERM = auth_pb2.Permission
KEYS = ("a", "b", "c")
ALL = "*"  # the example's whole prefix
_names = itertools.count()


@dataclass(frozen=True)
class State:
    enabled: bool = True
    exists: bool = True
    role: bool = True
    perms: frozenset[str] = frozenset()
    gen: int = 0  # the user's token generation: a password change, a delete or a disable kills tokens

    def readable(self, gen: int | None, key: str) -> bool:
        if not self.enabled:
            return True
        return (gen is not None and gen == self.gen and self.exists and self.role
                and (key in self.perms or ALL in self.perms))


@dataclass
class Stream:
    ws: WatchStream
    gen: int | None
    log: list[pb.WatchResponse] = field(default_factory=list)
    created_at: dict[int, int] = field(default_factory=dict)  # watch id -> state index


targets = st.sampled_from((*KEYS, ALL))
wide = st.sampled_from((ALL, ALL, *KEYS))  # watches and first grants: the prefix more often, so events flow
ops = st.one_of(
    st.tuples(st.just("grant"), targets), st.tuples(st.just("revoke"), targets),
    st.tuples(st.sampled_from(("grant_role", "revoke_role", "password", "delete", "add", "disable", "enable",
                               "open"))),
    st.tuples(st.just("create"), st.integers(0, 3), wide, st.booleans()),
    st.tuples(st.just("put"), st.sampled_from(KEYS)),
    st.tuples(st.just("put"), st.sampled_from(KEYS)),  # twice: events after each change
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RaftgateLocal]:
    srv = RaftgateLocal(tmp_path_factory.mktemp("prop"), extra_args=["--nodes", "1"])
    srv.start()
    try:
        for args in [("user", "add", f"root:{ROOT_PW}"), ("role", "add", "root"),
                     ("user", "grant-role", "root", "root")]:
            rc, out, err = srv.ctl(*args)
            assert rc == 0, (args, out, err)
        yield srv
    finally:
        srv.stop()


class Run:
    def __init__(self, ch: grpc.aio.Channel, granted: frozenset[str]) -> None:
        n = next(_names)
        self.ch = ch
        self.user, self.role, self.prefix = f"p{n}", f"pr{n}", f"p{n}/".encode()
        self.auth, self.kv = pbg.AuthStub(ch), pbg.KVStub(ch)
        self.states = [State(perms=granted)]
        self.password = "pw0"
        self.streams: list[Stream] = []
        self.put_at: dict[int, int] = {}  # revision -> state index

    @property
    def state(self) -> State:
        return self.states[-1]

    async def root(self) -> tuple[tuple[str, str], ...] | None:
        return md(await login(self.ch, "root", ROOT_PW)) if self.state.enabled else None

    def _range(self, target: str) -> tuple[bytes, bytes]:
        if target == ALL:
            return self.prefix, self.prefix[:-1] + b"0"
        return self.prefix + target.encode(), b""

    async def start(self) -> None:
        if not (await self.auth.AuthStatus(pb.AuthStatusRequest())).enabled:
            await self.auth.AuthEnable(pb.AuthEnableRequest())
        root = await self.root()
        await self.auth.UserAdd(pb.AuthUserAddRequest(name=self.user, password=self.password), metadata=root)
        await self.auth.RoleAdd(pb.AuthRoleAddRequest(name=self.role), metadata=root)
        await self.auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user=self.user, role=self.role), metadata=root)
        for target in sorted(self.state.perms):
            key, end = self._range(target)
            await self.auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
                name=self.role, perm=PERM(permType=PERM.READ, key=key, range_end=end)), metadata=root)
        await self.open()

    async def open(self) -> None:
        s = self.state
        if s.enabled and s.exists:
            token = await login(self.ch, self.user, self.password)
            self.streams.append(Stream(WatchStream(self.ch, token), s.gen))
        else:
            self.streams.append(Stream(WatchStream(self.ch), None))

    async def create(self, stream: Stream, key: bytes, range_end: bytes, start: int) -> pb.WatchResponse:
        await stream.ws.send(create_request=pb.WatchCreateRequest(key=key, range_end=range_end, start_revision=start))
        while True:
            resp = await stream.ws.recv(timeout=30)
            if resp.created:
                return resp
            stream.log.append(resp)

    async def step(self, op: tuple) -> None:  # type: ignore[type-arg]
        s, root = self.state, await self.root()
        kind = op[0]
        if kind in ("grant", "revoke") and s.exists:
            key, end = self._range(op[1])
            if kind == "grant":
                await self.auth.RoleGrantPermission(pb.AuthRoleGrantPermissionRequest(
                    name=self.role, perm=PERM(permType=PERM.READ, key=key, range_end=end)), metadata=root)
                self.states.append(replace(s, perms=s.perms | {op[1]}))
            elif op[1] in s.perms:
                await self.auth.RoleRevokePermission(pb.AuthRoleRevokePermissionRequest(
                    role=self.role, key=key, range_end=end), metadata=root)
                self.states.append(replace(s, perms=s.perms - {op[1]}))
        elif kind == "grant_role" and s.exists and not s.role:
            await self.auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user=self.user, role=self.role), metadata=root)
            self.states.append(replace(s, role=True))
        elif kind == "revoke_role" and s.exists and s.role:
            await self.auth.UserRevokeRole(pb.AuthUserRevokeRoleRequest(name=self.user, role=self.role),
                                           metadata=root)
            self.states.append(replace(s, role=False))
        elif kind == "password" and s.exists:
            self.password = f"pw{len(self.states)}"
            await self.auth.UserChangePassword(pb.AuthUserChangePasswordRequest(
                name=self.user, password=self.password), metadata=root)
            self.states.append(replace(s, gen=s.gen + 1))
        elif kind == "delete" and s.exists:
            await self.auth.UserDelete(pb.AuthUserDeleteRequest(name=self.user), metadata=root)
            self.states.append(replace(s, exists=False, role=False, gen=s.gen + 1))
        elif kind == "add" and not s.exists:
            await self.auth.UserAdd(pb.AuthUserAddRequest(name=self.user, password=self.password), metadata=root)
            self.states.append(replace(s, exists=True, role=False))
        elif kind == "disable" and s.enabled:
            await self.auth.AuthDisable(pb.AuthDisableRequest(), metadata=root)
            self.states.append(replace(s, enabled=False, gen=s.gen + 1))
        elif kind == "enable" and not s.enabled:
            await self.auth.AuthEnable(pb.AuthEnableRequest())
            self.states.append(replace(s, enabled=True))
        elif kind == "open":
            await self.open()
        elif kind == "create":
            stream = self.streams[op[1] % len(self.streams)]
            key, end = self._range(op[2])
            resp = await self.create(stream, key, end, 1 if op[3] else 0)
            if not resp.canceled:
                stream.created_at[resp.watch_id] = len(self.states) - 1
        elif kind == "put":
            resp = await self.kv.Put(pb.PutRequest(key=self.prefix + op[1].encode(), value=b"v"), metadata=root)
            self.put_at[resp.header.revision] = len(self.states) - 1

    async def finish(self) -> None:
        """Each stream answers one more create (on a key nobody writes) after all it had to send."""
        for stream in self.streams:
            await self.create(stream, self.prefix + b"zz", b"", 0)
            stream.ws.close()

    def check(self) -> None:
        for i, stream in enumerate(self.streams):
            for resp in stream.log:
                for ev in resp.events:
                    key = ev.kv.key[len(self.prefix):].decode()
                    created = stream.created_at[resp.watch_id]
                    put = self.put_at[ev.kv.mod_revision]
                    states = self.states[created:put + 1] if put >= created else [self.states[created]]
                    bad = [s for s in states if not s.readable(stream.gen, key)]
                    assert not bad, (f"stream {i} (token gen {stream.gen}) got {key!r} at revision "
                                     f"{ev.kv.mod_revision} (watch {resp.watch_id}): {bad[0]}")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(granted=st.frozensets(wide, min_size=1), steps=st.lists(ops, min_size=4, max_size=16))
@example(granted=frozenset({ALL}), steps=[("put", "a"), ("password",), ("create", 0, ALL, True), ("put", "b")])
@example(granted=frozenset({"a"}), steps=[("put", "a"), ("disable",), ("enable",), ("create", 0, "a", True),
                                          ("put", "a")])
def test_watch_never_outlives_rights(server: RaftgateLocal, granted: frozenset[str],
                                     steps: list[tuple]) -> None:  # type: ignore[type-arg]
    async def main() -> None:
        async with grpc.aio.insecure_channel(server.target) as ch:
            run = Run(ch, granted)
            await run.start()
            try:
                for op in steps:
                    await run.step(op)
                await run.finish()
            finally:
                for stream in run.streams:
                    stream.ws.close()
            run.check()

    asyncio.run(main())
