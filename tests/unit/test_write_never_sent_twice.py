"""The proxy never sends a write twice when it cannot know whether the store took it.

The retry set is derived from the method table (raftgate/methods.py, RETRY_FIELDS): a row wrongly
marked retryable would make a Put, a Txn with writes, a LeaseGrant (a second lease), an
Authenticate (a second token) or a MemberAdd (a second member) happen twice. For every unary row,
StoreClient.do meets a stream that broke after the call was written (OutcomeUnknown) and each of
etcd's "outcome unknown" answers: writes are sent once and answered with etcd's error, reads are
asked again.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from protos import wire
from proxy.store_client import StoreClient
from proxy.store_pipe import OutcomeUnknown, rpc_error
from raftgate.errors import Err, EtcdError
from raftgate.methods import METHODS, RETRY_FIELDS, Kind

#: Requests that change something; none may ever be retried after an unknown outcome.
WRITES = {"put", "delete_range", "txn", "compaction", "lease_grant", "lease_revoke", "lease_keep_alive",
          "member_add", "member_remove", "member_update", "member_promote", "alarm", "defragment", "move_leader",
          "downgrade", "auth_enable", "auth_disable", "authenticate", "auth_user_add", "auth_user_delete",
          "auth_user_change_password", "auth_user_grant_role", "auth_user_revoke_role", "auth_role_add",
          "auth_role_delete", "auth_role_grant_permission", "auth_role_revoke_permission"}
UNARY = [m for m in METHODS if m.kind not in (Kind.WATCH, Kind.SNAPSHOT, Kind.RANGE_STREAM)]
FAILURES = {
    "stream broke": lambda: rpc_error(grpc.StatusCode.UNAVAILABLE, "stream broke", OutcomeUnknown),
    **{err.name: (lambda e=err: rpc_error(e.code, e.message)) for err in
       (Err.TIMEOUT, Err.TIMEOUT_DUE_TO_LEADER_FAIL, Err.LEADER_CHANGED)},
}


def test_every_unary_method_is_a_known_read_or_write() -> None:
    assert {m.request for m in UNARY} - WRITES == {m.request for m in UNARY if m.retry}
    assert not {m.field for m in UNARY if m.request in WRITES} & RETRY_FIELDS


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("method", UNARY, ids=lambda m: f"{m.service}.{m.name}")
def test_a_write_whose_outcome_is_unknown_is_sent_once(method: object, failure: str) -> None:
    assert hasattr(method, "request")
    sent: list[bytes] = []

    async def run() -> BaseException | None:
        client = StoreClient("127.0.0.1:1")
        endpoint = client._endpoints[0]  # noqa: SLF001 - the one node, its stream replaced

        async def do(data: bytes, timeout: float | None, *rest: object, token: str | None = None) -> bytes:
            sent.append(data)
            raise FAILURES[failure]()

        endpoint.pipe.do = do  # type: ignore[method-assign]
        try:
            await client.do(wire.build_internal_request(None, method.field, b""), timeout=0.6)  # type: ignore[attr-defined]
        except (grpc.aio.AioRpcError, EtcdError) as exc:
            return exc
        finally:
            await client.close()
        return None

    error = asyncio.run(run())
    assert error is not None
    if method.request in WRITES:  # type: ignore[attr-defined]
        assert len(sent) == 1, f"{method} sent {len(sent)} times"
    else:
        assert len(sent) > 1, f"{method}: a read not asked again"
