"""A challenge the server no longer vouches for (it restarted, the channel reconnected from another
port) is refused before anything ran: callers fetch a new one and send again, and a caller of the
proxy's store pipe never sees the refusal (raftgate/secret_proof.py, proxy/store_pipe.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import grpc
import grpc.aio

from protos.storepb import store_pb2
from proxy.store_pipe import StorePipe
from raftgate.secret_proof import INTERNAL, Challenges, ProofCheck, Prover

SECRET = b"secret-for-tests-0123456789"
SERVICE = "/raftgate.storepb.Store/"


class _Server:
    def __init__(self) -> None:
        self.challenges = Challenges(INTERNAL, (SECRET,), member_id=7)
        self.issued = 0
        issue = self.challenges.issue

        def counted(peer: str) -> bytes:
            self.issued += 1
            return issue(peer)

        self.challenges.issue = counted  # type: ignore[method-assign]
        self.server = grpc.aio.server(interceptors=[ProofCheck(self.challenges, "refused")])

        async def leader(request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
            return request

        async def do_stream(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            await context.send_initial_metadata(())
            async for raw in requests:
                calls = store_pb2.DoBatch.FromString(raw).calls
                yield store_pb2.DoResultBatch(results=[store_pb2.DoResult(id=c.id, response=c.request)
                                                       for c in calls]).SerializeToString()

        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("raftgate.storepb.Store", {
            "Leader": grpc.unary_unary_rpc_method_handler(leader),
            "DoStream": grpc.stream_stream_rpc_method_handler(do_stream)}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    def restart(self) -> None:
        """What a restarted store is to its callers' challenges: a new key."""
        self.challenges._key = os.urandom(32)


def test_a_stale_challenge_is_replaced_and_the_call_sent_again() -> None:
    async def main() -> None:
        server = _Server()
        await server.server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
        try:
            prover = Prover(channel, SECRET, INTERNAL)
            leader = channel.unary_unary(SERVICE + "Leader")
            assert await prover.call(lambda md: leader(b"one", metadata=md, timeout=5)) == b"one"
            assert await prover.call(lambda md: leader(b"two", metadata=md, timeout=5)) == b"two"
            assert server.issued == 1  # one challenge serves every call on the connection
            server.restart()
            assert await prover.call(lambda md: leader(b"three", metadata=md, timeout=5)) == b"three"
            assert server.issued == 2

            # the pipe's stream opens over the stale challenge, is refused, and opens again
            server.restart()
            pipe = StorePipe(channel, SERVICE + "DoStream", prover)
            assert await pipe.do(b"request", 5) == b"request"
            assert server.issued == 3
            await pipe.close()
        finally:
            await channel.close()
            await server.server.stop(None)

    asyncio.run(asyncio.wait_for(main(), 30))
