"""The programs' gRPC socket I/O runs on gRPC's poller thread (raftgate/grpc_io.py): the setting
merges with an operator's, this grpcio knows it, and with it the event_engine threads idle."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest

from raftgate import grpc_io
from raftgate.cli import main as cli_main

OURS = "-event_engine_client,-event_engine_listener"

#: An operator's GRPC_EXPERIMENTS -> what the programs run with (every rule of ``merged``).
CASES = [
    ("", OURS),
    ("  ", OURS),
    ("tcp_rcv_lowat", f"tcp_rcv_lowat,{OURS}"),
    ("-tcp_rcv_lowat, ", f"-tcp_rcv_lowat,{OURS}"),
    # an experiment the operator names stays as named, enabled or disabled
    ("event_engine_client", "event_engine_client,-event_engine_listener"),
    ("-event_engine_listener", "-event_engine_listener,-event_engine_client"),
    ("event_engine_client,event_engine_listener", "event_engine_client,event_engine_listener"),
]


@pytest.mark.parametrize(("operator", "expected"), CASES)
def test_merged_keeps_what_the_operator_named(operator: str, expected: str) -> None:
    assert grpc_io.merged(operator) == expected


def test_every_experiment_of_the_table_has_a_case() -> None:
    """A new entry in EXPERIMENTS needs a case here that names it (kept) and one that does not."""
    for name in grpc_io.EXPERIMENTS:
        assert any(name in operator for operator, _ in CASES), name
    assert grpc_io.merged("") == ",".join(
        name if on else f"-{name}" for name, on in grpc_io.EXPERIMENTS.items())


@pytest.mark.parametrize("command", ["store", "proxy", "local"])
def test_the_programs_set_it_before_they_start(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(grpc_io.ENV, "")  # recorded as it was, so the program's setting is undone
    monkeypatch.delenv(grpc_io.ENV)
    with contextlib.suppress(SystemExit):  # --help: the program's parser answers
        cli_main([command, "--help"])
    assert os.environ[grpc_io.ENV] == OURS


def test_other_commands_leave_grpc_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's floor and clients, and the tools, run on gRPC's defaults."""
    monkeypatch.setenv(grpc_io.ENV, "")  # recorded as it was, so the program's setting is undone
    monkeypatch.delenv(grpc_io.ENV)
    with contextlib.suppress(SystemExit):
        cli_main(["snapshot", "--help"])
    assert grpc_io.ENV not in os.environ


_PROBE = textwrap.dedent('''
    import asyncio, os, grpc

    def switches():
        n = 0
        for t in os.listdir("/proc/self/task"):
            try:
                if open(f"/proc/self/task/{t}/comm").read().strip() != "event_engine":
                    continue
                for line in open(f"/proc/self/task/{t}/status"):
                    if "ctxt_switches" in line:
                        n += int(line.split(":")[1])
            except OSError:
                pass
        return n

    async def echo(request, context):
        return request

    async def main():
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        port = server.add_insecure_port("127.0.0.1:0")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "probe", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})])
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/probe/Echo")
            await call(b"warm")
            before = switches()
            for _ in range(CALLS):
                await call(b"hello")
            print("SWITCHES", switches() - before)
        await server.stop(None)

    asyncio.run(main())
''')

CALLS = 300


def _probe(experiments: str | None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != grpc_io.ENV}
    if experiments is not None:
        env[grpc_io.ENV] = experiments
    out = subprocess.run([sys.executable, "-c", f"CALLS = {CALLS}\n{_PROBE}"], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("SWITCHES"))
    return int(line.split()[1]), out.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads threads from Linux's /proc")
def test_this_grpc_knows_the_setting_and_its_event_engine_threads_idle() -> None:
    """Fails when a grpcio upgrade drops the experiments (it would log "Unknown experiment" at every
    start) or when they stop moving the I/O: the pool's threads switch ~7 times per call without."""
    switches, stderr = _probe(grpc_io.merged(""))
    assert "Unknown experiment" not in stderr, stderr
    assert switches < CALLS / 4, f"{switches} context switches of event_engine threads in {CALLS} calls"
    default, _ = _probe(None)
    assert default > CALLS, f"gRPC's default I/O: {default} switches in {CALLS} calls (expected more than one per call)"
