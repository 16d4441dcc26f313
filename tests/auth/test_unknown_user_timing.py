"""Trust item 5: an unknown user name costs what a real user's password check costs.

Authenticate for a name that does not exist still runs one bcrypt check, so a miss takes as long
as a wrong password. That only holds if the check runs at the cost the stored hashes actually have,
not at the proxy's ``--bcrypt-cost`` (users created earlier or elsewhere may have another cost).
Time is not asserted (no timing assertions): the tests check the cost of the hash bcrypt runs with.

1. The store answers Credentials for an unknown user with a decoy hash at the users' cost.
2. The proxy checks the password of an unknown user against that decoy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import bcrypt
import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2
from proxy import passwords
from proxy.server import ProxyServer
from raftgate.errors import Err
from raftgate.secret_proof import proving_channel
from tests.support.fake_store import FakeStore, login, run
from tests.support.processes import SECRET, free_port, proxy_program, store_program, wait_serving


def _cost(hashed: bytes) -> int:
    return int(hashed.split(b"$")[2])


@pytest.fixture
def store_with_cost6_users(tmp_path: Path) -> Iterator[str]:
    """A store whose users were created by a proxy with --bcrypt-cost 6; yields its internal address."""
    store, internal = store_program(tmp_path)
    store.start()
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}", "--bcrypt-cost", "6")
    try:
        proxy.start()
        wait_serving(f"http://127.0.0.1:{port}")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            auth = rpc_pb2_grpc.AuthStub(ch)
            for name in ("root", "alice", "bob"):
                auth.UserAdd(rpc_pb2.AuthUserAddRequest(name=name, password="pw"), timeout=30)
        yield internal
    finally:
        proxy.stop()
        store.stop()


@pytest.mark.slow
def test_store_answers_unknown_users_with_a_decoy_at_the_users_cost(store_with_cost6_users: str) -> None:
    with grpc.insecure_channel(store_with_cost6_users) as ch:
        call = proving_channel(ch, SECRET).unary_unary(
            "/raftgate.storepb.Store/Credentials", request_serializer=store_pb2.CredentialsRequest.SerializeToString,
            response_deserializer=store_pb2.CredentialsResponse.FromString)
        alice = call(store_pb2.CredentialsRequest(name="alice"), timeout=30)
        nobody = call(store_pb2.CredentialsRequest(name="nobody"), timeout=30)
    assert alice.found and _cost(alice.password_hash) == 6
    assert not nobody.found
    assert nobody.password_hash.startswith(b"$2a$06$") and len(nobody.password_hash) == 60
    assert not bcrypt.checkpw(b"pw", nobody.password_hash)  # well-formed, and matches nothing


class _DecoyStore(FakeStore):
    """Answers as the store does: an unknown user comes with a decoy hash at the users' cost."""

    DECOY = bcrypt.hashpw(b"decoy", bcrypt.gensalt(6, prefix=b"2a"))

    async def Credentials(self, request: store_pb2.CredentialsRequest,
                          context: object) -> store_pb2.CredentialsResponse:
        answer = await super().Credentials(request, context)
        if not answer.found:
            answer.password_hash = self.DECOY
        return answer


def test_proxy_checks_an_unknown_user_at_the_stored_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    costs: list[int] = []
    real = passwords._checkpw

    def spy(raw: bytes, hashed: bytes) -> bool:
        costs.append(_cost(hashed))
        return real(raw, hashed)

    monkeypatch.setattr(passwords, "_checkpw", spy)
    monkeypatch.setattr("tests.support.fake_store.FakeStore", _DecoyStore)

    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _: ProxyServer) -> None:
        assert isinstance(fake, _DecoyStore)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await login(ch, "nobody", "guess")
        assert (e.value.code(), e.value.details()) == (Err.AUTH_FAILED.code, Err.AUTH_FAILED.message)
        assert costs == [6]  # the proxy's --bcrypt-cost is 4

    run(tmp_path, scenario)
