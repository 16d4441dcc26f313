"""The internal port's one table (raftgate/internal_access.py) against what the store serves.

Why: the store refuses whatever has no row, and allows exactly what a row says. A Store method,
DoStream call method or InternalRaftRequest field added without its row would be refused (or,
worse, allowed by a rule written for something else); here the lists come from the proto
descriptors and the store's own handlers, so such an addition fails until its cells are declared.
tests/internal/test_internal_access.py then calls every cell against a running store.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from authstore.api.callers import Classifier
from authstore.api.interceptors import CALLER, guarded
from authstore.api.server import StoreService, store_handlers
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.storepb import store_pb2 as spb
from protos.storepb.store_pb2 import ChallengeResponse
from raftgate import internal_access as access
from raftgate.internal_access import (
    DO_SENDERS,
    ROWS,
    TABLE,
    Caller,
    decide,
    rpc,
    stream_call,
)
from raftgate.methods import INTERNAL, METHODS, Kind, Route
from raftgate.secret_proof import INTERNAL as INTERNAL_PORT
from raftgate.secret_proof import proof_metadata

STORE = spb.DESCRIPTOR.services_by_name["Store"]
SERVICES = (STORE, health_pb2.DESCRIPTOR.services_by_name["Health"],
            reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"])
#: every method the internal port serves: each gRPC method, and each DoStream call method
SERVED = [rpc(s.full_name, m.name) for s in SERVICES for m in s.methods] + [
    stream_call(v.name) for v in spb.DoCall.Method.DESCRIPTOR.values]
#: every request kind: each InternalRaftRequest field that is a request
KINDS = [f.name for f in ipb.InternalRaftRequest.DESCRIPTOR.fields if f.message_type is not None and f.name != "header"]
KIND_METHODS = [row.method for row in ROWS if row.carries_kinds]


@pytest.mark.parametrize("method", SERVED)
def test_every_served_method_has_a_row(method: str) -> None:
    assert method in TABLE, f"{method} has no row in raftgate/internal_access.py"


def test_no_row_names_a_method_that_is_not_served() -> None:
    assert set(TABLE) - set(SERVED) == set()
    assert len(TABLE) == len(ROWS)


def test_the_store_serves_exactly_the_methods_of_its_proto() -> None:
    handlers = store_handlers(StoreService.__new__(StoreService))
    assert {rpc(STORE.full_name, name) for name in handlers} == {rpc(STORE.full_name, m.name) for m in STORE.methods}
    for m in STORE.methods:
        handler = handlers[m.name]
        assert (handler.request_streaming, handler.response_streaming) == (m.client_streaming, m.server_streaming)


def test_every_request_kind_has_its_senders() -> None:
    assert set(DO_SENDERS) == set(KINDS), "raftgate/internal_access.py DO_SENDERS: declare who may send each kind"
    for row in ROWS:
        for kinds in row.may.values():
            assert set(kinds or ()) <= set(KINDS), row.method


@pytest.mark.parametrize("caller", list(Caller), ids=lambda c: c.value)
@pytest.mark.parametrize("method", SERVED)
def test_every_cell_has_one_answer(method: str, caller: Caller) -> None:
    """Each method x class, and for the methods that carry requests each kind: allowed, or one
    refusal with etcd-style words (a code a client can act on)."""
    cells = [decide(method, caller)] + ([decide(method, caller, k) for k in KINDS] if method in KIND_METHODS else [])
    for answer in cells:
        if answer is not None:
            code, message = answer
            assert code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
            assert message.startswith("raftgate: ")


def test_a_method_without_a_row_is_refused_to_everyone() -> None:
    for caller in Caller:
        assert decide("/raftgate.storepb.Store/NewMethod", caller) is not None
        assert decide(stream_call("NEW_METHOD"), caller) is not None
    assert decide("/raftgate.storepb.Store/NewMethod", Caller.NONE) == access.UNAUTHENTICATED


# ---- what the table promises (THREAT_MODEL.md): each a property of the rows, not a list ----


def test_an_unauthenticated_caller_reaches_health_and_challenge_only() -> None:
    open_to_none = {m for m in SERVED if decide(m, Caller.NONE) is None}
    # probes (List: not implemented; Watch: a stream held open), and the nonce a development
    # secret is proven over: each answered at once
    assert open_to_none == {access.HEALTH_CHECK, access.CHALLENGE}
    for method in SERVED:
        if method not in open_to_none:
            assert decide(method, Caller.NONE) == access.UNAUTHENTICATED


def test_a_sidecar_may_not_read_hashes_nor_resolve_tokens() -> None:
    for method in (access.CREDENTIALS, access.CALL_CREDENTIALS, access.RESOLVE_TOKEN, access.CALL_RESOLVE_TOKEN):
        assert decide(method, Caller.SIDECAR) is not None
        assert decide(method, Caller.CENTRAL) is None


@pytest.mark.parametrize("caller", [Caller.CENTRAL, Caller.SIDECAR], ids=lambda c: c.value)
def test_snapshot_carries_the_snapshot_request_only(caller: Caller) -> None:
    snapshot = [m.request for m in METHODS if m.route is Route.SNAPSHOT]
    assert snapshot == ["snapshot"]
    assert [k for k in KINDS if decide(access.SNAPSHOT, caller, k) is None] == snapshot
    for method in (access.DO, access.CALL_DO):  # and it travels on nothing else
        assert decide(method, caller, "snapshot") is not None


def test_nobody_sends_the_entries_only_the_store_proposes() -> None:
    store_only = {e.request for e in INTERNAL} - {"auth_failures"}  # that one a central proxy records
    for method in KIND_METHODS:
        for caller in Caller:
            for kind in store_only:
                assert decide(method, caller, kind) is not None, (method, caller, kind)


def test_a_sidecar_sends_client_requests_only_and_never_the_authenticate_entry() -> None:
    internal = {e.request for e in INTERNAL}
    authenticate = {m.request for m in METHODS if m.kind is Kind.AUTHENTICATE}
    for method in (access.DO, access.CALL_DO):
        allowed = {k for k in KINDS if decide(method, Caller.SIDECAR, k) is None}
        assert allowed, method
        assert allowed & (internal | authenticate) == set()
        # what a central proxy may send there, a sidecar may send too, except these
        central = {k for k in KINDS if decide(method, Caller.CENTRAL, k) is None}
        assert central - allowed == {"authenticate", "auth_failures"}


def test_do_and_the_do_call_have_one_rule() -> None:
    assert TABLE[access.DO].may == TABLE[access.CALL_DO].may


# ---- the store's one check: before any handler runs ----

CENTRAL_SECRET, SIDECAR_SECRET = b"c" * 24, b"s" * 24


class _Aborted(Exception):
    pass


class _Context:
    """What the gate asks of a grpc.aio context: the proof of the secret presented; abort."""

    def __init__(self, secret: bytes | None, classifier: Classifier) -> None:
        self._metadata: tuple[tuple[str, str], ...] = ()
        if secret is not None:
            proofs = classifier.proofs
            assert proofs is not None
            nonce = ChallengeResponse.FromString(proofs.issue(self.peer())).nonce
            self._metadata = proof_metadata(secret, INTERNAL_PORT, proofs.member_id, nonce)
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    async def abort(self, code: grpc.StatusCode, message: str) -> NoReturn:
        self.aborted = (code, message)
        raise _Aborted


async def _run(behaviour: Callable[..., Any], context: _Context) -> list[Any]:
    result = behaviour(b"request", context)
    if inspect.isasyncgen(result):
        return [item async for item in result]
    return [await result]


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize(("secret", "method", "caller"), [
    (SIDECAR_SECRET, access.CREDENTIALS, Caller.SIDECAR),
    (SIDECAR_SECRET, access.RESOLVE_TOKEN, Caller.SIDECAR),
    (CENTRAL_SECRET, "/raftgate.storepb.Store/NotInTheTable", Caller.CENTRAL),
    (None, access.DO, Caller.NONE),
    (b"wrong", access.SNAPSHOT, Caller.NONE),
])
def test_the_store_gate_refuses_before_the_handler_runs(streaming: bool, secret: bytes | None, method: str,
                                                        caller: Caller) -> None:
    ran: list[Caller] = []

    async def unary(_request: bytes, _context: object) -> bytes:
        ran.append(CALLER.get())
        return b"answer"

    async def stream(_request: bytes, _context: object) -> AsyncIterator[bytes]:
        ran.append(CALLER.get())
        yield b"answer"

    classifier = Classifier(secret=CENTRAL_SECRET, sidecar_secret=SIDECAR_SECRET)
    context = _Context(secret, classifier)
    with pytest.raises(_Aborted):
        asyncio.run(_run(guarded(stream if streaming else unary, method, classifier), context))
    assert context.aborted is not None and context.aborted == decide(method, caller)
    assert ran == []


@pytest.mark.parametrize("streaming", [False, True], ids=["unary", "stream"])
def test_the_store_gate_tells_the_handler_who_calls(streaming: bool) -> None:
    ran: list[Caller] = []

    async def unary(_request: bytes, _context: object) -> bytes:
        ran.append(CALLER.get())
        return b"answer"

    async def stream(_request: bytes, _context: object) -> AsyncIterator[bytes]:
        ran.append(CALLER.get())
        yield b"answer"

    classifier = Classifier(secret=CENTRAL_SECRET, sidecar_secret=SIDECAR_SECRET)
    for secret, caller in ((CENTRAL_SECRET, Caller.CENTRAL), (SIDECAR_SECRET, Caller.SIDECAR),
                           (None, Caller.NONE)):
        behaviour = guarded(stream if streaming else unary, access.HEALTH_CHECK, classifier)
        assert asyncio.run(_run(behaviour, _Context(secret, classifier))) == [b"answer"]
        assert ran[-1] is caller
