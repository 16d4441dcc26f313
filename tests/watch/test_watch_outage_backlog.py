"""Every buffer bounded in bytes: a watch client's requests while the proxy has no store stream.

While the store leader is gone (up to 30 s before the client is told), the proxy keeps the creates
and other requests a client sends, to send them once a leader is back. It kept them without
bound: 300 creates of 1 MB sent during an outage grew the proxy by about 250 MB, and 200,000
progress requests by about 50 MB more. The proxy now reads no more of such a client once it holds
4 MiB of its unsent requests; HTTP/2 flow control holds the client back.
"""

from __future__ import annotations

import os
import queue
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from protos.etcdserverpb import rpc_pb2_grpc as pbg
from tests.support.memory import memory_kib
from tests.support.processes import free_port, proxy_program, store_program, wait_for, wait_serving

pytestmark = pytest.mark.slow
CREATES = 300
KEY_BYTES = 1_000_000
#: the 4 MiB of unsent requests, the client->proxy flow-control window, room; unbounded: ~250 MiB
MARGIN_MIB = 60


def test_requests_sent_during_an_outage_are_held_within_a_bound(tmp_path: Path) -> None:
    store, internal = store_program(tmp_path)
    port = free_port()
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{port}")
    endpoint = f"127.0.0.1:{port}"
    with store, proxy:
        wait_serving(endpoint)
        assert proxy.proc is not None and store.proc is not None
        channel = grpc.insecure_channel(endpoint, options=[("grpc.max_send_message_length", 8 << 20)])
        requests: queue.Queue[pb.WatchRequest | None] = queue.Queue()
        sent = [0]

        def send() -> Iterator[pb.WatchRequest]:
            while (item := requests.get(timeout=120)) is not None:
                sent[0] += 1
                yield item

        try:
            answers = pbg.WatchStub(channel).Watch(send(), timeout=120)
            requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=b"a")))
            assert next(answers).created
            before = memory_kib(proxy.proc.pid, "VmRSS")
            os.killpg(store.proc.pid, signal.SIGKILL)  # no store: the proxy cannot pass anything on
            for i in range(CREATES):
                key = b"%04d" % i + b"k" * KEY_BYTES
                requests.put(pb.WatchRequest(create_request=pb.WatchCreateRequest(key=key)))
            # gRPC takes the client's messages as flow control lets it; wait until it takes no more
            last = [-1]

            def settled() -> bool:
                now = sent[0]
                done = now in (CREATES + 1, last[0])
                last[0] = now
                return done

            wait_for(settled, 60, "the client's sends to settle", interval=1.0)
            peak = memory_kib(proxy.proc.pid, "VmRSS")
        finally:
            requests.put(None)
            channel.close()
    growth = (peak - before) // 1024
    print(f"proxy VmRSS {before // 1024} -> {peak // 1024} MiB; the client got {sent[0] - 1} creates out")
    assert growth <= MARGIN_MIB, f"proxy grew by {growth} MiB holding a watch client's requests"
