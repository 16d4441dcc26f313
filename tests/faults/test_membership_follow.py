"""The proxy follows the store cluster's membership: seeded with three nodes, it keeps serving
while an operator grows the cluster to four with etcdctl (a learner, promoted), moves the
leadership to the new node and removes an old one. A writer puts through the proxy the whole
time, retrying each write for a bounded time as etcd's clients do: every write succeeds and none
is lost."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import grpc
import pytest

from tests.support.cluster import Client, Node, describe, program_cluster, store_argv
from tests.support.processes import etcdctl, free_port, wait_for

#: how long one write may keep failing before the writer gives up on it (etcd clients retry
#: within their own deadline; a proxy that cannot find the leader never recovers)
WRITE_PATIENCE = 30.0


class Writer:
    """Puts w/00000, w/00001, ... one after the other, each retried until it succeeds."""

    def __init__(self, target: str) -> None:
        self.client = Client(target)
        self.done: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=WRITE_PATIENCE + 10)
        self.client.close()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            key = f"w/{i:05d}".encode()
            deadline = time.monotonic() + WRITE_PATIENCE
            while True:
                try:
                    self.client.put(key, key, timeout=5)
                    self.done.append(key)
                    break
                except grpc.RpcError as exc:
                    if time.monotonic() > deadline:
                        self.failed.append((key, describe(exc)))
                        return
                    time.sleep(0.1)
            i += 1

    def progress(self, what: str) -> None:
        """Waits for a few more writes to succeed (or the writer to give up)."""
        start = len(self.done)
        wait_for(lambda: len(self.done) >= start + 3 or self.failed, WRITE_PATIENCE + 10, what)
        assert not self.failed, f"{what}: a write kept failing: {self.failed}"


def _member_hex(out: str) -> str:
    added = re.match(r"Member +([0-9a-f]+) added to cluster", out)
    assert added, out
    return added.group(1)


@pytest.mark.slow
def test_proxy_follows_add_promote_move_leader_remove(tmp_path: Path) -> None:
    with program_cluster(tmp_path, nodes=3) as cluster:
        ep = cluster.endpoint
        argv = cluster.nodes[0].argv
        client_url = argv[argv.index("--advertise-client-urls") + 1]
        secret = Path(argv[argv.index("--internal-secret-file") + 1])
        initial = argv[argv.index("--initial-cluster") + 1]
        with Writer(ep) as writer:
            writer.progress("writes through the proxy")

            # grow: a learner, started, caught up, promoted
            peer_port, internal_port = free_port(), free_port()
            peer_url = f"http://127.0.0.1:{peer_port}"
            rc, out, err = etcdctl(ep, "member", "add", "node4", f"--peer-urls={peer_url}", "--learner")
            assert rc == 0, err
            member_hex = _member_hex(out)
            node4 = Node(name="node4", data_dir=tmp_path / "node4", internal=f"127.0.0.1:{internal_port}",
                         argv=store_argv("node4", tmp_path / "node4", internal_port, peer_port, secret,
                                         f"{initial},node4={peer_url}", client_url,
                                         ["--initial-cluster-state", "existing"]))
            cluster.nodes.append(node4)
            cluster.restart(node4)
            writer.progress("writes while the learner joins")

            def promoted() -> bool:
                rc, _, err = etcdctl(ep, "member", "promote", member_hex)
                assert rc == 0 or "in sync with leader" in err, err
                return rc == 0

            wait_for(promoted, 60, "the learner to catch up and be promoted")
            writer.progress("writes after the promotion")

            # move the leadership to the new node
            rc, out, err = etcdctl(ep, "move-leader", member_hex, timeout=60)
            assert rc == 0, err
            assert cluster.leader(among=cluster.nodes[1:]) is node4 or cluster.leader() is node4
            writer.progress("writes after the leadership moved to node4")

            # shrink: remove the first seed
            old = cluster.nodes[0]
            cluster.leader_info(old)
            rc, out, err = etcdctl(ep, "member", "remove", f"{old.member_id:x}")
            assert rc == 0, err
            wait_for(lambda: not old.running, 30, "the removed member to stop")
            writer.progress("writes after an old member was removed")
        assert not writer.failed, writer.failed

        listed = etcdctl(ep, "member", "list")[1]
        assert f"{old.member_id:x}," not in listed and f"{member_hex}," in listed, listed
        reader = Client(ep)
        try:
            stored = reader.scan(b"w/")
        finally:
            reader.close()
        assert writer.done, "no write succeeded"
        missing = [k for k in writer.done if stored.get(k) != k]
        assert not missing, f"acknowledged writes lost: {missing[:10]}"
