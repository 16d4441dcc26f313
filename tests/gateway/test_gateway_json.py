"""The gateway's JSON reader against hostile bodies: nesting deep enough to exhaust Python's
recursion, numbers too long for ``int()``, and integer fields given what Go's jsonpb refuses.

Each expected answer is etcd 3.5.1's gateway's, measured with curl (the same body to both). None of
these may be a 500 "internal error": Go's decoder answers all of them as a client's mistake.

Finding: hostile JSON bodies answered with a 500 (Python's recursion and int() length limits)
instead of etcd's 400s (failed before the fix).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession

from protos.etcdserverpb import rpc_pb2 as pb
from proxy.gateway import Gateway


class _Stub:
    """Stands in for the Pipeline: a Range answers an empty RangeResponse; a Watch answers
    ``created`` once per request it reads."""

    async def unary(self, method: Any, request: bytes, context: Any) -> bytes:
        return pb.RangeResponse().SerializeToString()

    authenticate = hash_password = unary

    async def watch(self, method: Any, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for _ in requests:
            yield pb.WatchResponse(created=True).SerializeToString()

    range_stream = snapshot = keepalive = watch


def post(path: str, body: bytes) -> tuple[int, Any]:
    """(HTTP status, JSON body or text) of one POST to an in-process gateway."""

    async def scenario() -> tuple[int, Any]:
        gateway = Gateway(_Stub(), ["127.0.0.1:0"], max_message_bytes=2 << 20)  # type: ignore[arg-type]
        await gateway.start()
        try:
            async with ClientSession() as session, \
                    session.post(f"http://{gateway.addresses[0]}{path}", data=body) as r:
                text = await r.text()
                try:
                    return r.status, json.loads(text.splitlines()[0]) if text else text
                except ValueError:
                    return r.status, text
        finally:
            await gateway.stop()

    return asyncio.run(scenario())


def error(message: str, code: int = 3) -> dict[str, Any]:
    return {"error": message, "code": code, "message": message}


def range_with(extra: str) -> bytes:
    return ('{"key": "Zm9v", ' + extra + "}").encode()


DEPTH_ERROR = "invalid character '[' exceeded max depth"


@pytest.mark.parametrize(("body", "expected"), [
    # Go's decoder allows 10000 levels: below that an unknown field is ignored, above it refused
    (range_with('"x": ' + "[" * 5000 + "]" * 5000), (200, {})),
    (range_with('"x": ' + "[" * 9999 + "]" * 9999), (200, {})),
    (range_with('"x": ' + "[" * 10000 + "]" * 10000), (400, error(DEPTH_ERROR))),
    (b"[" * 100_000 + b"]" * 100_000, (400, error(DEPTH_ERROR))),
    (b"[" * 1_000_000, (400, error(DEPTH_ERROR))),  # never closed: refused as soon as too deep
])
def test_deep_nesting_is_go_s_depth_error_not_a_500(body: bytes, expected: tuple[int, Any]) -> None:
    assert post("/v3/kv/range", body) == expected


def test_a_deep_first_watch_request_is_go_s_depth_error() -> None:
    """etcd: the first streamed request that does not decode is Unknown (500) with the reason."""
    body = b'{"create_request": {"key": "Zm9v"}, "x": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    assert post("/v3/watch", body) == (500, error(DEPTH_ERROR, 2))


@pytest.mark.parametrize(("field", "expected"), [
    ('"revision": ' + "9" * 100_000, "json: cannot unmarshal number " + "9" * 100_000 + " into Go value of type int64"),
    ('"revision": 99999999999999999999',
     "json: cannot unmarshal number 99999999999999999999 into Go value of type int64"),
    ('"revision": "99999999999999999999"',
     "json: cannot unmarshal number 99999999999999999999 into Go value of type int64"),
    ('"revision": "-9223372036854775809"',
     "json: cannot unmarshal number -9223372036854775809 into Go value of type int64"),
    ('"revision": 1e400', "json: cannot unmarshal number 1e400 into Go value of type int64"),
    ('"limit": 1.5', "json: cannot unmarshal number 1.5 into Go value of type int64"),
    ('"limit": 1.0', "json: cannot unmarshal number 1.0 into Go value of type int64"),
    ('"limit": 1e2', "json: cannot unmarshal number 1e2 into Go value of type int64"),
    ('"limit": "1e2"', "json: cannot unmarshal number 1e2 into Go value of type int64"),
    ('"limit": "1.5"', "json: cannot unmarshal number 1.5 into Go value of type int64"),
    ('"limit": "05"', "invalid character '5' after top-level value"),
    ('"limit": "0x5"', "invalid character 'x' after top-level value"),
    ('"limit": "-x"', "invalid character 'x' in numeric literal"),
    ('"limit": "-"', "invalid character ' ' in numeric literal"),
    ('"limit": "1."', "invalid character ' ' after decimal point in numeric literal"),
    ('"limit": "true"', "json: cannot unmarshal bool into Go value of type int64"),
    ('"limit": "+5"', "invalid character '+' looking for beginning of value"),
    ('"key": "\\x"', "invalid character 'x' in string escape code"),
])
def test_integer_fields_refused_in_go_s_words(field: str, expected: str) -> None:
    assert post("/v3/kv/range", range_with(field)) == (400, error(expected))


@pytest.mark.parametrize("field", ['"limit": " 5"', '"limit": "5 "', '"limit": "null"', '"limit": -0'])
def test_integer_fields_go_accepts(field: str) -> None:
    assert post("/v3/kv/range", range_with(field)) == (200, {})


def test_uint64_out_of_range_in_go_s_words() -> None:
    for value in ('"-1"', "18446744073709551616"):
        assert post("/v3/cluster/member/remove", ('{"ID": ' + value + "}").encode()) == (
            400, error(f"json: cannot unmarshal number {value.strip(chr(34))} into Go value of type uint64"))


def test_a_deeply_nested_txn_is_no_500() -> None:
    """A txn nested past Python's recursion (etcd 3.5.1 gives no answer within 10 s): refused as a
    client's mistake (the message nests deeper than protobuf parses), never an internal error."""
    text = '{"success": [{"request_txn": ' * 3000 + '{"success": []}' + "}]}" * 3000
    status, body = post("/v3/kv/txn", text.encode())
    assert status == 400 and body["code"] == 3, (status, str(body)[:300])


@pytest.mark.parametrize(("value", "expected"), [
    ("1.5", "json: cannot unmarshal number 1.5 into Go value of type protoreflect.EnumNumber"),
    ("1e2", "json: cannot unmarshal number 1e2 into Go value of type protoreflect.EnumNumber"),
    ("99999999999", "json: cannot unmarshal number 99999999999 into Go value of type protoreflect.EnumNumber"),
    ("true", "json: cannot unmarshal bool into Go value of type protoreflect.EnumNumber"),
    ("[1]", "json: cannot unmarshal array into Go value of type protoreflect.EnumNumber"),
])
def test_enum_fields_given_what_is_not_an_int32_refused_in_go_s_words(value: str, expected: str) -> None:
    assert post("/v3/kv/range", range_with('"sort_order": ' + value)) == (400, error(expected))


@pytest.mark.parametrize("value", ["1", "-1", "null", '"DESCEND"'])
def test_enum_fields_go_accepts(value: str) -> None:
    assert post("/v3/kv/range", range_with('"sort_order": ' + value)) == (200, {})


@pytest.mark.parametrize(("body", "expected"), [
    ('{"compare": {}}', "json: cannot unmarshal object into Go value of type []json.RawMessage"),
    ('{"success": "x"}', "json: cannot unmarshal string into Go value of type []json.RawMessage"),
    ('{"success": [1]}', "json: cannot unmarshal number into Go value of type map[string]json.RawMessage"),
    ('{"success": [{"request_range": 5}]}',
     "json: cannot unmarshal number into Go value of type map[string]json.RawMessage"),
])
def test_lists_and_messages_of_the_wrong_kind_refused_in_go_s_words(body: str, expected: str) -> None:
    assert post("/v3/kv/txn", body.encode()) == (400, error(expected))


def test_a_null_in_a_list_of_messages_is_an_empty_message_as_in_go() -> None:
    """etcd reads ``[null]`` as one empty RequestOp (its store then answers ``key not found``)."""
    assert post("/v3/kv/txn", b'{"success": [null]}') == (200, {})


@pytest.mark.parametrize(("value", "kind"), [("5", "number"), ("true", "bool"), ('["a"]', "array"), ("{}", "object")])
def test_string_fields_of_another_kind_refused_in_go_s_words(value: str, kind: str) -> None:
    assert post("/v3/auth/role/add", ('{"name": ' + value + "}").encode()) == (
        400, error(f"json: cannot unmarshal {kind} into Go value of type string"))


def test_a_lone_surrogate_escape_is_read_as_go_reads_it() -> None:
    """Go decodes ``\\ud800`` alone as U+FFFD; protobuf refuses the lone surrogate Python keeps."""
    assert post("/v3/auth/role/add", b'{"name": "a\\ud800"}') == (200, {})
