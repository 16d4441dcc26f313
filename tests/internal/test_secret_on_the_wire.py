"""Shared development secrets are proven, never sent (Trust round 3, item 10).

In secret mode a proxy (central or sidecar) sends its credential to every store URL it dials, and
a leader its peer secret to every peer URL, including one root added with MemberAdd. Here each
dials a fake server on 127.0.0.1 that records what it is sent and passes the challenge of a real
store on (a relay, over its own connection to that store). The secret's bytes must never reach
the fake, and what the fake captured must not open the real store: neither from another
connection nor, for a member the cluster knows by another ID, from the relay's own connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from raftgate.secret_proof import is_stale
from tests.support.cluster import store_argv
from tests.support.processes import SECRET, Program, etcdctl, free_port, proxy_program, store_program, wait_for

SIDECAR_SECRET = "sidecar-s3cret-for-tests-0123456789"
#: a channel on a connection of its own (channels of one process to one target share one otherwise)
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


class FakeStore(grpc.GenericRpcHandler):
    """Answers every method; records each call's metadata; passes Challenge on to ``real`` over one
    connection of its own (the relay), refuses everything else."""

    def __init__(self, real: str) -> None:
        self.relay = grpc.insecure_channel(real, options=OWN_CONNECTION)
        self.calls: list[tuple[str, tuple[tuple[str, str | bytes], ...]]] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        with self.lock:
            self.calls.append((method, tuple(details.invocation_metadata or ())))
        if method.endswith("/Challenge"):
            def relay(_requests: Iterator[bytes], _context: grpc.ServicerContext) -> Iterator[bytes]:
                yield self.relay.unary_unary(method)(b"", timeout=10)
            return grpc.stream_stream_rpc_method_handler(relay)

        def refuse(_requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake")
            yield b""  # never reached
        return grpc.stream_stream_rpc_method_handler(refuse)

    def captured(self) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
        """The calls other than Challenge, with the metadata the caller chose (raftgate's keys)."""
        with self.lock:
            return [(m, tuple((k, v if isinstance(v, str) else v.decode("latin-1")) for k, v in md
                              if k.startswith("x-raftgate")))
                    for m, md in self.calls if not m.endswith("/Challenge")]

    def everything(self) -> bytes:
        with self.lock:
            return b"".join(k.encode() + (v.encode() if isinstance(v, str) else v) for _, md in self.calls
                            for k, v in md)

    def close(self) -> None:
        self.server.stop(0)
        self.relay.close()


@pytest.fixture
def fakes() -> Iterator[list[FakeStore]]:
    made: list[FakeStore] = []
    yield made
    for fake in made:
        fake.close()


def _refused(target: str | grpc.Channel, method: str, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    channel = grpc.insecure_channel(target, options=OWN_CONNECTION) if isinstance(target, str) else target
    try:
        channel.unary_unary(method)(b"", metadata=metadata, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    finally:
        if isinstance(target, str):
            channel.close()


@pytest.mark.slow
@pytest.mark.parametrize("role", ["central", "sidecar"])
def test_a_proxy_never_sends_its_secret(tmp_path: Path, fakes: list[FakeStore], role: str) -> None:
    sidecar = tmp_path / "sidecar-secret"
    sidecar.write_text(SIDECAR_SECRET)
    store, internal = store_program(tmp_path, "--sidecar-secret-file", str(sidecar))
    with store:
        fake = FakeStore(internal)
        fakes.append(fake)
        extra = ["--internal-secret-file", str(sidecar)] if role == "sidecar" else []
        proxy = proxy_program(tmp_path, fake.address, f"http://127.0.0.1:{free_port()}", *extra)
        with proxy:
            wait_for(fake.captured, 30, "the proxy to call the fake store")
        secret = (SIDECAR_SECRET if role == "sidecar" else SECRET).encode()
        assert secret not in fake.everything(), "the proxy sent its secret in clear"
        for method, metadata in fake.captured():
            assert metadata, f"{method}: sent without any credential"
            # the real store, from a connection of the attacker's own
            assert _refused(internal, "/raftgate.storepb.Store/Leader", metadata) == grpc.StatusCode.UNAUTHENTICATED



@pytest.mark.slow
def test_a_leader_never_sends_its_peer_secret_to_an_added_member(tmp_path: Path, fakes: list[FakeStore]) -> None:
    store, internal = store_program(tmp_path)
    peer = store.args[store.args.index("--listen-peer-urls") + 1].removeprefix("http://")
    with store:
        proxy = proxy_program(tmp_path, internal, listen := f"http://127.0.0.1:{free_port()}")
        with proxy:
            fake = FakeStore(peer)  # relays the real member's challenge over its own connection
            fakes.append(fake)
            rc, out, err = etcdctl(listen, "member", "add", "rogue", f"--peer-urls=http://{fake.address}",
                                   "--learner")
            assert rc == 0, (out, err)
            wait_for(fake.captured, 30, "the leader to send to the added member")
        assert SECRET.encode() not in fake.everything(), "the leader sent its peer secret in clear"
        for method, metadata in fake.captured():
            assert metadata, f"{method}: sent without any credential"
            # on the relay's own connection (the challenge was issued to it) and on a new one
            assert _refused(fake.relay, "/raftgate.storepb.Peer/Members", metadata) == \
                grpc.StatusCode.UNAUTHENTICATED
            assert _refused(peer, "/raftgate.storepb.Peer/Members", metadata) == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.slow
def test_a_proxy_binds_its_proof_to_the_member_a_learned_url_belongs_to(tmp_path: Path,
                                                                        fakes: list[FakeStore]) -> None:
    """Member node2 publishes a URL (--advertise-internal-urls) that is a relay to node1: the proxy,
    which learns it from the member list, proves to node2, and node1 refuses that proof even on the
    relay's own connection, the one its challenge was issued to."""
    secret = tmp_path / "internal-secret"
    secret.write_text(SECRET)
    (p1, i1), (p2, i2) = (free_port(), free_port()), (free_port(), free_port())
    initial = f"node1=http://127.0.0.1:{p1},node2=http://127.0.0.1:{p2}"
    client = f"http://127.0.0.1:{free_port()}"
    fake = FakeStore(f"127.0.0.1:{i1}")
    fakes.append(fake)
    stores = [Program(tmp_path / name, store_argv(name, tmp_path / f"{name}-data", internal, peer, secret, initial,
                                                  client, extra), "raftgate store:", name=name)
              for name, internal, peer, extra in (
                  ("node1", i1, p1, []), ("node2", i2, p2, ["--advertise-internal-urls", f"http://{fake.address}"]))]
    proxy = proxy_program(tmp_path, f"127.0.0.1:{i1}", client)
    try:
        threads = [threading.Thread(target=s.start) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        proxy.start()
        wait_for(fake.captured, 60, "the proxy to call node2's published URL")
        assert SECRET.encode() not in fake.everything()
        for method, metadata in fake.captured():
            assert metadata, f"{method}: sent without any credential"
            with pytest.raises(grpc.RpcError) as refused:
                fake.relay.unary_unary("/raftgate.storepb.Store/Leader")(b"", metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # the challenge was node1's, issued to this connection: what fails is the member the proof names
            assert not is_stale(refused.value)
    finally:
        proxy.stop()
        for s in stores:
            s.stop()
