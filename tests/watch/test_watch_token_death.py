"""Trust 1: a Watch stream keeps no right its token lost.

Each way a token dies (password change, user delete, auth disable then enable, simple-token TTL
expiry, a JWT's ``exp``) is tried on a stream opened while the token was good: a new create on it
is answered with etcd's cancel (``invalid auth token``), never with history or live events, and
the watches already open on it are canceled with the same reason.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.cluster import local_cluster
from tests.support.processes import RaftgateLocal, etcdctl, pem_rsa_keypair
from tests.support.watch_auth import ROOT_PW, _end, _setup, put, reader, run, simple  # noqa: F401 - fixture
from tests.support.wclient import INVALID_TOKEN, WatchStream, login, md

pytestmark = pytest.mark.slow


async def next_cancel(ws: WatchStream, timeout: float = 30.0) -> pb.WatchResponse:
    """The next cancel on the stream; events before it are allowed only from before the death."""
    while True:
        resp = await ws.recv(timeout=timeout)
        if resp.canceled:
            return resp
        assert not resp.created, resp


def assert_dead_create(resp: pb.WatchResponse) -> None:
    assert (resp.watch_id, resp.created, resp.canceled, resp.cancel_reason) == (-1, True, True, INVALID_TOKEN), resp
    assert not resp.events, resp


async def killed_by(ch: grpc.aio.Channel, name: str, kill) -> None:  # type: ignore[no-untyped-def]
    """Opens a stream as ``name`` with one watch, runs ``kill``, then checks the open watch is
    canceled and a create from revision 1 on the same stream gets only etcd's cancel."""
    prefix = name.encode() + b"/"
    await reader(ch, name, prefix)
    token = await login(ch, name, "pw")
    ws = WatchStream(ch, token)
    try:
        first = await ws.create(prefix, range_end=_end(prefix))
        assert (first.watch_id, first.canceled) == (0, False), first
        await kill()
        canceled = await next_cancel(ws)
        assert (canceled.watch_id, canceled.cancel_reason) == (0, INVALID_TOKEN), canceled
        assert_dead_create(await ws.create(prefix, range_end=_end(prefix), start_revision=1))
        await put(ch, prefix + b"later", b"secret")
        await ws.nothing()
    finally:
        ws.close()


def test_password_change(simple: RaftgateLocal) -> None:  # noqa: F811
    async def scenario(ch: grpc.aio.Channel) -> None:
        async def kill() -> None:
            root = await login(ch, "root", ROOT_PW)
            await pbg.AuthStub(ch).UserChangePassword(
                pb.AuthUserChangePasswordRequest(name="pwchange", password="new"), metadata=md(root))

        await killed_by(ch, "pwchange", kill)

    run(simple, scenario)


def test_password_change_without_open_watches(simple: RaftgateLocal) -> None:  # noqa: F811
    """The create path on its own: no open watch on the stream whose cancel could give it away."""
    async def scenario(ch: grpc.aio.Channel) -> None:
        prefix = b"pwbare/"
        await reader(ch, "pwbare", prefix)
        ws = WatchStream(ch, await login(ch, "pwbare", "pw"))
        root = await login(ch, "root", ROOT_PW)
        await pbg.AuthStub(ch).UserChangePassword(
            pb.AuthUserChangePasswordRequest(name="pwbare", password="new"), metadata=md(root))
        assert_dead_create(await ws.create(prefix, range_end=_end(prefix), start_revision=1))
        await put(ch, prefix + b"later", b"secret")
        await ws.nothing()
        ws.close()

    run(simple, scenario)


def test_user_delete(simple: RaftgateLocal) -> None:  # noqa: F811
    async def scenario(ch: grpc.aio.Channel) -> None:
        async def kill() -> None:
            root = await login(ch, "root", ROOT_PW)
            await pbg.AuthStub(ch).UserDelete(pb.AuthUserDeleteRequest(name="deleted"), metadata=md(root))

        await killed_by(ch, "deleted", kill)

    run(simple, scenario)


def test_auth_disable_then_enable(simple: RaftgateLocal) -> None:  # noqa: F811
    async def scenario(ch: grpc.aio.Channel) -> None:
        async def kill() -> None:
            root = await login(ch, "root", ROOT_PW)
            await pbg.AuthStub(ch).AuthDisable(pb.AuthDisableRequest(), metadata=md(root))
            await pbg.AuthStub(ch).AuthEnable(pb.AuthEnableRequest())

        await killed_by(ch, "reenabled", kill)

    run(simple, scenario)


def test_simple_token_ttl_expiry(tmp_path: Path) -> None:
    srv = RaftgateLocal(tmp_path, auth_token="simple", auth_token_ttl=2, extra_args=["--nodes", "1"])
    srv.start()
    try:
        _setup(srv)

        async def scenario(ch: grpc.aio.Channel) -> None:
            prefix = b"ttl/"
            await reader(ch, "ttl", prefix)
            token = await login(ch, "ttl", "pw")
            watching, bare = WatchStream(ch, token), WatchStream(ch, token)
            first = await watching.create(prefix, range_end=_end(prefix))
            assert (first.watch_id, first.canceled) == (0, False), first
            # the token is not used again: the store expires it after 2 s idle
            canceled = await next_cancel(watching)
            assert (canceled.watch_id, canceled.cancel_reason) == (0, INVALID_TOKEN), canceled
            assert_dead_create(await bare.create(prefix, range_end=_end(prefix), start_revision=1))
            watching.close()
            bare.close()

        run(srv, scenario)
    finally:
        srv.stop()


def test_jwt_exp(tmp_path: Path) -> None:
    priv, pub = pem_rsa_keypair(tmp_path)
    srv = RaftgateLocal(tmp_path / "rg", auth_token=f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256,ttl=3s",
                        extra_args=["--nodes", "1"])
    srv.start()
    try:
        _setup(srv)

        async def scenario(ch: grpc.aio.Channel) -> None:
            prefix = b"jwt/"
            await reader(ch, "jwt", prefix)
            token = await login(ch, "jwt", "pw")
            watching, bare = WatchStream(ch, token), WatchStream(ch, token)
            first = await watching.create(prefix, range_end=_end(prefix))
            assert (first.watch_id, first.canceled) == (0, False), first
            canceled = await next_cancel(watching)
            assert (canceled.watch_id, canceled.cancel_reason) == (0, INVALID_TOKEN), canceled
            # the same token is now refused on a request too
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pbg.KVStub(ch).Range(pb.RangeRequest(key=prefix), metadata=md(token))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert_dead_create(await bare.create(prefix, range_end=_end(prefix), start_revision=1))
            watching.close()
            bare.close()

        run(srv, scenario)
    finally:
        srv.stop()


OLD_REVISION = "rpc error: code = InvalidArgument desc = etcdserver: revision of auth store is old"


def test_jwt_password_change_and_auth_disable_then_enable(tmp_path: Path) -> None:
    """A JWT still verifies after these, but its watches die; a create with it gets etcd's
    `revision of auth store is old` (its revision claim predates the change)."""
    priv, pub = pem_rsa_keypair(tmp_path)
    srv = RaftgateLocal(tmp_path / "rg", auth_token=f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256",
                        extra_args=["--nodes", "1"])
    srv.start()
    try:
        _setup(srv)

        async def scenario(ch: grpc.aio.Channel) -> None:
            async def change_password() -> None:
                root = await login(ch, "root", ROOT_PW)
                await pbg.AuthStub(ch).UserChangePassword(
                    pb.AuthUserChangePasswordRequest(name="jpw", password="new"), metadata=md(root))

            async def disable_enable() -> None:
                root = await login(ch, "root", ROOT_PW)
                await pbg.AuthStub(ch).AuthDisable(pb.AuthDisableRequest(), metadata=md(root))
                await pbg.AuthStub(ch).AuthEnable(pb.AuthEnableRequest())

            for name, kill in (("jpw", change_password), ("jre", disable_enable)):
                prefix = name.encode() + b"/"
                await reader(ch, name, prefix)
                ws = WatchStream(ch, await login(ch, name, "pw"))
                first = await ws.create(prefix, range_end=_end(prefix))
                assert (first.watch_id, first.canceled) == (0, False), first
                await kill()
                canceled = await next_cancel(ws)
                assert (canceled.watch_id, canceled.cancel_reason) == (0, INVALID_TOKEN), (name, canceled)
                late = await ws.create(prefix, range_end=_end(prefix), start_revision=1)
                assert (late.watch_id, late.canceled, late.cancel_reason, len(late.events)) == (
                    -1, True, OLD_REVISION, 0), (name, late)
                ws.close()

        run(srv, scenario)
    finally:
        srv.stop()


def test_password_changed_during_failover(tmp_path: Path) -> None:
    """The watch is resumed on a new leader where the password has already changed: it is
    checked against the credentials the stream was opened with, and canceled."""
    with local_cluster(tmp_path, nodes=3) as cluster:
        endpoint = f"http://{cluster.endpoint}"
        for args in [("user", "add", f"root:{ROOT_PW}"), ("user", "add", "alice:pw"), ("role", "add", "r"),
                     ("role", "grant-permission", "r", "read", "f/", "--prefix"), ("user", "grant-role", "alice", "r"),
                     ("auth", "enable")]:
            rc, out, err = etcdctl(endpoint, *args, user=None if args[:2] == ("user", "add") else f"root:{ROOT_PW}")
            assert rc == 0, (args, out, err)

        async def retry(call):  # type: ignore[no-untyped-def]
            for _ in range(100):
                try:
                    return await call()
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.2)  # the next attempt of a bounded retry loop
            raise AssertionError("no leader")

        async def main() -> None:
            async with grpc.aio.insecure_channel(cluster.endpoint) as ch:
                ws = WatchStream(ch, await login(ch, "alice", "pw"))
                created = await ws.create(b"f/", range_end=b"f0")
                assert (created.watch_id, created.canceled) == (0, False), created
                leader = await asyncio.to_thread(cluster.leader)
                assert leader.foreign_pid is not None
                os.kill(leader.foreign_pid, signal.SIGSTOP)  # the proxy's stream stays on it
                try:
                    others = cluster.followers(leader)
                    await asyncio.to_thread(cluster.leader, 60.0, others)

                    async def change() -> None:
                        root = await login(ch, "root", ROOT_PW)
                        await pbg.AuthStub(ch).UserChangePassword(
                            pb.AuthUserChangePasswordRequest(name="alice", password="new"), metadata=md(root),
                            timeout=5)

                    await retry(change)
                finally:
                    await asyncio.to_thread(cluster.kill, leader)  # SIGKILL ends a stopped process too

                async def secret() -> None:
                    root = await login(ch, "root", ROOT_PW)
                    await pbg.KVStub(ch).Put(pb.PutRequest(key=b"f/after", value=b"secret"), metadata=md(root),
                                             timeout=5)

                await retry(secret)
                got = await next_cancel(ws, timeout=60)
                assert (got.watch_id, got.cancel_reason) == (0, INVALID_TOKEN), got
                ws.close()

        asyncio.run(main())


def test_a_token_death_ends_only_its_streams_watches(simple: RaftgateLocal) -> None:  # noqa: F811
    """Two users' streams on one proxy share its store stream (sub-streams of one WatchShared):
    one user's password change cancels that user's watches only; the other's stream goes on."""
    async def scenario(ch: grpc.aio.Channel) -> None:
        await reader(ch, "dies", b"dies/")
        await reader(ch, "lives", b"lives/")
        dying = WatchStream(ch, await login(ch, "dies", "pw"))
        living = [WatchStream(ch, await login(ch, "lives", "pw")) for _ in range(2)]
        try:
            assert not (await dying.create(b"dies/", range_end=b"dies0")).canceled
            for ws in living:
                assert not (await ws.create(b"lives/", range_end=b"lives0")).canceled
            root = await login(ch, "root", ROOT_PW)
            await pbg.AuthStub(ch).UserChangePassword(
                pb.AuthUserChangePasswordRequest(name="dies", password="new"), metadata=md(root))
            canceled = await next_cancel(dying)
            assert (canceled.watch_id, canceled.cancel_reason) == (0, INVALID_TOKEN), canceled
            rev = await put(ch, b"lives/after", b"v")
            for ws in living:
                resp = await ws.recv()
                assert not resp.canceled and [e.kv.mod_revision for e in resp.events] == [rev], resp
        finally:
            for ws in [dying, *living]:
                ws.close()

    run(simple, scenario)
