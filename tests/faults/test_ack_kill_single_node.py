"""A single-node store killed (kill -9) right after it acknowledged Puts has them all on disk.

Since the leader acknowledges its own entries only once the Ready carrying them is persisted
(authstore/raft/raft.py, a self MsgAppResp stepped on advance), a single node commits, applies
and answers an entry only after its WAL fsync. In each round several writers put unique keys
through the proxy; as soon as the round has its first acknowledgements the store is killed, then
restarted; every Put acknowledged so far, in any round, must be there, with its value.

Finding: an acknowledged Put lost to a kill -9 right after the answer (the single-node case of the
kill -9 loops, test_kill_loop_three_nodes.py).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import Client, program_cluster
from tests.support.processes import wait_for

#: kill -9 rounds (each restarts the node: seconds): two in `make test` (a kill, then a kill of a
#: node that was restarted after one); the soak variant (`make test-soak`) RAFTGATE_KILL_ROUNDS (default 8)
ROUNDS = 2
SOAK_ROUNDS = int(os.environ.get("RAFTGATE_KILL_ROUNDS", "8"))
WRITERS = 3


@pytest.mark.slow
@pytest.mark.parametrize("rounds", [ROUNDS, pytest.param(SOAK_ROUNDS, marks=pytest.mark.soak, id="soak")])
def test_acknowledged_puts_survive_kill9_of_a_single_node(tmp_path: Path, rounds: int) -> None:
    with program_cluster(tmp_path, nodes=1) as cluster:
        node = cluster.nodes[0]
        acked: dict[bytes, bytes] = {}
        lock = threading.Lock()
        reader = Client(cluster.endpoint)
        try:
            for rnd in range(rounds):
                stop = threading.Event()
                before = len(acked)

                def write(w: int, rnd: int = rnd, stop: threading.Event = stop) -> None:
                    client = Client(cluster.endpoint)
                    try:
                        for i in range(10_000):
                            if stop.is_set():
                                return
                            key, value = f"k/{rnd}/{w}/{i}".encode(), f"v{rnd}.{w}.{i}".encode()
                            try:
                                client.put(key, value, timeout=5)
                            except grpc.RpcError:
                                continue  # the store is down: outcome unknown, not counted
                            with lock:
                                acked[key] = value
                    finally:
                        client.close()

                threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
                for t in threads:
                    t.start()
                try:
                    wait_for(lambda b=before: len(acked) > b + WRITERS, 60, f"round {rnd}: Puts acknowledged")
                    cluster.kill(node)  # writers may be mid-Put: those are unknown, not lost
                finally:
                    stop.set()
                    for t in threads:
                        t.join()
                cluster.restart(node)
                with lock:
                    expected = dict(acked)
                found = wait_for(lambda: _scan(reader), 60, f"round {rnd}: a read after the restart")[0]  # type: ignore[index]
                missing = {k: v for k, v in expected.items() if found.get(k) != v}
                assert not missing, f"round {rnd}: {len(missing)} acknowledged Puts lost: {sorted(missing)[:5]}"
        finally:
            reader.close()


def _scan(client: Client) -> tuple[dict[bytes, bytes]] | None:
    try:
        return (client.scan(b"k/"),)
    except grpc.RpcError:
        return None
