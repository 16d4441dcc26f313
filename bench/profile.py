"""``python -m bench.profile``: one benchmark load against raftgate while py-spy samples the proxy,
the store leader and (``--nodes 3`` or 5) one follower; prints where the time goes (self and
inclusive, per process).

Needs py-spy (``pip install py-spy``; not a raftgate dependency). Example:

    python -m bench.profile --op put --conc 16 --auth simple --seconds 10 --out /tmp/prof
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.admin import BENCH, PREFIX, Admin
from bench.load import run_job, split, watch_jobs
from bench.targets import RaftgateTarget, stop_all


def summarize(raw: Path, top: int) -> str:
    """Self and inclusive sample shares per function from py-spy's collapsed (raw) stacks."""
    self_c: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    if not raw.exists():
        return "  (no profile: py-spy failed; see its stderr above)"
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        frames = [f for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        self_c[_short(frames[-1])] += count
        for f in {_short(f) for f in frames}:
            incl[f] += count
    if not total:
        return "  (no samples)"
    out = [f"  {total} samples", "  self %  function"]
    out += [f"  {100 * c / total:6.1f}  {f}" for f, c in self_c.most_common(top)]
    out += ["  incl %  function"]
    out += [f"  {100 * c / total:6.1f}  {f}" for f, c in incl.most_common(top)]
    return "\n".join(out)


def _short(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if parts else path
    return f"{name} ({short})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--op", default="put", choices=["put", "range", "auth", "watch"])
    p.add_argument("--conc", type=int, default=16, help="concurrent clients (--op watch: watchers)")
    p.add_argument("--serializable", action="store_true")
    p.add_argument("--auth", default="simple", choices=["off", "simple"])
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--bcrypt-cost", type=int, default=4)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--gil", action="store_true", help="only samples holding the GIL")
    p.add_argument("--native", action="store_true", help="include native (C/Cython) frames")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default="bench-profile")
    a = p.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("bench.profile: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="raftgate-profile-"))
    t = RaftgateTarget(workdir / "rg", a.nodes, bcrypt_cost=a.bcrypt_cost, auth_token="simple")
    pool = multiprocessing.get_context("spawn").Pool(a.procs)
    manager = None
    try:
        t.start()
        admin = Admin(t.grpc_target, [])
        admin.setup([])
        if a.auth != "off":
            admin.enable_auth()
        leader = t.leader_pid()
        processes = t.local_json()["processes"]
        procs = {"proxy": next(x["pid"] for x in processes if x["role"] == "proxy")}
        if leader is not None:
            procs["store-leader"] = leader
            followers = [x["pid"] for x in processes if x["role"] == "store" and x["pid"] != leader]
            if followers:
                procs["store-follower"] = followers[0]
        token = admin.token(*BENCH) if a.auth != "off" else None
        job = {"target": t.grpc_target, "op": a.op, "duration": a.seconds + 2, "max_ops": 10_000_000,
               "token": token, "key": f"{PREFIX}p/" if a.op == "put" else f"{PREFIX}r",
               "serializable": a.serializable, "user": BENCH[0], "password": BENCH[1]}  # fmt: skip
        if a.op == "auth":
            job["token"] = None
        n = min(a.procs, a.conc)
        shares = split(a.conc, n)
        if a.op == "watch":  # --conc watchers; the first job also writes (bench.load._watch)
            manager = multiprocessing.get_context("spawn").Manager()
            jobs = watch_jobs({**job, "key": f"{PREFIX}w/"}, shares, manager.Barrier(n))
        else:
            jobs = [{**job, "conc": c, "index": i} for i, c in enumerate(shares)]
        result = pool.map_async(run_job, jobs)
        time.sleep(1.0)  # let the load reach steady state before sampling
        spies = {}
        for role, pid in procs.items():
            cmd = [spy, "record", "-p", str(pid), "-d", str(int(a.seconds)), "-r", str(a.rate), "-f", "raw",
                   "-o", str(out / f"{role}.txt")]  # fmt: skip
            # py-spy reads native stacks only from a stopped process; Python stacks it reads live.
            cmd += (["--gil"] if a.gil else []) + (["--native"] if a.native else ["--nonblocking"])
            spies[role] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        for s in spies.values():
            s.wait(timeout=a.seconds + 60)
        res = result.get(timeout=a.seconds + 60)
        if a.op == "watch":  # events delivered over the window, as the bench counts them
            longest = max(r["elapsed"] for r in res)
            rate = sum(r["count"] for r in res) / longest if longest > 0 else 0.0
        else:
            rate = sum(r["count"] / r["elapsed"] for r in res if r["elapsed"])
        print(f"load: {a.op} x{a.conc}, auth {a.auth}, {a.nodes} node(s): {rate:,.0f}/s "
              f"({sum(r['errors'] for r in res)} errors)")  # fmt: skip
        for role in procs:
            print(f"\n== {role} (pid {procs[role]}) — {out / (role + '.txt')}")
            print(summarize(out / f"{role}.txt", a.top))
        admin.close()
    finally:
        pool.terminate()
        pool.join()
        if manager is not None:
            manager.shutdown()
        t.stop()
        stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
