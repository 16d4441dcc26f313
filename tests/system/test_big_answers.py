"""Trust item 7: one large answer must not break the proxy's shared store stream for everyone.

etcd serves a Range whose answer is far larger than any one internal stream message (its server
sends up to math.MaxInt32 bytes; etcdctl and clientv3 receive as much). Here 60 values of 1.4 MB
make an 84 MB answer while other clients keep writing and reading small keys: the big Range
reaches its client whole and every small call succeeds, as on etcd.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from tests.support.processes import EtcdServer, RaftgateLocal

COUNT = 60
VALUE_BYTES = 1_400_000  # under etcd's default --max-request-bytes (1.5 MiB)
SMALL_WORKERS = 4
SMALL_OPS = 150  # per worker at most: the loop is bounded whatever the timing


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """("OK", response) or (status code name, details) of fn(*args, **kwargs)."""
    try:
        return "OK", fn(*args, **kwargs)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details()  # type: ignore[attr-defined]


def _value(i: int) -> bytes:
    return (b"%02d" % i) * (VALUE_BYTES // 2)


def test_a_large_range_arrives_whole_and_other_calls_are_untouched(
        backend: str, start_server: Callable[..., EtcdServer | RaftgateLocal]) -> None:
    kw = {"extra_args": ["--nodes", "1"]} if backend == "raftgate" else {}
    srv = start_server(backend, **kw)
    # The receive limit raised, as clientv3's default (math.MaxInt32); python etcd3 keeps 4 MiB.
    channel = grpc.insecure_channel(srv.target, options=[("grpc.max_receive_message_length", -1)])
    kv = rpc_pb2_grpc.KVStub(channel)
    try:
        for i in range(COUNT):
            kv.Put(rpc_pb2.PutRequest(key=b"big/%02d" % i, value=_value(i)), timeout=60)

        done = threading.Event()
        failures: list[tuple[str, object]] = []
        big: list[tuple[str, object]] = []

        def small(n: int) -> None:
            for i in range(SMALL_OPS):
                key = b"small/%d/%d" % (n, i)
                code, answer = outcome(kv.Put, rpc_pb2.PutRequest(key=key, value=b"v%d" % i), timeout=30)
                if code != "OK":
                    failures.append((code, answer))
                code, answer = outcome(kv.Range, rpc_pb2.RangeRequest(key=key), timeout=30)
                if code != "OK":
                    failures.append((code, answer))
                elif [item.value for item in answer.kvs] != [b"v%d" % i]:
                    failures.append(("WRONG", key))
                if done.is_set():
                    return

        def large() -> None:
            try:
                big.append(outcome(kv.Range, rpc_pb2.RangeRequest(key=b"big/", range_end=b"big0"),
                                   timeout=120))
            finally:
                done.set()

        threads = [threading.Thread(target=small, args=(n,)) for n in range(SMALL_WORKERS)]
        threads.append(threading.Thread(target=large))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads)

        code, answer = big[0]
        assert code == "OK", answer
        assert isinstance(answer, rpc_pb2.RangeResponse)
        assert answer.count == COUNT and len(answer.kvs) == COUNT
        assert [item.value for item in answer.kvs] == [_value(i) for i in range(COUNT)]
        assert failures == []
    finally:
        channel.close()
