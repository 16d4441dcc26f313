"""The proxy's gRPC server in process against a fake Store servicer (both on 127.0.0.1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import grpc.aio

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
            async with asyncio.timeout(20):
                await scenario(fake, channel, proxy)
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


def _ec_key_files(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization as s
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = tmp_path / "jwt.key", tmp_path / "jwt.pub"
    priv.write_bytes(key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub
