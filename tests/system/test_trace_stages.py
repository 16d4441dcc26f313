"""Stage tracing (RAFTGATE_TRACE_STAGES, raftgate/stages.py): with it on, a Put through a proxy and a
one-node store shows every stage's histogram on both programs' /metrics, the stages in order;
with it off, neither program has any of those series. Functional only: no timing is asserted
beyond the order that the stamps' definition implies."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from raftgate import stages
from tests.support.probes import Samples, scrape
from tests.support.processes import (
    Program,
    free_port,
    proxy_program,
    secret_file,
    stop_together,
    store_program,
    wait_for,
    wait_serving,
)

PROXY_FAMILY = "raftgate_proxy_request_stage_seconds"
STORE_FAMILY = "raftgate_store_request_stage_seconds"


def _stage_stats(samples: Samples, family: str) -> dict[str, tuple[float, float]]:
    """stage -> (count, sum) of ``family``'s histogram."""
    out: dict[str, tuple[float, float]] = {}
    for (name, labels), value in samples.items():
        if name == f"{family}_count":
            stage = dict(labels)["stage"]
            out[stage] = (value, samples[(f"{family}_sum", labels)])
    return out


def _any_series(samples: Samples, family: str) -> bool:
    return any(name.startswith(family) for name, _ in samples)


@pytest.fixture
def deployment(request: pytest.FixtureRequest, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str, str]]:
    """A one-node store and a proxy, both with /metrics and RAFTGATE_TRACE_STAGES=<param> (or
    "<store's>/<proxy's>"); yields
    (the proxy's host:port, the proxy's metrics address, the store's metrics address)."""
    store_setting, _, proxy_setting = request.param.partition("/")  # "N" for both, or "store/proxy"
    monkeypatch.setenv(stages.ENV, store_setting)  # inherited by the program started next
    store_metrics, proxy_metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    store, internal = store_program(tmp_path, "--metrics-addr", store_metrics)
    started: list[Program] = [store]
    try:
        store.start()
        monkeypatch.setenv(stages.ENV, proxy_setting or store_setting)
        port = free_port()
        proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}", "--metrics-addr", proxy_metrics)
        started.append(proxy)
        proxy.start()
        wait_serving(f"127.0.0.1:{port}")
        yield f"127.0.0.1:{port}", proxy_metrics, store_metrics
    finally:
        stop_together(started)


def _put(target: str, n: int = 3) -> None:
    with grpc.insecure_channel(target) as channel:
        kv = rpc_pb2_grpc.KVStub(channel)
        for i in range(n):
            kv.Put(rpc_pb2.PutRequest(key=f"/trace/{i}".encode(), value=b"v"), timeout=10)


def _delta(after: dict[str, tuple[float, float]], before: dict[str, tuple[float, float]]
           ) -> dict[str, tuple[float, float]]:
    return {s: (c - before.get(s, (0, 0))[0], t - before.get(s, (0, 0))[1]) for s, (c, t) in after.items()}


@pytest.mark.parametrize("deployment", ["1"], indirect=True)
def test_a_traced_put_shows_every_stage_in_order(deployment: tuple[str, str, str]) -> None:
    target, proxy_metrics, store_metrics = deployment
    # what the set-up's requests left (wait_serving's AuthStatus calls are sampled too)
    proxy_before = _stage_stats(scrape(proxy_metrics), PROXY_FAMILY)
    store_before = _stage_stats(scrape(store_metrics), STORE_FAMILY)
    puts = 3
    _put(target, puts)

    def settled(address: str, family: str, before: dict[str, tuple[float, float]],
                order: tuple[str, ...]) -> dict[str, tuple[float, float]] | None:
        got = _delta(_stage_stats(scrape(address), family), before)
        return got if all(got.get(s, (0, 0))[0] == puts for s in order) else None

    proxy = wait_for(lambda: settled(proxy_metrics, PROXY_FAMILY, proxy_before, stages.PROXY_STAGES), 30,
                     "every proxy stage histogram to count each Put")
    store = wait_for(lambda: settled(store_metrics, STORE_FAMILY, store_before, stages.STORE_STAGES), 30,
                     "every store stage histogram to count each Put")
    # Each Put passed every stage once, so each sum (the time from the start to that stage, over
    # the Puts) is at least the previous stage's.
    for stats, order in ((proxy, stages.PROXY_STAGES), (store, stages.STORE_STAGES)):
        assert isinstance(stats, dict)
        sums = [stats[s][1] for s in order]
        assert sums == sorted(sums), (order, stats)


@pytest.mark.parametrize("deployment", ["0"], indirect=True)
def test_with_tracing_off_no_stage_series_exist(deployment: tuple[str, str, str]) -> None:
    target, proxy_metrics, store_metrics = deployment
    _put(target)
    assert not _any_series(scrape(proxy_metrics), PROXY_FAMILY)
    assert not _any_series(scrape(store_metrics), STORE_FAMILY)


@pytest.mark.parametrize("deployment", ["0/1"], indirect=True)
def test_a_store_with_tracing_off_ignores_the_mark(deployment: tuple[str, str, str]) -> None:
    """The proxy traces and marks its calls; the store, its tracing off, answers them as any other
    (no stage offsets): the proxy shows only its own stages, the store no series at all."""
    target, proxy_metrics, store_metrics = deployment
    _put(target)
    proxy = _stage_stats(scrape(proxy_metrics), PROXY_FAMILY)
    assert proxy["proxy_sent"][0] >= 1 and proxy["proxy_out"][0] >= 1, proxy
    assert not set(proxy) & set(stages.STORE_STAGES), proxy
    assert not _any_series(scrape(store_metrics), STORE_FAMILY)


@pytest.mark.parametrize("program", [["store", "--name", "s1"], ["proxy", "--store-endpoints", "127.0.0.1:1"]])
@pytest.mark.parametrize("value", ["yes", "-1", "1e3"])
def test_a_bad_setting_stops_the_program_at_start(program: list[str], value: str, tmp_path: Path) -> None:
    """RAFTGATE_TRACE_STAGES must be a whole number of requests: anything else is a configuration
    error naming the variable (exit code 2), never a silent default."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
    env[stages.ENV] = value
    args = [*program, "--internal-secret-file", str(secret_file(tmp_path))]
    if program[0] == "store":
        args += ["--data-dir", str(tmp_path / "data"), "--peer-secret-file", str(secret_file(tmp_path))]
    proc = subprocess.run([sys.executable, "-m", "raftgate.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=str(tmp_path), start_new_session=True)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert stages.ENV in proc.stderr
