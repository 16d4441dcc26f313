"""The one method table (raftgate/methods.py) against etcd's own service descriptors.

Why: the proxy serves, and the store answers, authorizes and retries exactly what the table says.
A method etcd has and the table lacks, or a row whose handler is missing on either side, is a
request that would be refused with the wrong error (or, worse, checked with the wrong rule).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from authstore.api.maintenance import Maintenance
from authstore.api.server import StoreService
from authstore.state.apply import Applier
from authstore.state.auth import authorize
from authstore.state.backend import Backend
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2
from proxy import services
from proxy.pipeline import Pipeline
from raftgate import methods
from raftgate.methods import INTERNAL, METHODS, REQUESTS, Kind, Perm, Route

ETCD_METHODS = [(svc, m) for svc in rpc_pb2.DESCRIPTOR.services_by_name.values() for m in svc.methods]
ROWS = {(m.service, m.name): m for m in METHODS}
#: how the proxy serves each kind: (client streaming, server streaming)
STREAMING = {Kind.UNARY: (False, False), Kind.AUTHENTICATE: (False, False), Kind.HASH_PASSWORD: (False, False),
             Kind.RANGE_STREAM: (False, True), Kind.SNAPSHOT: (False, True), Kind.KEEPALIVE: (True, True),
             Kind.WATCH: (True, True)}


@pytest.mark.parametrize(("service", "method"), ETCD_METHODS, ids=lambda v: v.name)
def test_every_etcd_method_is_in_the_table(service: Any, method: Any) -> None:
    row = ROWS.get((service.name, method.name))
    assert row is not None, f"{service.name}.{method.name} is not in raftgate/methods.py"
    assert STREAMING[row.kind] == (method.client_streaming, method.server_streaming), row


def test_the_table_has_no_method_etcd_lacks() -> None:
    etcd = {(svc.name, m.name) for svc, m in ETCD_METHODS}
    assert len(ROWS) == len(METHODS)
    assert set(ROWS) - etcd == set()


@pytest.mark.parametrize("row", METHODS, ids=lambda m: m.name)
def test_each_request_is_a_field_of_the_internal_request(row: methods.Method) -> None:
    if row.route is Route.WATCH:
        assert row.request == "" and row.field == 0  # its own store stream, Store.WatchBatches
        return
    field = ipb.InternalRaftRequest.DESCRIPTOR.fields_by_name[row.request]
    assert row.field == field.number
    etcd_input = rpc_pb2.DESCRIPTOR.services_by_name[row.service].methods_by_name[row.name].input_type
    if row.kind is not Kind.AUTHENTICATE:  # the proxy checks the password; the log gets no plaintext
        assert field.message_type is etcd_input, row


def test_every_request_of_the_internal_request_is_in_a_table() -> None:
    fields = {f.name for f in ipb.InternalRaftRequest.DESCRIPTOR.fields
              if f.message_type is not None and f.name != "header"}
    assert set(REQUESTS) == fields
    assert {e.request for e in INTERNAL}.isdisjoint(m.request for m in METHODS)


def test_rows_that_share_a_request_agree_and_retries_only_read() -> None:
    for row in METHODS:
        if row.request:
            shared = REQUESTS[row.request]
            assert (row.route, row.perm, row.read_only, row.retry) == (
                shared.route, shared.perm, shared.read_only, shared.retry), row
        assert not row.retry or row.read_only, row
        assert row.route is not Route.READ or row.read_only, row
        assert row.perm is not Perm.INTERNAL, row
    for entry in INTERNAL:
        assert entry.perm is Perm.INTERNAL and not entry.retry


# ---- every row has a handler where it is dispatched ----------------------------------------------

@pytest.mark.parametrize("row", METHODS, ids=lambda m: m.name)
def test_the_proxy_serves_every_method(row: methods.Method) -> None:
    assert callable(getattr(Pipeline, row.kind.value, None)), row
    assert services.handler(object.__new__(Pipeline), row) is not None


def test_the_proxy_registers_every_service() -> None:
    handlers = services.etcd_handlers(object.__new__(Pipeline))
    assert len(handlers) == len(rpc_pb2.DESCRIPTOR.services_by_name)


def test_the_applier_has_a_handler_for_every_applied_request(tmp_path: Path) -> None:
    applier = Applier(Backend(tmp_path / "db"), member_id=1)
    applied = {r for r, q in REQUESTS.items() if q.route in (Route.LOG, Route.READ)}
    # Authenticate is answered by Applier.execute itself (it needs the entry's index).
    assert set(applier._handlers) | {"authenticate"} == applied  # noqa: SLF001


@pytest.mark.parametrize("request_name", sorted(r for r, q in REQUESTS.items() if q.route is Route.MAINTENANCE))
def test_maintenance_answers_every_request_routed_to_it(request_name: str) -> None:
    assert callable(getattr(Maintenance, "_" + request_name, None))
    assert Maintenance.handles(object.__new__(Maintenance), request_name)


def test_maintenance_answers_nothing_else() -> None:
    for request_name, q in REQUESTS.items():
        if q.route is not Route.MAINTENANCE:
            assert not Maintenance.handles(object.__new__(Maintenance), request_name), request_name


def test_the_store_has_its_streams() -> None:
    routes = {m.route for m in METHODS}
    assert Route.SNAPSHOT in routes and callable(StoreService.snapshot)
    assert Route.WATCH in routes and callable(StoreService.watch) and callable(StoreService.watch_shared)


def test_authorize_has_a_rule_for_every_request_checked_by_its_body() -> None:
    by_body = {r for r, q in REQUESTS.items() if q.perm in methods.BODY_PERMS}
    assert set(authorize.RULES) == by_body
