"""A crash during a revocation: kill -9 of the store leader while UserChangePassword is in flight.

Whatever the client was told, afterwards the user's old token and its password agree on every
node: if the new password works, the old token is refused (`invalid auth token`) for a request,
a keep-alive and a watch create; if the old password still works, so does the old token. An
acknowledged change is never lost.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate.errors import Err
from tests.support.cluster import Client, program_cluster, retry_ok, setup_auth

pytestmark = pytest.mark.slow
ROUNDS = 5
INVALID_TOKEN_REASON = "rpc error: code = Unauthenticated desc = etcdserver: invalid auth token"


def _works(target: str, name: str, password: str) -> bool:
    with grpc.insecure_channel(target) as ch:
        try:
            request = rpc_pb2.AuthenticateRequest(name=name, password=password)
            rpc_pb2_grpc.AuthStub(ch).Authenticate(request, timeout=10)
            return True
        except grpc.RpcError as e:
            if (e.code(), e.details()) == (Err.AUTH_FAILED.code, Err.AUTH_FAILED.message):
                return False
            raise


def _token_refused(target: str, token: str) -> bool:
    """Whether LeaseGrant, a keep-alive and a watch create all refuse the token (all or none)."""
    md = (("token", token),)
    with grpc.insecure_channel(target) as ch:
        lease = rpc_pb2_grpc.LeaseStub(ch)
        try:
            lease.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=60), metadata=md, timeout=10)
            granted = True
        except grpc.RpcError as e:
            assert (e.code(), e.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message), e
            granted = False
        try:
            ttl = next(iter(lease.LeaseKeepAlive(iter([rpc_pb2.LeaseKeepAliveRequest(ID=1)]), metadata=md,
                                                 timeout=10)))
            kept = ttl is not None
        except grpc.RpcError as e:
            assert (e.code(), e.details()) == (Err.INVALID_AUTH_TOKEN.code, Err.INVALID_AUTH_TOKEN.message), e
            kept = False
        requests: queue.Queue[rpc_pb2.WatchRequest | None] = queue.Queue()
        requests.put(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=b"w")))

        def send() -> Iterator[rpc_pb2.WatchRequest]:
            while (item := requests.get(timeout=30)) is not None:
                yield item

        answers = rpc_pb2_grpc.WatchStub(ch).Watch(send(), metadata=md, timeout=30)
        created = next(answers)
        requests.put(None)
        answers.cancel()
        watched = not created.canceled
        if not watched:
            assert created.cancel_reason == INVALID_TOKEN_REASON, created
    assert granted == kept == watched, (granted, kept, watched)
    return not granted


def test_a_password_change_and_the_old_token_agree_after_a_leader_kill(tmp_path: Path) -> None:
    with program_cluster(tmp_path / "c", nodes=3) as cluster:
        root = Client(cluster.endpoint)
        setup_auth(root)
        for round_ in range(ROUNDS):
            name, old, new = f"user{round_}", "old-pw", "new-pw"
            retry_ok(lambda name=name, old=old: root.auth.UserAdd(
                rpc_pb2.AuthUserAddRequest(name=name, password=old), metadata=root.md, timeout=5), 60, "UserAdd")
            retry_ok(lambda name=name: root.auth.UserGrantRole(  # READ on the watched key, so a create shows the token
                rpc_pb2.AuthUserGrantRoleRequest(user=name, role="root"), metadata=root.md, timeout=5), 60, "a grant")
            token = retry_ok(lambda name=name, old=old: Client(cluster.endpoint).login(name, old), 60, "a login")
            leader = cluster.leader()
            told: list[str] = []

            def change(name: str = name, new: str = new, told: list[str] = told) -> None:
                try:
                    root.auth.UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(name=name, password=new),
                                                 metadata=root.md, timeout=10)
                    told.append("ok")
                except grpc.RpcError as e:
                    told.append(f"{e.code().name}: {e.details()}")

            t = threading.Thread(target=change)
            t.start()
            for _ in range(round_ * 2):  # the kill lands a little later each round (round trips, not sleeps)
                root.auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)
            cluster.kill(leader)
            t.join(timeout=60)
            cluster.leader(timeout=30, among=cluster.followers(leader))
            retry_ok(lambda: root.login("root", "rootpw"), 60, "root to log in again")
            changed = retry_ok(lambda name=name, new=new: _works(cluster.endpoint, name, new), 60, "a login check")
            kept_old = retry_ok(lambda name=name, old=old: _works(cluster.endpoint, name, old), 60, "a login check")
            print(f"round {round_}: told {told}, changed {changed}")
            assert changed != kept_old, (changed, kept_old)
            if told == ["ok"]:
                assert changed, "an acknowledged password change was lost"
            refused = retry_ok(lambda token=token: _token_refused(cluster.endpoint, token), 60, "the old token's check")
            assert refused == changed, (told, changed, refused)
            cluster.restart(leader)
            cluster.wait_converged(timeout=60)
        root.close()
