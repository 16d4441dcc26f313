"""The store's internal port serves nothing but health to callers without credentials (Trust item 17).

Reflection there would hand anyone the internal service's whole contract; probes need only health.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from raftgate.secret_proof import proving_channel
from tests.support.processes import SECRET, Program, free_port
from tests.support.store_args import _store_args


@pytest.fixture
def store(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    program = Program(tmp_path / "s", _store_args(tmp_path, internal=port, peer=free_port()), "raftgate store:")
    program.start(timeout=60)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        program.stop()


def _services(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] | None) -> list[str]:
    call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=10)
    return [s.name for answer in call for s in answer.list_services_response.service]


def test_reflection_needs_credentials_and_health_does_not(store: str) -> None:
    with grpc.insecure_channel(store) as channel:
        for caller, metadata in ((channel, None), (channel, (("x-raftgate-internal-secret", SECRET),)),
                                 (proving_channel(channel, "wrong-secret-0123456789"), None)):
            with pytest.raises(grpc.RpcError) as err:
                _services(caller, metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "raftgate.storepb.Store" in _services(proving_channel(channel, SECRET), None)
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
