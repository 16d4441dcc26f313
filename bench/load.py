"""The load generator: one job runs in one client process (a ``multiprocessing`` pool worker).

A job drives one target over raw gRPC (raftgate's generated stubs, wire-identical to etcd's) with
``conc`` concurrent requests on one channel, for at most ``duration`` seconds and at most
``max_ops`` requests, and returns counts, latencies and the process's CPU time. Every loop is
bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import grpc

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc

RPC_TIMEOUT = 10.0
#: Writers of the watch row, each waiting for its Put before the next (``--watch-writers``).
WATCH_WRITERS = 4
#: Connect and warm-up are bounded too.
CONNECT_TIMEOUT = 15.0


def split(total: int, parts: int) -> list[int]:
    """``total`` clients (or watchers) over ``parts`` load processes, as evenly as they go."""
    parts = max(1, parts)
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def watch_jobs(base: dict[str, Any], shares: list[int], barrier: Any) -> list[dict[str, Any]]:
    """The watch row's jobs: ``shares[i]`` watchers in process i, the first one also writing; all
    start together at ``barrier`` (a manager's, one party per job)."""
    return [{**base, "watchers": w, "writer": i == 0, "barrier": barrier, "index": i} for i, w in enumerate(shares)]


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Entry point in the worker process."""
    return asyncio.run(_run(job))


def _metadata(job: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return (("token", job["token"]),) if job.get("token") else ()


async def _run(job: dict[str, Any]) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(job["target"], options=job.get("options") or []) as ch:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await ch.channel_ready()
        if job["op"] == "watch":
            return await _watch(ch, job)
        return await _closed_loop(ch, job)


def _op(ch: grpc.aio.Channel, job: dict[str, Any], worker: int) -> Any:
    md = _metadata(job)
    op = job["op"]
    if op == "auth":
        stub = rpc_pb2_grpc.AuthStub(ch)
        req = rpc_pb2.AuthenticateRequest(name=job["user"], password=job["password"])
        return lambda: stub.Authenticate(req, timeout=RPC_TIMEOUT)
    kv = rpc_pb2_grpc.KVStub(ch)
    if op == "put":
        key = f"{job['key']}{job['index']}-{worker}".encode()
        req = rpc_pb2.PutRequest(key=key, value=b"v" * job.get("value_size", 128))
        return lambda: kv.Put(req, metadata=md, timeout=RPC_TIMEOUT)
    if op == "range":
        req = rpc_pb2.RangeRequest(key=job["key"].encode(), serializable=job.get("serializable", False))
        return lambda: kv.Range(req, metadata=md, timeout=RPC_TIMEOUT)
    raise ValueError(f"unknown op {op!r}")


async def _closed_loop(ch: grpc.aio.Channel, job: dict[str, Any]) -> dict[str, Any]:
    conc: int = job["conc"]
    max_ops: int = job["max_ops"]
    lat: list[float] = []
    errors: list[str] = []
    state = {"issued": 0}
    calls = [_op(ch, job, w) for w in range(conc)]
    # Warm-up: one request per worker (not timed); a failure here is reported, not hidden.
    try:
        await asyncio.gather(*(c() for c in calls))
    except grpc.RpcError as e:
        return {"count": 0, "errors": 1, "error": f"{e.code().name}: {e.details()}", "lat": [], "elapsed": 0.0,
                "cpu": 0.0}  # fmt: skip
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + job["duration"]

    async def worker(call: Any) -> None:
        while state["issued"] < max_ops:
            now = time.perf_counter()
            if now >= deadline:
                return
            state["issued"] += 1
            try:
                await call()
            except grpc.RpcError as e:
                errors.append(f"{e.code().name}: {e.details()}")
                if len(errors) > 1000:
                    return
                continue
            lat.append(time.perf_counter() - now)

    await asyncio.gather(*(worker(c) for c in calls))
    elapsed = time.perf_counter() - t0
    return {"count": len(lat), "errors": len(errors), "error": errors[0] if errors else None, "lat": lat,
            "elapsed": elapsed, "cpu": time.process_time() - cpu0}  # fmt: skip


async def _watch(ch: grpc.aio.Channel, job: dict[str, Any]) -> dict[str, Any]:
    """``watchers`` Watch streams on ``key`` (a prefix); then, once every process has its streams
    (a shared barrier), the writer job puts events until ``duration`` or ``max_ops``, then a stop
    key. Each watcher counts the events it receives until it sees the stop key (or times out)."""
    md = _metadata(job)
    prefix = job["key"].encode()
    end = prefix[:-1] + bytes([prefix[-1] + 1])
    stop_key = prefix + b"~stop"
    stub = rpc_pb2_grpc.WatchStub(ch)
    calls = []
    for _ in range(job["watchers"]):
        call = stub.Watch(metadata=md)
        await call.write(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=prefix, range_end=end)))
        calls.append(call)
    for call in calls:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            resp = await call.read()
        if not resp.created or resp.canceled:
            return {"count": 0, "errors": 1, "error": f"watch not created: {resp.cancel_reason}", "elapsed": 0.0,
                    "cpu": 0.0, "lat": []}  # fmt: skip
    await asyncio.to_thread(job["barrier"].wait, CONNECT_TIMEOUT)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    hard_deadline = t0 + job["duration"] + 15.0
    received = [0]
    messages = [0]
    last = [t0]

    async def watcher(call: Any) -> None:
        with contextlib.suppress(TimeoutError, grpc.RpcError):
            async with asyncio.timeout(max(hard_deadline - time.perf_counter(), 0)):
                await watch_until_stop(call)

    async def watch_until_stop(call: Any) -> None:
        while (resp := await call.read()) is not grpc.aio.EOF:
            messages[0] += 1
            for ev in resp.events:
                if ev.kv.key == stop_key:
                    last[0] = time.perf_counter()
                    return
                received[0] += 1
            last[0] = time.perf_counter()

    written = [0]
    errors: list[str] = []

    async def writer() -> None:
        kv = rpc_pb2_grpc.KVStub(ch)
        deadline = t0 + job["duration"]
        value = b"v" * 64

        async def one(w: int) -> None:
            while written[0] < job["max_ops"] and time.perf_counter() < deadline:
                written[0] += 1
                try:
                    await kv.Put(rpc_pb2.PutRequest(key=prefix + f"k{w}".encode(), value=value), metadata=md,
                                 timeout=RPC_TIMEOUT)  # fmt: skip
                except grpc.RpcError as e:
                    errors.append(f"{e.code().name}: {e.details()}")
                    return

        await asyncio.gather(*(one(w) for w in range(job.get("writer_conc", WATCH_WRITERS))))
        await kv.Put(rpc_pb2.PutRequest(key=stop_key, value=b"1"), metadata=md, timeout=RPC_TIMEOUT)

    tasks = [watcher(c) for c in calls]
    if job.get("writer"):
        tasks.append(writer())
    await asyncio.gather(*tasks)
    for call in calls:
        call.cancel()
    return {"count": received[0], "messages": messages[0], "errors": len(errors),
            "error": errors[0] if errors else None, "lat": [], "elapsed": last[0] - t0, "t_first": t0,
            "written": written[0], "cpu": time.process_time() - cpu0, "pid": os.getpid()}  # fmt: skip
