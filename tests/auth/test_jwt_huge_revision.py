"""Trust item 4: a JWT whose ``revision`` claim is an integer >= 2^64 is refused as invalid.

Such a token verifies (its signature is good) but no auth revision can be that large, and the
header the proxy stamps holds a uint64: the client must get etcd's ``invalid auth token``, not an
unhandled error.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import grpc.aio
import jwt as pyjwt
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from proxy.server import ProxyServer
from raftgate.errors import Err
from tests.support.fake_store import FakeStore, _ec_key_files, md, run


@pytest.mark.parametrize("revision", [2**64, 2**64 + 7, 10**30])
def test_jwt_revision_beyond_uint64_is_an_invalid_token(tmp_path: Path, revision: int) -> None:
    priv, pub = _ec_key_files(tmp_path)
    payload = json.dumps({"exp": 4102444800, "revision": revision, "username": "root"}).encode()
    token = pyjwt.PyJWS().encode(payload, priv.read_bytes(), algorithm="ES256")

    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        kv = rpc_pb2_grpc.KVStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kv.Put(rpc_pb2.PutRequest(key=b"k", value=b"v"), metadata=md(token))
        assert (e.value.code(), e.value.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await rpc_pb2_grpc.AuthStub(ch).UserList(rpc_pb2.AuthUserListRequest(), metadata=md(token))
        assert (e.value.code(), e.value.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message)

    run(tmp_path, scenario, f"--auth-token=jwt,priv-key={priv},pub-key={pub},sign-method=ES256,ttl=1m")
