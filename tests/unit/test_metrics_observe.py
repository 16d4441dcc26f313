"""The side servers (raftgate/observe.py) and their flags on both programs."""

from __future__ import annotations

import argparse
import asyncio
import urllib.request
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from proxy.config import ConfigError, load
from raftgate.observe import (
    ListenAddr,
    ObserveConfig,
    add_observe_flags,
    observe_config,
    parse_listen_addr,
    start_observability,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("127.0.0.1:9090", ListenAddr("127.0.0.1", 9090)),
        ("0.0.0.0:0", ListenAddr("0.0.0.0", 0)),
        ("[::1]:9090", ListenAddr("::1", 9090)),
        ("metrics.local:80", ListenAddr("metrics.local", 80)),
        ("", None),
        (None, None),
    ],
)
def test_parse_listen_addr(text: str | None, want: ListenAddr | None) -> None:
    assert parse_listen_addr("--metrics-addr", text) == want


@pytest.mark.parametrize("text", ["9090", "127.0.0.1", ":9090", "[zz]:1", "::1:9090", "h:70000", "http://h:1"])
def test_parse_listen_addr_refuses_with_the_flag_name(text: str) -> None:
    with pytest.raises(ValueError, match="--health-addr"):
        parse_listen_addr("--health-addr", text)


def test_observe_flags_helper_for_the_store_parser() -> None:
    p = argparse.ArgumentParser()
    add_observe_flags(p)
    cfg = observe_config(p.parse_args(["--metrics-addr", "127.0.0.1:1", "--health-addr", "[::1]:2"]))
    assert cfg == ObserveConfig(ListenAddr("127.0.0.1", 1), ListenAddr("::1", 2))
    assert observe_config(p.parse_args([])) == ObserveConfig()

    class StoreConfigError(Exception):
        pass

    with pytest.raises(StoreConfigError, match="must differ"):
        observe_config(p.parse_args(["--metrics-addr", "h:1", "--health-addr", "h:1"]), StoreConfigError)


def _scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        assert resp.status == 200
        return resp.read().decode()


def test_side_servers_serve_metrics_and_health_then_report_shutdown() -> None:
    async def go() -> None:
        servicer = health.aio.HealthServicer()
        obs = await start_observability(
            ObserveConfig(ListenAddr("127.0.0.1", 0), ListenAddr("127.0.0.1", 0)), servicer
        )
        try:
            assert obs.metrics_address and obs.health_address
            assert not obs.metrics_address.endswith(":0") and not obs.health_address.endswith(":0")
            loop = asyncio.get_running_loop()
            text = await loop.run_in_executor(None, _scrape, obs.metrics_address)  # not on the event loop
            assert "raftgate_" in text or "python_info" in text
            async with grpc.aio.insecure_channel(obs.health_address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
                await obs.begin_shutdown()
                answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        finally:
            await obs.close(0)
        with pytest.raises(OSError):
            await loop.run_in_executor(None, _scrape, obs.metrics_address)

    asyncio.run(go())


def test_nothing_is_served_unless_asked() -> None:
    async def go() -> None:
        obs = await start_observability(ObserveConfig())
        assert obs.metrics_address is None and obs.health_address is None
        await obs.close()

    asyncio.run(go())


def test_a_taken_address_is_a_clear_error() -> None:
    async def go() -> None:
        first = await start_observability(ObserveConfig(metrics_addr=ListenAddr("127.0.0.1", 0)))
        try:
            assert first.metrics_address is not None
            port = int(first.metrics_address.rsplit(":", 1)[1])
            with pytest.raises(OSError, match="--metrics-addr"):
                await start_observability(ObserveConfig(metrics_addr=ListenAddr("127.0.0.1", port)))
        finally:
            await first.close()

    asyncio.run(go())


# --- proxy flags ------------------------------------------------------------------------------------


@pytest.fixture
def base(tmp_path: Path) -> list[str]:
    secret = tmp_path / "secret"
    secret.write_text("dev-secret\n")
    return ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}"]


def test_proxy_observe_flags_and_env(base: list[str]) -> None:
    assert load(base, env={}).observe == ObserveConfig()
    cfg = load([*base, "--metrics-addr=0.0.0.0:9090"], env={"RAFTGATE_PROXY_HEALTH_ADDR": "127.0.0.1:9091"})
    assert cfg.observe == ObserveConfig(ListenAddr("0.0.0.0", 9090), ListenAddr("127.0.0.1", 9091))
    with pytest.raises(ConfigError, match="--metrics-addr"):
        load([*base, "--metrics-addr=9090"], env={})
