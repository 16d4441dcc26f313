"""``raftgate proxy --workers N``: N proxy processes serving one client port, supervised by this one.

Why: a gRPC-Python server spends most of a request in gRPC's per-call machinery, on one core per
process (the GIL). N workers, each a whole proxy with its own store stream, spread that cost over
N cores; the kernel spreads the connections (SO_REUSEPORT, on purpose here only: everywhere else a
port in use is an error, so this supervisor checks the port is free before any worker binds it).

The supervisor serves nothing itself but ``--metrics-addr`` (the workers' counters and histograms
summed, gauges per worker with a ``pid`` label: prometheus_client's multiprocess mode, the workers
write to a directory this process reads and removes at the end) and
``--health-addr`` (SERVING once every worker serves). It prints its ready line once every worker
serves. A worker that dies brings the whole proxy down with exit code 1 (the others stopped
cleanly): a proxy with fewer workers than asked for is not what was configured, and the one that
restarts the proxy (Kubernetes, ``raftgate local``'s operator) sees it; a supervisor that dies,
even by SIGKILL, takes its workers with it (Linux's parent-death signal). A worker that ends with
code 0 was stopped by a signal (Ctrl-C reaches the whole process group): all stop, exit 0.
SIGTERM or SIGINT stops every worker gracefully; the exit code is 0 when each stopped cleanly.
With an audit log file, SIGHUP (logrotate) is passed on to the workers, which reopen it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer
from prometheus_client import REGISTRY
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import CollectorRegistry

from proxy.config import ConfigError, ProxyConfig, load
from raftgate import event_loop, grpc_listen
from raftgate.methods import ETCD_PACKAGE, SERVICES
from raftgate.observe import ObserveConfig, start_observability
from raftgate.process import STOPPED_BY_SIGNAL, Child, check_listenable, on_sighup, pass_on
from raftgate.stop_signals import stop_on_signals

log = logging.getLogger("proxy.workers")

#: What a worker prints once it serves (the supervisor reads it; ``raftgate local`` waits for the
#: supervisor's own ``raftgate proxy:`` line, printed after every worker's).
WORKER_READY = "raftgate proxy worker"
#: prometheus_client's multiprocess mode: set in a worker's environment before it imports the library.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The supervisor's pid, in each worker's environment (a worker stops when it is gone).
SUPERVISOR_ENV = "RAFTGATE_PROXY_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


def stop_with_supervisor() -> None:
    """A worker's SIGTERM (its graceful stop) when its supervisor dies, even by SIGKILL: orphans
    would keep the client port (a restarted proxy finds it in use) and serve unsupervised. Linux's
    parent-death signal; elsewhere nothing. Called before the worker serves."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    if supervisor.isdigit() and os.getppid() != int(supervisor):
        os.kill(os.getpid(), signal.SIGTERM)  # it died before the signal was asked for


def check_ports_free(config: ProxyConfig) -> None:
    """Each client port is free now (nobody, sharing or not, holds it): the workers then share it
    with each other only. Raises OSError in the words of a single proxy's failed bind."""
    for address in config.listen:
        host, port = address.rsplit(":", 1)
        try:
            check_listenable(host.strip("[]"), int(port))
            if grpc_listen.in_use(address):  # on another address its name resolves to, as gRPC binds
                raise OSError
        except OSError:
            raise OSError(f"cannot listen on {address}: the port is in use or the address is not available here"
                          ) from None


class Worker(Child):
    """One worker (``python -m proxy.worker INDEX`` with the supervisor's flags); its ready line is
    the supervisor's to read, not passed on."""

    def __init__(self, index: int, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(f"worker {index}", ["-m", "proxy.worker", str(index), *argv], ready_prefix=WORKER_READY,
                         echo_ready=False, env=env, log_kill=True)
        self.index = index


async def supervise(config: ProxyConfig, argv: list[str]) -> int:
    """Runs ``config.workers`` workers (each ``argv``, the supervisor's own flags) until a stop signal
    or a worker's exit; returns the exit code. Raises OSError if a port cannot be had."""
    stop = asyncio.Event()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        stop_on_signals(stop)
    check_ports_free(config)
    env = dict(os.environ)
    env[SUPERVISOR_ENV] = str(os.getpid())
    metrics_dir: str | None = None
    registry = REGISTRY
    if config.observe.metrics_addr is not None:
        metrics_dir = tempfile.mkdtemp(prefix="raftgate-proxy-metrics-")
        env[MULTIPROC_ENV] = metrics_dir
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=metrics_dir)
    health = HealthServicer()
    observability = None
    workers = [Worker(i + 1, argv, env) for i in range(config.workers)]
    if config.audit_log is not None and config.audit_log != "-":
        with contextlib.suppress(NotImplementedError, RuntimeError):
            on_sighup(lambda: pass_on(signal.SIGHUP, workers))
    code = 0
    starting = True
    try:
        observability = await start_observability(config.observe, health, registry=registry)
        starts = asyncio.gather(*(w.start() for w in workers))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([starts, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            starts.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await starts
            log.info("stopped while starting")
            return 0
        await starts  # raises RuntimeError if a worker could not start
        starting = False
        for name in ["", *(f"{ETCD_PACKAGE}.{s}" for s in SERVICES)]:
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        pids = ", ".join(str(w.proc.pid) for w in workers if w.proc)
        print(f"raftgate proxy: serving the etcd v3 API on {', '.join(config.listen)} "
              f"({config.workers} worker processes: pids {pids})", flush=True)  # fmt: skip
        exits = {asyncio.ensure_future(w.proc.wait()): w for w in workers if w.proc}
        done, _ = await asyncio.wait([stopped, *exits], return_when=asyncio.FIRST_COMPLETED)
        if stopped not in done:
            first = next(exits[f] for f in done if f in exits)
            rc = first.proc.returncode if first.proc else None
            if rc == 0:  # stopped by a signal sent to it (Ctrl-C reaches the whole group)
                log.info("%s stopped; stopping the others", first.name)
            else:
                log.error("%s (pid %s) exited with code %s; stopping the others", first.name,
                          first.proc.pid if first.proc else "?", rc)  # fmt: skip
                code = 1
        stopped.cancel()
        log.info("stopping")
    except RuntimeError as exc:
        if not stop.is_set():
            log.error("%s", exc)
            code = 1
    finally:
        await health.enter_graceful_shutdown()
        await asyncio.gather(*(w.stop() for w in workers))
        # a worker the stop reached before its own signal handler was set ends by the signal itself
        for w in workers:
            if w.proc is None or w.proc.returncode is None:
                continue
            if metrics_dir is not None:
                mark_process_dead(w.proc.pid, metrics_dir)
            if w.proc.returncode != 0 and not (starting and w.proc.returncode in STOPPED_BY_SIGNAL) and code == 0:
                log.error("%s exited with code %s", w.name, w.proc.returncode)
                code = 1
        if observability is not None:
            await observability.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return code


def worker_main(argv: list[str]) -> int:
    """A worker: the proxy's own flags, its client port shared with its siblings, no side servers
    (the supervisor serves them)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    index, rest = argv[0], argv[1:]
    from proxy.main import serve

    try:
        config = dataclasses.replace(load(rest), workers=1, observe=ObserveConfig())
        loop_name = event_loop.chosen(os.environ)
    except (ConfigError, ValueError) as e:
        print(f"{WORKER_READY} {index}: error: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        return event_loop.run(serve(config, reuse_port=True, name=f"{WORKER_READY} {index} (pid {os.getpid()})"),
                              loop_name)
    except OSError as e:
        print(f"{WORKER_READY} {index}: error: {e}", file=sys.stderr, flush=True)
        return 1
