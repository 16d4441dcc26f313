"""End to end through the proxy's gRPC server against a fake Store servicer (both on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import bcrypt
import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from proxy.server import ProxyServer
from raftgate.errors import Err
from tests.support.fake_store import ROOT_PW, FakeStore, _ec_key_files, login, md, run


def test_authenticate_then_put_stamps_header(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        token = await login(ch)
        prefix, index = token.split(".")
        assert len(prefix) == 16 and prefix.isalpha() and index == "101"
        auth = fake.requests[-1].authenticate
        assert auth.name == "root" and auth.password == "" and auth.checked_revision == 5
        assert auth.ttl_seconds == 300 and auth.issued_at_unix_ms > 0
        resp = await rpc_pb2_grpc.KVStub(ch).Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), metadata=md(token))
        assert resp.header.revision == 11 and resp.header.cluster_id == 1
        sent = fake.requests[-1]
        assert sent.header.username == "root" and sent.header.auth_revision == 5
        assert sent.put.key == b"k" and sent.put.value == b"v"
        # Bearer prefix and the authorization key work too.
        r = await rpc_pb2_grpc.KVStub(ch).Range(
            rpc_pb2.RangeRequest(key=b"k"), metadata=(("authorization", "Bearer " + token),)
        )
        assert r.kvs[0].value == b"root"

    run(tmp_path, scenario)


def test_errors_pass_through(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        kv = rpc_pb2_grpc.KVStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k"))
        assert (e.value.code(), e.value.details()) == (Err.USER_EMPTY.code, Err.USER_EMPTY.message)
        token = await login(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"deny"), metadata=md(token))
        assert (e.value.code(), e.value.details()) == (Err.PERMISSION_DENIED.code, Err.PERMISSION_DENIED.message)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md("abcdefghijklmnop.999"))
        assert (e.value.code(), e.value.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md("junk"))
        assert e.value.details() == Err.INVALID_AUTH_TOKEN.message
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"x" * 5000), metadata=md(token))
        assert (e.value.code(), e.value.details()) == (Err.REQUEST_TOO_LARGE.code, Err.REQUEST_TOO_LARGE.message)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await rpc_pb2_grpc.ClusterStub(ch).MemberList(rpc_pb2.MemberListRequest(), metadata=md(token))
        assert e.value.code() == grpc.StatusCode.INTERNAL
        with pytest.raises(grpc.aio.AioRpcError) as e:
            call = rpc_pb2_grpc.WatchStub(ch).Watch()
            await call.write(rpc_pb2.WatchRequest())
            await call.read()
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED

    run(tmp_path, scenario)


def test_tokens_ignored_when_auth_disabled(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        fake.auth_enabled = False
        await rpc_pb2_grpc.KVStub(ch).Put(rpc_pb2.PutRequest(key=b"k"), metadata=md("garbage"))
        assert fake.requests[-1].header.username == ""
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await login(ch)
        assert e.value.details() == Err.AUTH_NOT_ENABLED.message

    run(tmp_path, scenario)


def test_old_revision_retried_once_for_simple_tokens(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        token = await login(ch)
        kv = rpc_pb2_grpc.KVStub(ch)
        await kv.Put(rpc_pb2.PutRequest(key=b"a"), metadata=md(token))
        resolves = fake.resolve_calls
        fake.revision += 1  # an unrelated auth change; the proxy's cached revision is now stale
        await kv.Put(rpc_pb2.PutRequest(key=b"b"), metadata=md(token))
        assert fake.requests[-1].header.auth_revision == 6
        assert fake.resolve_calls == resolves + 1
        # Refused twice in a row -> the second refusal reaches the client.
        fake.force_old_revision = 2
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"c"), metadata=md(token))
        assert e.value.details() == Err.AUTH_OLD_REVISION.message

    run(tmp_path, scenario)


def test_simple_token_resolution_is_cached(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        token = await login(ch)
        kv = rpc_pb2_grpc.KVStub(ch)
        await asyncio.gather(*(kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md(token)) for _ in range(20)))
        assert fake.resolve_calls == 1

    run(tmp_path, scenario)


def test_authenticate_failures_and_retry(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        fake.users["nopw"] = (b"", True)
        for name, password, err in [
            ("root", "wrong", Err.AUTH_FAILED),
            ("ghost", "x", Err.AUTH_FAILED),
            ("nopw", "x", Err.NO_PASSWORD_USER),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await login(ch, name, password)
            assert (e.value.code(), e.value.details()) == (err.code, err.message), name
        # The revision moves during the first two commits: the proxy re-checks and succeeds.
        fake.moves_during_authenticate = 2
        calls = fake.credentials_calls
        token = await login(ch)
        assert token and fake.credentials_calls == calls + 3
        assert fake.requests[-1].authenticate.checked_revision == 7
        # It keeps moving: retried until the deadline (the default one: the client set none),
        # then etcd's "request timed out" - not a misleading "authentication failed".
        fake.moves_during_authenticate = 10**9
        proxy.authenticator.default_deadline = 0.5
        calls = fake.credentials_calls
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await login(ch)
        assert (e.value.code(), e.value.details()) == (Err.TIMEOUT.code, Err.TIMEOUT.message)
        assert fake.credentials_calls > calls + 5  # far more than the old bound of 5 attempts
        # With a client deadline, that deadline bounds the retries.
        proxy.authenticator.default_deadline = 60.0
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await rpc_pb2_grpc.AuthStub(ch).Authenticate(
                rpc_pb2.AuthenticateRequest(name="root", password=ROOT_PW), timeout=0.5
            )
        assert e.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, Err.TIMEOUT.code)
        assert loop.time() - started < 5
        # The churn stops: the next login succeeds.
        fake.moves_during_authenticate = 0
        assert await login(ch)

    run(tmp_path, scenario)


def test_authenticate_past_the_proxys_own_deadline_is_etcds_timeout(tmp_path: Path) -> None:
    """A client without a deadline never sees DEADLINE_EXCEEDED from a deadline it did not set:
    when the proxy's own bound passes during a store call, the answer is etcd's `request timed out`."""
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        proxy.authenticator.default_deadline = 0.3
        fake.authenticate_delay = 1.0
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await login(ch)
        assert (e.value.code(), e.value.details()) == (Err.TIMEOUT.code, Err.TIMEOUT.message)
        fake.authenticate_delay = 0.0
        proxy.authenticator.default_deadline = 60.0
        assert await login(ch)

    run(tmp_path, scenario)


def test_user_add_and_change_password_are_hashed(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        token = await login(ch)
        auth = rpc_pb2_grpc.AuthStub(ch)
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="u", password="pw"), metadata=md(token))
        sent = fake.requests[-1].auth_user_add
        assert sent.password == "" and bcrypt.checkpw(b"pw", base64.b64decode(sent.hashedPassword))
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="e", password=""), metadata=md(token))
        assert bcrypt.checkpw(b"", base64.b64decode(fake.requests[-1].auth_user_add.hashedPassword))
        req = rpc_pb2.AuthUserAddRequest(name="n", password="pw", hashedPassword="forged")
        req.options.no_password = True
        await auth.UserAdd(req, metadata=md(token))
        sent = fake.requests[-1].auth_user_add
        assert sent.options.no_password and sent.password == "" and sent.hashedPassword == ""
        await auth.UserChangePassword(
            rpc_pb2.AuthUserChangePasswordRequest(name="u", password="p2"), metadata=md(token)
        )
        sent = fake.requests[-1].auth_user_change_password
        assert sent.password == "" and bcrypt.checkpw(b"p2", base64.b64decode(sent.hashedPassword))
        forged = rpc_pb2.AuthUserChangePasswordRequest(name="u", password="", hashedPassword="forged")
        await auth.UserChangePassword(forged, metadata=md(token))
        assert fake.requests[-1].auth_user_change_password.hashedPassword == ""
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="l", password="x" * 73), metadata=md(token))
        assert e.value.details() == Err.PASSWORD_TOO_LONG.message

    run(tmp_path, scenario)


def test_streams(tmp_path: Path) -> None:
    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        token = await login(ch)
        chunks = [
            c async for c in rpc_pb2_grpc.MaintenanceStub(ch).Snapshot(rpc_pb2.SnapshotRequest(), metadata=md(token))
        ]
        assert [c.remaining_bytes for c in chunks] == [2, 1, 0] and chunks[1].blob == b"\x01" * 10
        assert fake.requests[-1].HasField("snapshot")
        got = [m async for m in rpc_pb2_grpc.KVStub(ch).RangeStream(rpc_pb2.RangeRequest(key=b"x"), metadata=md(token))]
        assert len(got) == 1 and got[0].range_response.kvs[0].key == b"x"
        call = rpc_pb2_grpc.LeaseStub(ch).LeaseKeepAlive(metadata=md(token))
        for lease in (7, 8):
            await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease))
            resp = await call.read()
            got = {"id": resp.ID, "ttl": resp.TTL, "sent": fake.requests[-1].lease_keep_alive.ID}
            assert got == {"id": lease, "ttl": 30, "sent": lease}
            assert fake.requests[-1].header.username == "root"
        await call.done_writing()
        # An empty request message still arrives as a present field.
        await rpc_pb2_grpc.AuthStub(ch).AuthEnable(rpc_pb2.AuthEnableRequest(), metadata=md(token))
        assert fake.requests[-1].HasField("auth_enable")

    run(tmp_path, scenario)


def test_health_and_reflection(tmp_path: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        resp = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service="etcdserverpb.KV"))
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        call = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        answer = await call.read()
        names = {s.name for s in answer.list_services_response.service}
        assert {"etcdserverpb.KV", "etcdserverpb.Auth", "etcdserverpb.Lease", "grpc.health.v1.Health"} <= names
        await call.done_writing()

    run(tmp_path, scenario)


def test_jwt_authenticate_and_resolve(tmp_path: Path) -> None:
    priv, pub = _ec_key_files(tmp_path)

    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, proxy: ProxyServer) -> None:
        token = await login(ch)
        assert token.count(".") == 2
        assert fake.requests[-1].authenticate.simple_token == ""
        assert proxy.config.jwt is not None
        identity = proxy.config.jwt.verify(token)
        assert identity is not None and (identity.username, identity.revision) == ("root", 5)
        kv = rpc_pb2_grpc.KVStub(ch)
        await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md(token))
        assert (fake.requests[-1].header.username, fake.requests[-1].header.auth_revision) == ("root", 5)
        assert fake.resolve_calls == 0
        # A JWT goes stale after an auth change: no retry, the client re-authenticates (etcd).
        fake.revision += 1
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md(token))
        assert e.value.details() == Err.AUTH_OLD_REVISION.message
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md(token + "x"))
        assert e.value.details() == Err.INVALID_AUTH_TOKEN.message
        fake.auth_enabled = False
        await kv.Put(rpc_pb2.PutRequest(key=b"k"), metadata=md(token + "x"))
        assert fake.requests[-1].header.username == ""

    run(tmp_path, scenario, f"--auth-token=jwt,priv-key={priv},pub-key={pub},sign-method=ES256,ttl=1m")


def test_jwt_verify_only_refuses_authenticate(tmp_path: Path) -> None:
    _, pub = _ec_key_files(tmp_path)

    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await login(ch)
        assert (e.value.code(), e.value.details()) == (Err.VERIFY_ONLY.code, Err.VERIFY_ONLY.message)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await login(ch, "root", "bad")
        assert e.value.details() == Err.AUTH_FAILED.message

    run(tmp_path, scenario, f"--auth-token=jwt,pub-key={pub},sign-method=ES256")
