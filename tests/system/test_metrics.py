"""Both programs serve /metrics and gRPC health on their side ports; the auth counters move when an
authentication succeeds or fails and when the store refuses a request (denied, old revision).

JWT tokens keep the old-revision refusal deterministic: the token carries its revision, so any auth
change makes the next request old (simple tokens are re-resolved transparently by the proxy).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.probes import health_status, sample, scrape
from tests.support.processes import (
    Program,
    etcdctl,
    free_port,
    pem_rsa_keypair,
    proxy_program,
    store_program,
    wait_for,
    wait_serving,
)
from tests.support.wclient import WatchStream

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass
class Deployment:
    endpoint: str
    proxy_metrics: str
    proxy_health: str
    store_metrics: str
    store_health: str
    proxy: Program
    store: Program


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    priv, pub = pem_rsa_keypair(tmp_path)
    store_metrics, store_health = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    store, internal = store_program(tmp_path, "--metrics-addr", store_metrics, "--health-addr", store_health)
    port, metrics, health = free_port(), f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}", "--metrics-addr", metrics,
                          "--health-addr", health, "--auth-token",
                          f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256,ttl=10m")
    with store, proxy:
        endpoint = f"127.0.0.1:{port}"
        wait_serving(endpoint)
        yield Deployment(endpoint, metrics, health, store_metrics, store_health, proxy, store)


def ctl(d: Deployment, *args: str, user: str | None = None, stdin: str | None = None) -> str:
    rc, out, err = etcdctl(d.endpoint, *args, user=user, stdin=stdin)
    assert rc == 0, err
    return out


def enable_auth(d: Deployment) -> None:
    ctl(d, "user", "add", "root:rootpw")
    ctl(d, "user", "add", "alice:alicepw")
    ctl(d, "role", "add", "app")
    ctl(d, "role", "grant-permission", "app", "readwrite", "/app/", "--prefix")
    ctl(d, "user", "grant-role", "alice", "app")
    ctl(d, "auth", "enable")


def code_and_message(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code(), err.value.details()


def test_auth_counters_move_on_success_failure_and_refusals(deployment: Deployment) -> None:
    d = deployment
    enable_auth(d)
    before = scrape(d.proxy_metrics)
    store_before = scrape(d.store_metrics)
    with grpc.insecure_channel(d.endpoint) as channel:
        auth, kv = rpc_pb2_grpc.AuthStub(channel), rpc_pb2_grpc.KVStub(channel)
        alice = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="alice", password="alicepw"), timeout=10).token
        root = auth.Authenticate(rpc_pb2.AuthenticateRequest(name="root", password="rootpw"), timeout=10).token
        assert code_and_message(
            lambda: auth.Authenticate(rpc_pb2.AuthenticateRequest(name="alice", password="nope"), timeout=10)
        ) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")
        as_alice = (("token", alice),)
        kv.Put(rpc_pb2.PutRequest(key=b"/app/k", value=b"v"), metadata=as_alice, timeout=10)
        kv.Range(rpc_pb2.RangeRequest(key=b"/app/k"), metadata=as_alice, timeout=10)
        assert code_and_message(
            lambda: kv.Put(rpc_pb2.PutRequest(key=b"/other", value=b"v"), metadata=as_alice, timeout=10)
        ) == (grpc.StatusCode.PERMISSION_DENIED, "etcdserver: permission denied")
        # Any auth change makes alice's JWT old.
        auth.RoleAdd(rpc_pb2.AuthRoleAddRequest(name="unrelated"), metadata=(("token", root),), timeout=10)
        assert code_and_message(
            lambda: kv.Put(rpc_pb2.PutRequest(key=b"/app/k", value=b"w"), metadata=as_alice, timeout=10)
        ) == (grpc.StatusCode.INVALID_ARGUMENT, "etcdserver: revision of auth store is old")
        status = auth.AuthStatus(rpc_pb2.AuthStatusRequest(), timeout=10)
    after = scrape(d.proxy_metrics)

    def moved(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert moved("raftgate_proxy_authentications_total", result="ok") == 2
    assert moved("raftgate_proxy_authentications_total", result="auth_failed") == 1
    assert moved("raftgate_proxy_bcrypt_duration_seconds_count", operation="check") == 3
    assert moved("raftgate_proxy_token_validations_total", kind="jwt", result="valid") >= 2
    assert moved("raftgate_proxy_token_validations_total", kind="jwt", result="cache_hit") >= 2
    assert moved("raftgate_proxy_permission_denials_total", kind="put") == 1
    assert moved("raftgate_proxy_old_revision_refusals_total", kind="put") == 1
    put = {"service": "etcdserverpb.KV", "method": "Put"}
    assert moved("raftgate_proxy_requests_total", code="OK", **put) == 1
    assert moved("raftgate_proxy_requests_total", code="PERMISSION_DENIED", **put) == 1
    assert moved("raftgate_proxy_requests_total", code="INVALID_ARGUMENT", **put) == 1
    assert moved("raftgate_proxy_requests_total", code="INVALID_ARGUMENT", service="etcdserverpb.Auth",
                 method="Authenticate") == 1
    assert sample(after, "raftgate_proxy_bcrypt_queue_depth", operation="check") == 0
    # Secrets and client-chosen values never reach a label.
    text = repr(after)
    for secret in ("alicepw", "rootpw", "nope", alice, root, "/app/k", "/other"):
        assert secret not in text

    store_after = scrape(d.store_metrics)

    def store_moved(name: str, **labels: str) -> float:
        return sample(store_after, name, **labels) - sample(store_before, name, **labels)

    assert store_moved("raftgate_store_permission_denials_total", kind="put", stage="apply") == 1
    assert store_moved("raftgate_store_old_revision_refusals_total", kind="put", stage="apply") == 1
    assert sample(store_after, "raftgate_store_auth_revision") == status.authRevision
    assert store_moved("raftgate_store_apply_duration_seconds_count") >= 3


def test_open_watches_gauge_follows_the_watches_open_on_the_store(deployment: Deployment) -> None:
    """raftgate_store_open_watches is what an operator reads to see watch load on a node: it must
    rise with every watch a client opens through the proxy and fall with every cancel and close."""
    d = deployment
    address = d.store_metrics
    base = sample(scrape(address), "raftgate_store_open_watches")
    seen = [base]

    def gauge_is(n: float) -> None:
        def reached() -> bool:
            seen[0] = sample(scrape(address), "raftgate_store_open_watches")
            return seen[0] == base + n

        try:
            wait_for(reached, 30, f"raftgate_store_open_watches to be {base + n}")
        except TimeoutError as exc:
            raise AssertionError(f"raftgate_store_open_watches is {seen[0]}, expected {base + n}") from exc

    async def scenario() -> None:
        async with grpc.aio.insecure_channel(d.endpoint) as channel:
            first, second = WatchStream(channel), WatchStream(channel)
            ids = []
            for stream, key in ((first, b"/w/a"), (first, b"/w/b"), (second, b"/w/c")):
                created = await stream.create(key)
                assert created.created and not created.canceled, created
                ids.append(created.watch_id)
            await asyncio.to_thread(gauge_is, 3)
            await first.send(cancel_request=rpc_pb2.WatchCancelRequest(watch_id=ids[0]))
            canceled = await first.recv()
            assert canceled.canceled and canceled.watch_id == ids[0], canceled
            await asyncio.to_thread(gauge_is, 2)
            first.close()
            second.close()
            await asyncio.to_thread(gauge_is, 0)

    asyncio.run(scenario())


def test_health_on_the_side_ports(deployment: Deployment) -> None:
    d = deployment
    assert health_status(d.proxy_health) == SERVING
    assert health_status(d.proxy_health, "etcdserverpb.KV") == SERVING
    assert health_status(d.endpoint) == SERVING  # and on the client port, as before
    if d.store_health is not None:
        assert health_status(d.store_health) == SERVING
    d.proxy.stop()
    wait_for(lambda: health_status(d.proxy_health) is None, 30, "the proxy's health port to close")


def test_metrics_and_health_are_off_unless_asked(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path)
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}")
    with store, proxy:
        wait_serving(f"127.0.0.1:{port}")
        assert "metrics" not in proxy.output() and "grpc.health.v1 (plaintext)" not in proxy.output()
