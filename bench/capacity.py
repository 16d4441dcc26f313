"""``python -m bench.capacity``: CPU per request of the store (leader, followers) and of the proxies,
from /proc, as the number of proxies in front of one store grows; and proxy workers A/B.

One ``raftgate local --nodes K`` provides the store; beside it this starts, for each *setup*, its own
``raftgate proxy`` processes on their own ports against that store (``--proxies 1,2,4``: setups of
1, 2 and 4 proxies; ``--workers 1,2``: setups of one proxy with 1 and 2 worker processes). Every
setup is running for the whole run; the rounds alternate between them (A B C A B C …) with the same
total load (``--conc`` clients, spread over the setup's proxies), and per window it reads the CPU
time of each store node and of the setup's proxies (workers included) from /proc. Reported per
setup, as medians over the rounds: requests/s, and µs of CPU per request for the store leader, the
followers (mean per follower) and the proxies (summed). Each round starts with an idle window of
the same length: what every process burns without load (Raft ticks, heartbeats, timers) is
subtracted, so the figures are the marginal CPU of a request, not the idle cost spread over
however few requests a loaded machine manages. This backs docs/capacity.md. ``--ops watch`` opens
``--conc`` watches on one prefix (spread over the load processes and the setup's proxies) while
four writers put under it: events delivered per second and CPU per event (the Puts included).

    python -m bench.capacity --nodes 3 --proxies 1,2,4 --ops put,range --conc 32
    python -m bench.capacity --nodes 1 --workers 1,2 --ops put,range --conc 16,64
    python -m bench.capacity --nodes 1 --proxies 1 --ops watch --conc 100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.admin import BENCH, PREFIX, Admin
from bench.load import run_job, split, watch_jobs
from bench.targets import VENV_BIN, RaftgateTarget, free_port, spawn, stop_all, wait_ready
from raftgate.process import stop_group

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads), in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (a proxy's workers)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


@dataclass
class Setup:
    name: str
    proxies: int
    workers: int
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def pids(self) -> list[int]:
        """Every process of the setup's proxies (a supervisor and its workers)."""
        out = []
        for p in self.procs:
            out += [p.pid, *children(p.pid)]
        return out


def start_proxies(setup: Setup, t: RaftgateTarget, workdir: Path, endpoints: str) -> None:
    exe = VENV_BIN / "raftgate"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "raftgate.cli"]
    secret = t.data_dir / "internal-secret"
    for i in range(setup.proxies):
        port = free_port()
        log = workdir / f"{setup.name}-{i}.log"
        cmd = base + ["proxy", "--listen-client-urls", f"http://127.0.0.1:{port}", "--store-endpoints", endpoints,
                      "--internal-secret-file", str(secret), "--bcrypt-cost", "4"]  # fmt: skip
        if setup.workers > 1:
            cmd += ["--workers", str(setup.workers)]
        proc = spawn(cmd, log)
        setup.procs.append(proc)
        setup.ports.append(port)
        wait_ready(lambda log=log: log.exists() and "raftgate proxy: serving" in log.read_text(errors="replace"), 90.0,
              f"proxy {setup.name}-{i}", [proc], log)  # fmt: skip


def idle_rates(pids: list[int], seconds: float) -> dict[int, float]:
    """CPU seconds per second each process burns with no load, over one window."""
    before = {pid: cpu_seconds(pid) for pid in pids}
    t0 = time.perf_counter()
    time.sleep(seconds)  # the measurement window itself, not a wait for a condition
    wall = time.perf_counter() - t0
    return {pid: max(0.0, cpu_seconds(pid) - before[pid]) / wall for pid in pids}


def measure(pool: Any, setup: Setup, job: dict[str, Any], conc: int, procs: int,
            stores: dict[str, int], idle: dict[int, float], manager: Any = None) -> dict[str, Any]:  # fmt: skip
    """One window of load; CPU per request (per event delivered, for watch) of each store node and
    of the setup's proxies."""
    n = max(1, min(procs, conc))
    shares = split(conc, n)
    watch = job["op"] == "watch"
    if watch:  # the shares are watchers; every process has its streams before the writer starts
        jobs = watch_jobs({**job, "key": f"{PREFIX}w{time.monotonic_ns()}/"}, shares, manager.Barrier(n))
    else:
        jobs = [{**job, "conc": c, "index": i} for i, c in enumerate(shares)]
    jobs = [{**j, "target": f"127.0.0.1:{setup.ports[j['index'] % len(setup.ports)]}"} for j in jobs]
    proxy_pids = setup.pids()
    before = {pid: cpu_seconds(pid) for pid in [*stores.values(), *proxy_pids]}
    t0 = time.perf_counter()
    out = pool.map(run_job, jobs)
    wall = time.perf_counter() - t0
    after = {pid: cpu_seconds(pid) - idle.get(pid, 0.0) * wall for pid in before}
    count = sum(o["count"] for o in out)
    if watch:  # events delivered; every watcher counts until the same stop key
        elapsed = max(o["elapsed"] for o in out)
        rate, sent = (count / elapsed if elapsed > 0 else 0.0), max(1, count)
    else:
        rate = sum(o["count"] / o["elapsed"] for o in out if o["elapsed"] > 0)
        # The CPU deltas span the whole map (warm-up included): per request over every request
        # sent, warm-up requests (one per client) counted too.
        sent = count + sum(shares)
    per = {role: (after[pid] - before[pid]) / sent * 1e6 for role, pid in stores.items()}
    proxies = sum(after[p] - before[p] for p in proxy_pids) / sent * 1e6
    return {"rate": rate, "count": count, "errors": sum(o["errors"] for o in out), "wall": wall,
            "store_us": per, "proxies_us": proxies,
            "error": next((o["error"] for o in out if o.get("error")), None)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1, choices=[1, 3, 5])
    p.add_argument("--proxies", default=None, help="comma list: setups of this many proxies (e.g. 1,2,4)")
    p.add_argument("--workers", default=None, help="comma list: setups of one proxy with this many workers (1,2)")
    p.add_argument("--ops", default="put,range",
                   help="put, range (linearizable), srange (serializable), watch (CPU per event delivered)")
    p.add_argument("--conc", default="32", help="comma list of total concurrent clients (watch: watchers)")
    p.add_argument("--seconds", type=float, default=3.0, help="measurement window")
    p.add_argument("--rounds", type=int, default=3, help="rounds; each setup is measured once per round")
    p.add_argument("--procs", type=int, default=4, help="load generator processes")
    p.add_argument("--auth", default="simple", choices=["off", "simple"])
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)
    if bool(a.proxies) == bool(a.workers):
        print("bench.capacity: give exactly one of --proxies and --workers", file=sys.stderr)
        return 2
    if a.proxies:
        setups = [Setup(f"{n}-proxies", int(n), 1) for n in a.proxies.split(",")]
    else:
        setups = [Setup(f"1-proxy-{w}-workers", 1, int(w)) for w in a.workers.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="raftgate-capacity-"))
    t = RaftgateTarget(workdir / "rg", a.nodes, bcrypt_cost=4, auth_token="simple")
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(a.procs)
    manager = ctx.Manager() if "watch" in a.ops.split(",") else None
    results: list[dict[str, Any]] = []
    idles: list[dict[str, float]] = []
    try:
        t.start()
        admin = Admin(t.grpc_target, [])
        admin.setup([])
        if a.auth != "off":
            admin.enable_auth()
        token = admin.token(*BENCH) if a.auth != "off" else None
        admin.close()
        info = t.local_json()["processes"]
        store_procs = [x for x in info if x["role"] == "store"]
        endpoints = ",".join(f"127.0.0.1:{x['internal_port']}" for x in store_procs)
        for s in setups:
            start_proxies(s, t, workdir, endpoints)
        leader = t.leader_pid()
        stores = {("leader" if x["pid"] == leader else f"follower {x['name']}"): int(x["pid"]) for x in store_procs}
        print(f"bench.capacity: {a.nodes} store node(s) (leader pid {leader}); setups: "
              f"{', '.join(s.name for s in setups)}; load avg {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        for op in a.ops.split(","):
            for conc in (int(c) for c in a.conc.split(",")):
                job = {"op": "range" if op == "srange" else op, "duration": a.seconds, "max_ops": 10_000_000,
                       "token": token, "key": f"{PREFIX}p/" if op == "put" else f"{PREFIX}r",
                       "serializable": op == "srange"}  # fmt: skip
                per_setup: dict[str, list[dict[str, Any]]] = {s.name: [] for s in setups}
                for _ in range(a.rounds):
                    idle = idle_rates([*stores.values(), *(p for s in setups for p in s.pids())], a.seconds)
                    idles.append({role: idle[pid] for role, pid in stores.items()})
                    for s in setups:  # A B C A B C
                        per_setup[s.name].append(measure(pool, s, job, conc, a.procs, stores, idle, manager))
                for s in setups:
                    rs = per_setup[s.name]
                    row = summarize(op, conc, s, rs)
                    results.append(row)
                    print(line(row), flush=True)
    finally:
        pool.terminate()
        pool.join()
        if manager is not None:
            manager.shutdown()
        for s in setups:
            for proc in s.procs:
                stop_group(proc)
        t.stop()
        stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": argv if argv is not None else sys.argv[1:],
                                            "loadavg_end": os.getloadavg(), "idle_cpu": idles,
                                            "rows": results}, indent=1))  # fmt: skip
    if idles:
        print("idle CPU (cores, median over rounds): " + ", ".join(
            f"{role} {statistics.median(i[role] for i in idles):.3f}" for role in idles[0]))  # fmt: skip
    return 0


def summarize(op: str, conc: int, s: Setup, rs: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    roles = sorted(rs[0]["store_us"])
    followers = [r for r in roles if r != "leader"]
    row: dict[str, Any] = {
        "op": op, "conc": conc, "setup": s.name, "proxies": s.proxies, "workers": s.workers,
        "rate": med(r["rate"] for r in rs), "rates": [round(r["rate"]) for r in rs],
        "leader_us": med(r["store_us"].get("leader", 0.0) for r in rs),
        "follower_us": med(statistics.fmean(r["store_us"][f] for f in followers) for r in rs) if followers else None,
        "proxies_us": med(r["proxies_us"] for r in rs),
        "errors": sum(r["errors"] for r in rs), "error": next((r["error"] for r in rs if r["error"]), None),
    }  # fmt: skip
    return row


def line(row: dict[str, Any]) -> str:
    fol = f", follower {row['follower_us']:.0f} µs" if row["follower_us"] is not None else ""
    err = f" [{row['errors']} errors: {row['error']}]" if row["errors"] else ""
    per = "event" if row["op"] == "watch" else "request"
    return (f"{row['op']:6} x{row['conc']:<3} {row['setup']:>20}: {row['rate']:7,.0f}/s (rounds {row['rates']}); "
            f"CPU per {per}: store leader {row['leader_us']:.0f} µs{fol}, proxies {row['proxies_us']:.0f} µs{err}")


if __name__ == "__main__":
    sys.exit(main())
