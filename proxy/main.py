"""The authproxy program: ``main(argv)`` parses the config, serves until SIGTERM/SIGINT, stops gracefully."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

from proxy.audit.writer import STDOUT
from proxy.config import ConfigError, ProxyConfig, load
from proxy.server import ProxyServer
from raftgate import event_loop, stages
from raftgate.process import on_sighup as reopen_on_sighup
from raftgate.stop_signals import stop_on_signals

log = logging.getLogger("proxy")

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_FAILURE = 1


def main(argv: list[str]) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load(argv)
        stages.configure(os.environ, program="proxy")
        loop_name = event_loop.chosen(os.environ)
    except (ConfigError, ValueError) as e:
        print(f"raftgate proxy: error: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    except SystemExit as e:  # --help
        return int(e.code or 0)
    try:
        if config.workers > 1:
            from proxy.workers import supervise

            return event_loop.run(supervise(config, argv), loop_name)
        return event_loop.run(serve(config), loop_name)
    except OSError as e:
        print(f"raftgate proxy: error: {e}", file=sys.stderr, flush=True)
        return EXIT_FAILURE


async def serve(config: ProxyConfig, *, reuse_port: bool = False, name: str = "raftgate proxy") -> int:
    """Serves until SIGTERM/SIGINT. ``reuse_port`` and ``name``: a worker of ``--workers N``
    (proxy/workers.py runs each worker through this, as ``main`` runs a single proxy)."""
    stages.configure(os.environ, program="proxy")  # a worker process starts here, not in main
    server = ProxyServer(config, reuse_port=reuse_port)
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        stop_on_signals(stop)
    try:
        addresses = await server.start()
    except Exception:
        await server.stop(0)
        raise
    if server.audit is not None and server.audit.path != STDOUT:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            reopen_on_sighup(server.audit.reopen)
    print(f"{name}: serving the etcd v3 API on {', '.join(addresses)}", flush=True)
    if server.gateway is not None:
        print(f"raftgate proxy: serving the JSON gateway on {', '.join(server.gateway.addresses)}", flush=True)
    await stop.wait()
    log.info("stopping")
    await server.stop(5.0)
    return EXIT_OK
