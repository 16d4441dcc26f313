"""A streamed request body that arrives a little at a time (a watch stream's requests) is parsed
in time linear in its size: the reader does not decode its whole buffer again on every chunk, which
let one client trickling a 4 MB value keep the proxy's event loop busy (O(n^2)).

Counted, not timed: the characters handed to the JSON decoder over the whole body.

Finding: a trickled body re-decoded whole on every chunk, O(n^2) on the event loop (failed before
the fix).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

import proxy.gateway_json as gateway_json
from protos.etcdserverpb import rpc_pb2 as pb
from proxy.gateway import Gateway


class _Stub:
    async def unary(self, method: Any, request: bytes, context: Any) -> bytes:
        return b""

    authenticate = hash_password = unary

    async def watch(self, method: Any, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for _ in requests:
            yield pb.WatchResponse(created=True).SerializeToString()

    range_stream = snapshot = keepalive = watch


def trickle(monkeypatch: pytest.MonkeyPatch, values: list[bytes], piece: int) -> tuple[int, int, bytes]:
    """Sends ``values`` as one chunked /v3/watch body, ``piece`` bytes per chunk; returns
    (characters decoded, body size, the answer's first bytes)."""
    decoded = [0]
    real = gateway_json._raw_decode

    def counting(text: str, start: int = 0) -> Any:
        decoded[0] += len(text) - start
        return real(text, start)

    monkeypatch.setattr(gateway_json, "_raw_decode", counting)
    body = b"".join(values)

    async def scenario() -> bytes:
        gateway = Gateway(_Stub(), ["127.0.0.1:0"], max_message_bytes=2 << 20)  # type: ignore[arg-type]
        await gateway.start()
        try:
            host, port = gateway.addresses[0].rsplit(":", 1)
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /v3/watch HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
            for at in range(0, len(body), piece):
                part = body[at:at + piece]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.001)  # pacing only: lets the server read each piece apart
            writer.write(b"0\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(4096), 60)
            writer.close()
            return answer
        finally:
            await gateway.stop()

    answer = asyncio.run(scenario())
    return decoded[0], len(body), answer


def test_a_large_value_trickled_is_decoded_in_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    value = b'{"create_request": {"key": "Zm9v"}, "x": "' + b"A" * (1 << 20) + b'"}'
    decoded, size, answer = trickle(monkeypatch, [value], 2048)
    assert b'"created":true' in answer
    assert decoded <= 4 * size, f"{decoded} characters decoded for a {size}-byte body"


def test_many_small_requests_split_anywhere_are_each_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests cut at any byte (a piece of 7) still each complete as soon as their end arrives."""
    values = [b'{"create_request": {"key": "Zm9v", "x": "a\\"}b"}} ' for _ in range(50)]
    decoded, size, answer = trickle(monkeypatch, values, 7)
    assert answer.count(b'"created":true') >= 1
    assert decoded <= 4 * size, f"{decoded} characters decoded for a {size}-byte body"
