"""Probes of a running program's side ports: its /metrics as numbers, its gRPC health status."""

from __future__ import annotations

import contextlib
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> Samples:
    """/metrics as {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(metrics: Samples, name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for_sample(address: str, name: str, value: float, timeout: float, what: str, **labels: str) -> None:
    """Waits until the sample ``name`` scraped from ``address`` is ``value``; the TimeoutError names
    the last value seen (a gauge stuck above or below says which way something leaked)."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while (seen := sample(scrape(address), name, **labels)) != value:
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}: {name} is {seen:g}, not {value:g}")
        time.sleep(delay)  # polling interval of a condition wait, not a fixed sleep
        delay = min(delay * 1.5, 0.25)


def health_status(address: str, service: str = "") -> int | None:
    """The grpc.health.v1 status at ``address`` (plaintext), or None if it does not answer."""
    with grpc.insecure_channel(address) as channel, contextlib.suppress(grpc.RpcError):
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
    return None
