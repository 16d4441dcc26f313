"""A proxy whose --store-endpoints name a store node by another address than the one the node
publishes (in Kubernetes: a Service name as the seed, the pod's own name learned from the member
list) holds one endpoint per address of the same node. When discovery first named the leader by
its learned address, the proxy took it for a leader change and ended its shared watch streams to
the "old" one, the same node: every client watch resumed (and again whenever the two addresses
traded places after a missed probe). A watch stays on its stream unless the leader really changed."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.processes import free_port, proxy_program, store_program, wait_for, wait_serving

pytestmark = pytest.mark.slow


def test_a_leader_learned_under_its_published_address_keeps_the_watches_on_their_stream(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path)
    port = free_port()
    seed = internal.replace("127.0.0.1", "localhost")  # the same node, under another name
    proxy = proxy_program(tmp_path, seed, f"http://127.0.0.1:{port}")
    endpoint = f"127.0.0.1:{port}"
    with store, proxy:
        wait_serving(endpoint)
        channel = grpc.insecure_channel(endpoint)
        requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()

        def send() -> Iterator[pb.WatchRequest]:
            while (item := requests.get(timeout=60)) is not None:
                yield item

        try:
            answers = pbg.WatchStub(channel).Watch(send(), timeout=60)
            requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"k")))
            assert next(answers).created
            # discovery names the leader by the address it publishes
            wait_for(lambda: any("store leader is 127.0.0.1:" in line for line in proxy.lines), 30,
                     "the proxy to learn the leader's own address")
            put = pbg.KVStub(channel).Put(pb.PutRequest(key=b"k", value=b"v"), timeout=10)
            event = next(answers)  # (a resume would have been under way, and logged, before this)
            assert [e.kv.mod_revision for e in event.events] == [put.header.revision]
        finally:
            requests.put(None)
            channel.close()
    resumed = [line for line in proxy.lines if "resuming on the leader" in line]
    assert not resumed, resumed
