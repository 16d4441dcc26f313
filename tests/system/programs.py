"""`raftgate store` and `raftgate proxy` as separate processes on free 127.0.0.1 ports, with any flags.

`raftgate local` passes only some flags on; the metrics and sidecar identity tests need the
programs' own flags (--metrics-addr, --health-addr, --identity-file, ...), so they start the two
programs themselves. Every process runs in its own process group and is always torn down.
"""

from __future__ import annotations

import contextlib
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness import REPO_ROOT, _Server, etcdctl, free_port, wait_for
from prometheus_client.parser import text_string_to_metric_families

SECRET = "s3cret-for-tests-only-0123456789"


class Program(_Server):
    """One raftgate program, ready once it prints its ready line."""

    def __init__(self, workdir: Path, args: list[str], ready_prefix: str) -> None:
        super().__init__(workdir)
        self.name = args[0]
        self.args = args
        self.ready_prefix = ready_prefix

    def command(self) -> list[str]:
        return [sys.executable, "-m", "raftgate.cli", *self.args]

    def is_ready(self) -> bool:
        return any(line.startswith(self.ready_prefix) and (" ready on " in line or " serving " in line)
                   for line in self.lines)


def secret_file(directory: Path) -> Path:
    path = directory / "internal-secret"
    if not path.exists():
        path.write_text(SECRET)
    return path


def store_program(workdir: Path, *extra: str) -> tuple[Program, str]:
    """A one-node store cluster; returns it (not started) and its internal host:port."""
    secret = secret_file(workdir)
    port, peer = free_port(), free_port()
    args = ["store", "--name", "s1", "--data-dir", str(workdir / "store-data"),
            "--listen-internal-urls", f"http://127.0.0.1:{port}", "--internal-secret-file", str(secret),
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--peer-secret-file", str(secret), *extra]
    return Program(workdir / "store", args, "raftgate store:"), f"127.0.0.1:{port}"


def proxy_program(workdir: Path, store: str, listen: str, *extra: str, name: str = "proxy") -> Program:
    args = ["proxy", "--listen-client-urls", listen, "--store-endpoints", store,
            "--internal-secret-file", str(secret_file(workdir)), "--bcrypt-cost", "4", *extra]
    return Program(workdir / name, args, "raftgate proxy:")


def store_supports(flag: str) -> bool:
    """Whether this build's store takes ``flag`` (its flags are wired in authstore/config.py)."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "raftgate.cli", "store", "--help"], capture_output=True, text=True,
                         timeout=60, cwd=REPO_ROOT).stdout
    return flag in out


def wait_serving(endpoint: str, timeout: float = 60.0) -> None:
    """Until the proxy answers AuthStatus through the store (the store has elected itself leader)."""
    def ok() -> bool:
        rc, out, _ = etcdctl(endpoint, "auth", "status", timeout=10, dial_timeout="1s")
        return rc == 0 and out.startswith("Authentication Status:")

    wait_for(ok, timeout, f"{endpoint} to serve through the store")


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


def health_status(address: str, service: str = "") -> int | None:
    """The grpc.health.v1 status at ``address`` (plaintext), or None if it does not answer."""
    with grpc.insecure_channel(address) as channel, contextlib.suppress(grpc.RpcError):
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
    return None


@contextlib.contextmanager
def store_and_proxy(workdir: Path) -> Iterator[str]:
    """A one-node store and a proxy in front of it, serving; yields the proxy's host:port."""
    store, internal = store_program(workdir)
    started: list[Program] = [store]
    store.start()
    try:
        port = free_port()
        proxy = proxy_program(workdir, internal, f"http://127.0.0.1:{port}")
        proxy.start()
        started.append(proxy)
        wait_serving(f"http://127.0.0.1:{port}")
        yield f"127.0.0.1:{port}"
    finally:
        for program in reversed(started):
            program.stop()
