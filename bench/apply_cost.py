"""``python -m bench.apply_cost``: what the store's apply stage costs per Put, alone, in process.

No gRPC, no Raft, no threads: a fresh LMDB store with auth on (root, and ``bench`` with one
READWRITE grant, as ``raftgate bench`` sets up) is given batches of committed Put entries, as the
apply thread is, and the process's CPU time is read around them. Each batch is one LMDB write
transaction and one commit with its sync, so the CPU per Put falls with the batch size ``B`` as
``a + b / B``: ``a`` is one Put's own work (validate, authorize, MVCC write), ``b`` the batch's
(the commit's page writes and sync, the applied index, metrics). Both are fitted over the batch
sizes measured (least squares on 1/B). The entries are handed over as the leader does
(``Applier.remember``: parsed once); ``--parse`` makes apply parse them, as a follower does.

    python -m bench.apply_cost --batches 1,7,32 --puts 4000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from authstore.raft.types import Entry
from authstore.state.apply import Applier
from authstore.state.backend import Backend
from bench.admin import BENCH, PREFIX, prefix_end
from protos.authpb import auth_pb2
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb

TERM = 2
#: distinct keys the Puts cycle over (16 clients of ``raftgate bench`` write one key each)
KEYS = 16


class _Log:
    """Committed entries with consecutive indexes and request IDs."""

    def __init__(self, applier: Applier, parsed: bool) -> None:
        self.applier = applier
        self.parsed = parsed
        self.index = 0

    def entry(self, req: ipb.InternalRaftRequest, kind: str | None = None) -> Entry:
        self.index += 1
        req.ID = self.index
        data = req.SerializeToString()
        if kind is not None and self.parsed:
            self.applier.remember(data, req, kind)
        return Entry(term=TERM, index=self.index, data=data)


def _set_up(applier: Applier, log: _Log) -> int:
    """Users root and bench (READWRITE on PREFIX), auth on; returns the auth revision."""
    no_password = auth_pb2.UserAddOptions(no_password=True)
    grant = auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE, key=PREFIX.encode(),
                                range_end=prefix_end(PREFIX))
    entries = [
        log.entry(ipb.InternalRaftRequest(auth_user_add=pb.AuthUserAddRequest(name="root", options=no_password))),
        log.entry(ipb.InternalRaftRequest(auth_role_add=pb.AuthRoleAddRequest(name="root"))),
        log.entry(ipb.InternalRaftRequest(auth_user_grant_role=pb.AuthUserGrantRoleRequest(user="root", role="root"))),
        log.entry(ipb.InternalRaftRequest(auth_user_add=pb.AuthUserAddRequest(name=BENCH[0], options=no_password))),
        log.entry(ipb.InternalRaftRequest(auth_role_add=pb.AuthRoleAddRequest(name="rw"))),
        log.entry(ipb.InternalRaftRequest(
            auth_role_grant_permission=pb.AuthRoleGrantPermissionRequest(name="rw", perm=grant))),
        log.entry(ipb.InternalRaftRequest(auth_user_grant_role=pb.AuthUserGrantRoleRequest(user=BENCH[0], role="rw"))),
        log.entry(ipb.InternalRaftRequest(auth_enable=pb.AuthEnableRequest())),
    ]
    results, _ = applier.apply(entries, TERM)
    refused = [r for _, r in results if isinstance(r, BaseException)]
    if refused:
        raise RuntimeError(f"set-up refused: {refused[0]}")
    with applier.env.begin() as txn:
        return applier.auth.revision(txn)


def _batches(log: _Log, auth_revision: int, size: int, count: int, value: bytes,
             key_prefix: str) -> list[list[Entry]]:  # fmt: skip
    header = ipb.RequestHeader(username=BENCH[0], auth_revision=auth_revision)
    out = []
    for b in range(count):
        batch = []
        for i in range(size):
            key = b"%sp/%d" % (key_prefix.encode(), (b * size + i) % KEYS)
            batch.append(log.entry(ipb.InternalRaftRequest(header=header, put=pb.PutRequest(key=key, value=value)),
                                   kind="put"))
        out.append(batch)
    return out


def measure(size: int, puts: int, *, parsed: bool = True, value_size: int = 128,
            key_prefix: str = PREFIX) -> dict[str, float]:  # fmt: skip
    """CPU and wall time per Put in batches of ``size`` on a fresh store (after a warm-up); the
    keys under ``key_prefix`` (bench's grant covers PREFIX only)."""
    with tempfile.TemporaryDirectory(prefix="apply-cost-") as tmp:
        backend = Backend(Path(tmp) / "db", map_size=1 << 30)
        try:
            applier = Applier(backend, member_id=1)
            log = _Log(applier, parsed)
            revision = _set_up(applier, log)
            value = b"v" * value_size
            warm_up = _batches(log, revision, size, max(1, 400 // size), value, key_prefix)
            work = _batches(log, revision, size, max(1, puts // size), value, key_prefix)
            for batch in warm_up:  # not timed
                applier.apply(batch, TERM)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for batch in work:
                results, _ = applier.apply(batch, TERM)
                refused = [r for _, r in results if isinstance(r, BaseException)]
                if refused:
                    raise RuntimeError(f"a Put was refused: {refused[0]}")
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        finally:
            backend.close()
    n = len(work) * size
    return {"batch": size, "puts": n, "cpu_us": cpu / n * 1e6, "wall_us": wall / n * 1e6}


def fit(rows: list[dict[str, float]]) -> tuple[float, float] | None:
    """(µs per Put, µs per batch): least squares of CPU per Put against 1 / batch size."""
    if len({r["batch"] for r in rows}) < 2:
        return None
    xs = [1 / r["batch"] for r in rows]
    ys = [r["cpu_us"] for r in rows]
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.apply_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,7,32", help="comma list of batch sizes (entries per commit)")
    p.add_argument("--puts", type=int, default=4000, help="Puts measured per batch size")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the batch sizes; medians reported")
    p.add_argument("--parse", action="store_true", help="apply parses each entry (a follower's way)")
    p.add_argument("--json", default=None, help="also write the results here")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.batches.split(",") if x.strip()]
    except ValueError:
        print(f"bench.apply_cost: --batches {a.batches!r} is not a comma list of numbers", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or a.puts < 1 or a.rounds < 1:
        print("bench.apply_cost: batch sizes, --puts and --rounds must be at least 1", file=sys.stderr)
        return 2
    samples: dict[int, list[dict[str, float]]] = {s: [] for s in sizes}
    for _ in range(a.rounds):
        for size in sizes:
            samples[size].append(measure(size, a.puts, parsed=not a.parse))
    rows: list[dict[str, Any]] = []
    for size in sizes:
        rows.append({"batch": size, "puts": samples[size][0]["puts"],
                     "cpu_us": statistics.median(s["cpu_us"] for s in samples[size]),
                     "wall_us": statistics.median(s["wall_us"] for s in samples[size])})  # fmt: skip
        r = rows[-1]
        print(f"batch {size:4d}: CPU {r['cpu_us']:6.1f} µs per Put, wall {r['wall_us']:6.1f} µs per Put")
    fitted = fit(rows)
    doc: dict[str, Any] = {"rows": rows, "parsed_by_apply": a.parse}
    if fitted is not None:
        per_put, per_batch = fitted
        doc.update(per_put_us=per_put, per_batch_us=per_batch)
        print(f"fit: {per_put:.1f} µs per Put + {per_batch:.1f} µs per batch (CPU)")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
