"""End to end through the proxy's gRPC server against a fake Store servicer (both on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import raft_internal_pb2, rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2, store_pb2_grpc
from proxy import config as proxy_config
from proxy.server import ProxyServer
from raftgate.errors import Err
from raftgate.secret_proof import INTERNAL, Challenges, ProofCheck

SECRET = "s3cret-for-tests"
ROOT_PW = "rootpw"


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _CallContext:
    """What Do needs of a context, for one call of a DoStream batch."""

    def __init__(self, metadata: Any) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Any:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(code, details)


class FakeStore(store_pb2_grpc.StoreServicer):
    """Just enough of the store's contract to drive the proxy: auth state, tokens, a few KV calls."""

    def __init__(self) -> None:
        self.auth_enabled = True
        self.revision = 5
        self.kv_revision = 10
        self.users: dict[str, tuple[bytes, bool]] = {
            "root": (bcrypt.hashpw(ROOT_PW.encode(), bcrypt.gensalt(4)), False)
        }
        self.tokens: dict[str, str] = {}
        self.index = 100
        self.requests: list[raft_internal_pb2.InternalRaftRequest] = []
        self.resolve_calls = 0
        self.credentials_calls = 0
        #: Before each authenticate commit: bump the revision this many more times (simulates a race).
        self.moves_during_authenticate = 0
        #: Answer the next Put with "old revision" this many times regardless of the header.
        self.force_old_revision = 0
        #: Seconds the authenticate commit takes (a slow or overloaded store).
        self.authenticate_delay = 0.0

    async def _check_secret(self, context: grpc.aio.ServicerContext) -> None:
        """The server's ProofCheck (``fake_store_server``) let only a proof of SECRET through."""

    def _header(self) -> rpc_pb2.ResponseHeader:
        return rpc_pb2.ResponseHeader(cluster_id=1, member_id=2, revision=self.kv_revision, raft_term=3)

    async def Do(self, request: raft_internal_pb2.InternalRaftRequest, context: Any) -> store_pb2.InternalResponse:
        await self._check_secret(context)
        self.requests.append(request)
        (kind,) = [f.name for f, _ in request.ListFields() if f.name not in ("header", "ID")]
        h = request.header
        if kind == "authenticate":
            a = request.authenticate
            if self.authenticate_delay:
                await asyncio.sleep(self.authenticate_delay)
            if self.moves_during_authenticate:
                self.moves_during_authenticate -= 1
                self.revision += 1
            if a.checked_revision != self.revision:
                await context.abort(grpc.StatusCode.ABORTED, "raftgate: auth revision moved")
            self.index += 1
            token = f"{a.simple_token}.{self.index}" if a.simple_token else ""
            if token:
                self.tokens[token] = a.name
            return store_pb2.InternalResponse(
                authenticate=rpc_pb2.AuthenticateResponse(header=self._header(), token=token)
            )
        # The store's order: request validation, then a token the proxy could not resolve.
        if kind in ("put", "range") and not getattr(request, kind).key:
            await context.abort(Err.EMPTY_KEY.code, Err.EMPTY_KEY.message)
        if self.auth_enabled and h.invalid_token:
            await context.abort(Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)
        if kind == "auth_status":
            return store_pb2.InternalResponse(
                auth_status=rpc_pb2.AuthStatusResponse(
                    header=self._header(), enabled=self.auth_enabled, authRevision=self.revision
                )
            )
        if self.auth_enabled:
            if self.force_old_revision and kind == "put":
                self.force_old_revision -= 1
                await context.abort(Err.AUTH_OLD_REVISION.code, Err.AUTH_OLD_REVISION.message)
            if h.auth_revision == 0 and not h.username:
                await context.abort(Err.USER_EMPTY.code, Err.USER_EMPTY.message)
            if h.auth_revision < self.revision:
                await context.abort(Err.AUTH_OLD_REVISION.code, Err.AUTH_OLD_REVISION.message)
        if kind == "put":
            if request.put.key == b"deny":
                await context.abort(Err.PERMISSION_DENIED.code, Err.PERMISSION_DENIED.message)
            self.kv_revision += 1
            return store_pb2.InternalResponse(put=rpc_pb2.PutResponse(header=self._header()))
        if kind == "range":
            kv = {"key": request.range.key, "value": h.username.encode()}
            return store_pb2.InternalResponse(range=rpc_pb2.RangeResponse(header=self._header(), kvs=[kv], count=1))
        if kind == "auth_user_add":
            return store_pb2.InternalResponse(auth_user_add=rpc_pb2.AuthUserAddResponse(header=self._header()))
        if kind == "auth_user_change_password":
            return store_pb2.InternalResponse(
                auth_user_change_password=rpc_pb2.AuthUserChangePasswordResponse(header=self._header())
            )
        if kind == "auth_enable":
            return store_pb2.InternalResponse(auth_enable=rpc_pb2.AuthEnableResponse(header=self._header()))
        if kind == "lease_keep_alive":
            ka = rpc_pb2.LeaseKeepAliveResponse(header=self._header(), ID=request.lease_keep_alive.ID, TTL=30)
            return store_pb2.InternalResponse(lease_keep_alive=ka)
        if kind == "member_list":  # answers with the wrong oneof member: the proxy must notice
            return store_pb2.InternalResponse(status=rpc_pb2.StatusResponse())
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"fake store: {kind}")
        raise AssertionError

    async def DoStream(self, batches: AsyncIterator[store_pb2.DoBatch], context: Any) -> AsyncIterator[Any]:
        """The proxy's path for Do, Credentials and ResolveToken: each call answered as the unary
        method would answer it alone."""
        await self._check_secret(context)
        await context.send_initial_metadata(())
        async for batch in batches:
            results = []
            for call in batch.calls:
                one = _CallContext(context.invocation_metadata())
                try:
                    if call.method == store_pb2.DoCall.CREDENTIALS:
                        answer = await self.Credentials(store_pb2.CredentialsRequest.FromString(call.request), one)
                    elif call.method == store_pb2.DoCall.RESOLVE_TOKEN:
                        answer = await self.ResolveToken(store_pb2.ResolveTokenRequest.FromString(call.request), one)
                    else:
                        answer = await self.Do(raft_internal_pb2.InternalRaftRequest.FromString(call.request), one)
                    results.append(store_pb2.DoResult(id=call.id, response=answer.SerializeToString()))
                except _Aborted as refusal:
                    results.append(store_pb2.DoResult(id=call.id, code=refusal.code.value[0],
                                                      message=refusal.details))
            yield store_pb2.DoResultBatch(results=results)

    async def Snapshot(self, request: raft_internal_pb2.InternalRaftRequest, context: Any) -> AsyncIterator[Any]:
        await self._check_secret(context)
        self.requests.append(request)
        if request.header.username != "root":
            await context.abort(Err.PERMISSION_DENIED.code, Err.PERMISSION_DENIED.message)
        for i in range(3):
            yield rpc_pb2.SnapshotResponse(remaining_bytes=2 - i, blob=bytes([i]) * 10)

    async def Credentials(self, request: store_pb2.CredentialsRequest, context: Any) -> store_pb2.CredentialsResponse:
        await self._check_secret(context)
        self.credentials_calls += 1
        user = self.users.get(request.name)
        return store_pb2.CredentialsResponse(
            auth_enabled=self.auth_enabled,
            auth_revision=self.revision,
            found=user is not None,
            no_password=bool(user and user[1]),
            password_hash=user[0] if user else b"",
        )

    async def ResolveToken(
        self, request: store_pb2.ResolveTokenRequest, context: Any
    ) -> store_pb2.ResolveTokenResponse:
        await self._check_secret(context)
        self.resolve_calls += 1
        name = self.tokens.get(request.token)
        return store_pb2.ResolveTokenResponse(
            auth_enabled=self.auth_enabled, auth_revision=self.revision, valid=name is not None, username=name or ""
        )


def fake_store_server() -> grpc.aio.Server:
    """A server for FakeStore: every call proves SECRET, as on a store's internal port."""
    check = ProofCheck(Challenges(INTERNAL, (SECRET.encode(),)), "raftgate: internal credential required")
    return grpc.aio.server(interceptors=[check])


Scenario = Callable[[FakeStore, grpc.aio.Channel, ProxyServer], Awaitable[None]]


def run(tmp_path: Path, scenario: Scenario, *extra_args: str) -> None:
    async def main() -> None:
        fake = FakeStore()
        store_server = fake_store_server()
        store_pb2_grpc.add_StoreServicer_to_server(fake, store_server)
        store_port = store_server.add_insecure_port("127.0.0.1:0")
        await store_server.start()
        secret_file = tmp_path / "secret"
        secret_file.write_text(SECRET + "\n")
        cfg = proxy_config.load(
            [
                "--listen-client-urls=http://127.0.0.1:0",
                f"--store-endpoints=127.0.0.1:{store_port}",
                f"--internal-secret-file={secret_file}",
                "--bcrypt-cost=4",
                "--bcrypt-workers=2",
                "--max-request-bytes=4096",
                *extra_args,
            ],
            env={},
        )
        proxy = ProxyServer(cfg)
        (address,) = await proxy.start()
        channel = grpc.aio.insecure_channel(address)
        try:
            await asyncio.wait_for(scenario(fake, channel, proxy), timeout=20)
        finally:
            await channel.close()
            await proxy.stop(0)
            await store_server.stop(0)

    asyncio.run(main())


async def login(channel: grpc.aio.Channel, name: str = "root", password: str = ROOT_PW) -> str:
    resp = await rpc_pb2_grpc.AuthStub(channel).Authenticate(rpc_pb2.AuthenticateRequest(name=name, password=password))
    return resp.token


def md(token: str) -> tuple[tuple[str, str], ...]:
    return (("token", token),)


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


def _ec_key_files(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / "jwt.key", tmp_path / "jwt.pub"
    priv.write_bytes(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


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
