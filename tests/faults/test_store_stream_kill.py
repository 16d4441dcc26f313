"""A store killed (kill -9) under load from many writers, whose calls the proxy's store stream
holds back to batch them (proxy/store_pipe.py, ``hold_until``): no Put is applied twice, every
acknowledged Put is there after the restart, and the writers see only UNAVAILABLE answers.

Attack on the batching waits (calls held when the stream breaks must fail as never sent, the
ones written as outcome unknown, and the proxy must never send those again): held when written.
"""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2
from tests.support.cluster import Client, describe, prefix_end, program_cluster, retry_ok
from tests.support.processes import wait_for

# A multi-process variant of what tests/unit/test_store_pipe.py and test_write_never_sent_twice.py
# show in `make test` (held calls fail as never sent, written ones as outcome unknown): it runs in
# `make test-soak`, CI's own bounded step, so `make test` stays within its ten minutes.
pytestmark = [pytest.mark.slow, pytest.mark.soak]

WRITERS = 16
PREFIX = b"/held/"


def test_a_store_killed_under_batched_load_applies_no_put_twice(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=1) as cluster:
        node = cluster.nodes[0]
        acked: set[bytes] = set()
        errors: set[str] = set()
        lock = threading.Lock()
        stop = threading.Event()

        def write(w: int) -> None:
            client = Client(cluster.endpoint)
            try:
                for i in range(100_000):
                    if stop.is_set():
                        return
                    key = PREFIX + b"%02d/%06d" % (w, i)
                    try:
                        client.put(key, key, timeout=5)
                    except grpc.RpcError as exc:
                        with lock:
                            errors.add(describe(exc).split(":")[0])
                        continue
                    with lock:
                        acked.add(key)
            finally:
                client.close()

        reader = Client(cluster.endpoint)
        try:
            retry_ok(lambda: reader.put(b"/warm", b"up", timeout=10), 30, "a first write")
            threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
            for t in threads:
                t.start()
            try:
                wait_for(lambda: len(acked) > 20 * WRITERS, 60, "Puts acknowledged under load")
                cluster.kill(node)  # writers are mid-Put, some held back, some written
                wait_for(lambda: errors, 30, "the writers meet the killed store")
            finally:
                stop.set()
                for t in threads:
                    t.join()
            cluster.restart(node)
            resp = retry_ok(lambda: reader.kv.Range(rpc_pb2.RangeRequest(key=PREFIX, range_end=prefix_end(PREFIX)),
                                                    timeout=10), 60, "a read after the restart")
            found = {kv.key: kv for kv in resp.kvs}
            assert acked <= found.keys(), sorted(acked - found.keys())[:5]
            twice = [(k, kv.version) for k, kv in found.items() if kv.version != 1 or kv.value != k]
            assert not twice, twice[:5]  # a Put applied a second time makes its key version 2
            assert errors <= {"UNAVAILABLE"}, errors
        finally:
            reader.close()
