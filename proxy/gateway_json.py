"""JSON as etcd's gateway reads and writes it: Go's encoding/json and grpc-gateway's jsonpb, in Python.

Decoding: a request body's JSON values (one, or a stream of them for a streaming method) become
the protobuf bytes of the request message, with every check Go makes and Go's wording when one
fails (``JsonError``; the gateway answers it as gRPC's InvalidArgument). Encoding: an answer
message becomes JSON as etcd 3.5's gateway writes it (proto field names, int64 as strings, bytes
as base64, defaults left out, ``<``, ``>`` and ``&`` escaped). No HTTP and no gRPC status here:
proxy/gateway.py serves, proxy/gateway_errors.py words the errors.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import re
import string
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

JSON_TYPE = "application/json"
READ_CHUNK = 64 * 1024
_BASE64_ALPHABET = frozenset(string.ascii_letters + string.digits + "+/")


class JsonError(Exception):
    """A request Go's decoder refuses; the text is Go's wording (grpc-gateway answers InvalidArgument)."""


class TooLarge(Exception):
    """One streamed request value over the body bound (``limit`` bytes)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"a request over {limit} bytes")
        self.limit = limit


class _Number(float):
    """A JSON number that is not an integer Python holds exactly (a fraction, an exponent, or more
    digits than ``int()`` takes): its text is kept, for Go's refusal that quotes it."""

    text: str

    def __new__(cls, text: str) -> _Number:
        try:
            value = float(text)
        except (ValueError, OverflowError):
            value = float("inf")
        number = super().__new__(cls, value)
        number.text = text
        return number


def _parse_int(text: str) -> int | _Number:
    return int(text) if len(text) <= _INT_DIGITS else _Number(text)


_INT_DIGITS = 1000  # far above any int64 and below int()'s own limit (4300 digits)
_DECODER = json.JSONDecoder(parse_float=_Number, parse_int=_parse_int)
#: encoding/json's maxNestingDepth: one more level is refused as "exceeded max depth"
GO_MAX_DEPTH = 10000
_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _raw_decode(text: str, start: int = 0) -> tuple[Any, int]:
    """The JSON value at ``text[start]`` and where it ends. Nesting deeper than Python's recursion
    allows is decoded anyway up to Go's depth, and refused past it in Go's words (never a
    RecursionError, which would be an internal error)."""
    try:
        return _DECODER.raw_decode(text, start)
    except RecursionError:
        pass
    depth = 0
    for match in _NESTING.finditer(text, start):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > GO_MAX_DEPTH:
                raise JsonError(f"invalid character {_quote_char(token)} exceeded max depth")
        elif token in "]}":
            depth -= 1
            if depth <= 0:
                break
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 2 * GO_MAX_DEPTH)  # the C decoder takes one level per nesting level
    try:
        return _DECODER.raw_decode(text, start)
    finally:
        sys.setrecursionlimit(limit)


def _quote_char(ch: str) -> str:
    """Go's quoteChar: a character as encoding/json's syntax errors quote it (strconv.Quote's escapes)."""
    if ch == "'":
        return "'\\''"
    if ch == '"':
        return "'\"'"
    if ch in _GO_CHAR_ESCAPES:
        return "'" + _GO_CHAR_ESCAPES[ch] + "'"
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"'\\x{ord(ch):02x}'"
    if not ch.isprintable():
        return f"'\\u{ord(ch):04x}'" if ord(ch) <= 0xFFFF else f"'\\U{ord(ch):08x}'"
    return f"'{ch}'"


_GO_CHAR_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                    "\v": "\\v", "\\": "\\\\"}



def to_json(message: Message) -> dict[str, Any]:
    """etcd's gateway output (JSONPb{OrigName: true}): proto names, int64 as strings, defaults left out."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def dumps(value: Any) -> bytes:
    """Compact JSON as Go's encoding/json writes it: UTF-8 as is, and <, >, &, U+2028, U+2029
    escaped (outside strings JSON has none of them, so replacing them all is safe)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_GO_ESCAPES).encode("utf-8", errors="replace")


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                             "\u2029": "\\u2029"})


def parse_request(request_type: type[Message], value: Any) -> bytes:
    """One JSON request object -> the request message's bytes; a bad one is JsonError (grpc-gateway
    answers a body it cannot decode with InvalidArgument). ``null`` is an empty request, as in Go."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise JsonError(f"json: cannot unmarshal {_json_kind(value)} into Go value of type "
                                         f"map[string]json.RawMessage")
    message = request_type()
    try:
        json_format.ParseDict(_checked(value, message.DESCRIPTOR), message)
    except (json_format.ParseError, ValueError, TypeError) as e:
        raise JsonError(str(e)) from None
    except RecursionError:  # json_format stops at 100 levels; this is a safety net
        raise JsonError("Message too deep") from None
    return message.SerializeToString()


def _checked(value: dict[str, Any], descriptor: Any, depth: int = 0) -> dict[str, Any]:
    """``value`` without the keys the message does not have (grpc-gateway ignores them), with its
    bytes, bool, integer and enum fields checked as Go decodes them: json_format would take bad
    base64 silently. Past json_format's own depth limit the rest is left to its refusal."""
    fields: dict[str, Any] = {}
    for f in descriptor.fields:
        fields[f.name] = f
        fields[f.json_name] = f
    out: dict[str, Any] = {}
    for key, item in value.items():
        f = fields.get(key)
        if f is None:
            continue
        repeated = f.is_repeated
        message = f.type == FieldDescriptor.TYPE_MESSAGE
        if repeated and item is not None and not isinstance(item, list):
            raise JsonError(f"json: cannot unmarshal {_json_kind(item)} into Go value of type "
                                            f"[]json.RawMessage")
        items = item if repeated and isinstance(item, list) else [item]
        checked = []
        for one in items:
            if message and one is None and repeated:
                one = {}  # Go: a null in a list of messages is an empty message
            if message and one is not None and not isinstance(one, dict):
                raise JsonError(f"json: cannot unmarshal {_json_kind(one)} into Go value of type "
                                                f"map[string]json.RawMessage")
            if one is not None and f.type == FieldDescriptor.TYPE_BYTES:
                _check_base64(one)
            elif one is not None and f.type == FieldDescriptor.TYPE_STRING:
                if not isinstance(one, str):
                    raise JsonError(f"json: cannot unmarshal {_json_kind(one)} into Go value of type string")
                one = _SURROGATE.sub("\ufffd", one)  # Go reads a lone surrogate escape as U+FFFD
            elif one is not None and f.type == FieldDescriptor.TYPE_BOOL and not isinstance(one, bool):
                raise JsonError(f"json: cannot unmarshal {_json_kind(one)} into Go value of type bool")
            elif one is not None and f.type in _GO_INT:
                one = _check_int(one, _GO_INT[f.type])
                if one is None:  # a quoted null: the field keeps its zero value, as in Go
                    continue
            elif one is not None and not isinstance(one, str) and f.type == FieldDescriptor.TYPE_ENUM:
                one = _check_int(one, "protoreflect.EnumNumber")  # a number: any int32, as in Go
            elif isinstance(one, str) and f.type == FieldDescriptor.TYPE_ENUM and one not in f.enum_type.values_by_name:
                raise JsonError(f"unknown value {json.dumps(json.dumps(one))} for enum "
                                                f"{f.enum_type.full_name}")
            elif isinstance(one, dict) and message and depth < _CHECK_DEPTH:
                one = _checked(one, f.message_type, depth + 1)
            checked.append(one)
        if repeated and isinstance(item, list):
            out[key] = checked
        elif checked:
            out[key] = checked[0]
    return out


_CHECK_DEPTH = 100  # json_format.ParseDict's max_recursion_depth
_SURROGATE = re.compile("[\ud800-\udfff]")  # alone: the decoder joins a pair into one character


_GO_INT = {FieldDescriptor.TYPE_INT64: "int64", FieldDescriptor.TYPE_UINT64: "uint64",
           FieldDescriptor.TYPE_INT32: "int32", FieldDescriptor.TYPE_UINT32: "uint32"}
_GO_RANGE = {"int64": (-(1 << 63), (1 << 63) - 1), "uint64": (0, (1 << 64) - 1),
             "int32": (-(1 << 31), (1 << 31) - 1), "uint32": (0, (1 << 32) - 1),
             "protoreflect.EnumNumber": (-(1 << 31), (1 << 31) - 1)}
_INTEGER = re.compile(r"-?[0-9]+")
_DIGITS = frozenset(string.digits)
_SPACE = " \t\r\n"


def _check_int(value: Any, go_type: str) -> int | None:
    """An integer field as Go's jsonpb reads it: a number, or a string whose text is read as JSON
    (``" 5"`` is 5, ``"null"`` leaves the field unset). The value for json_format, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise JsonError(f"json: cannot unmarshal {_json_kind(value)} into Go value of type {go_type}")
    if isinstance(value, str):
        token = _go_number(json.dumps(value, ensure_ascii=False)[1:-1], go_type)
        if token is None:
            return None
    else:
        token = value.text if isinstance(value, _Number) else repr(value) if isinstance(value, float) else str(value)
    low, high = _GO_RANGE[go_type]
    if not _INTEGER.fullmatch(token) or len(token) > 21 or not low <= int(token) <= high:
        raise JsonError(f"json: cannot unmarshal number {token} into Go value of type {go_type}")
    return int(token)


def _go_number(raw: str, go_type: str) -> str | None:
    """The number token in a quoted integer's text, scanned as Go scans it (the closing quote
    read as a space), or None for ``null``; Go's syntax error otherwise."""
    text = raw + " "
    i = len(text) - len(text.lstrip(_SPACE))
    if i == len(text):
        raise JsonError("unexpected end of JSON input")

    def bad(at: int, context: str) -> JsonError:
        return JsonError(f"invalid character {_quote_char(text[at])} {context}")

    def digits(at: int) -> int:
        while text[at] in _DIGITS:
            at += 1
        return at

    start = i
    if text[i] != "-" and text[i] not in _DIGITS:
        word = text[i:].rstrip(_SPACE)
        if word == "null":
            return None
        if word in ("true", "false"):
            raise JsonError(f"json: cannot unmarshal bool into Go value of type {go_type}")
        raise bad(i, "looking for beginning of value")
    if text[i] == "-":
        i += 1
        if text[i] not in _DIGITS:
            raise bad(i, "in numeric literal")
    i = i + 1 if text[i] == "0" else digits(i)
    if text[i] == ".":
        i += 1
        if text[i] not in _DIGITS:
            raise bad(i, "after decimal point in numeric literal")
        i = digits(i)
    if text[i] in "eE":
        i += 1
        if text[i] in "+-":
            i += 1
        if text[i] not in _DIGITS:
            raise bad(i, "in exponent of numeric literal")
        i = digits(i)
    token = text[start:i]
    rest = text[i:].lstrip(_SPACE)
    if rest:
        raise bad(len(text) - len(rest), "after top-level value")
    return token


def _json_kind(value: Any) -> str:
    """encoding/json's name for a JSON value's kind, for its ``cannot unmarshal`` errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


def _check_base64(value: Any) -> None:
    """Go's base64.StdEncoding, which etcd's gateway decodes bytes fields with (errors as Go words them)."""
    if not isinstance(value, str):
        raise JsonError(f"json: cannot unmarshal {_json_kind(value)} into Go value of type []uint8")
    text = value.replace("\r", "").replace("\n", "")
    try:
        base64.b64decode(text, validate=True)
        return
    except (binascii.Error, ValueError):
        pass
    bad = next((i for i, ch in enumerate(text) if ch not in _BASE64_ALPHABET), None)
    if bad is None or text[bad] == "=":
        bad = min(bad if bad is not None else len(text), len(text) // 4 * 4)
    raise JsonError(f"illegal base64 data at input byte {bad}")


#: Python's reasons -> encoding/json's wording (what etcd's gateway answers for a body that is not JSON)
_GO_SYNTAX = {
    "Expecting value": "looking for beginning of value",
    "Expecting property name enclosed in double quotes": "looking for beginning of object key string",
    "Expecting ':' delimiter": "after object key",
    "Expecting ',' delimiter": "after object key:value pair",
    "Invalid control character at": "in string literal",
}


def first_value(raw: bytes) -> Any:
    """The first JSON value of a body (Go's json.Decoder reads no further); an empty body is an
    empty request (grpc-gateway)."""
    text = raw.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        return {}
    try:
        return _raw_decode(text)[0]
    except json.JSONDecodeError as e:
        raise JsonError(go_json_error(e)) from None


def go_json_error(error: json.JSONDecodeError) -> str:
    """A JSON syntax error as Go's encoding/json words it (``invalid character 'x' ...``)."""
    if error.pos >= len(error.doc):
        return "unexpected EOF"
    if error.msg == "Invalid \\escape" and error.pos + 1 < len(error.doc):
        return f"invalid character {_quote_char(error.doc[error.pos + 1])} in string escape code"
    char = _quote_char(error.doc[error.pos])
    context = _GO_SYNTAX.get(error.msg, "looking for beginning of value")
    if error.msg == "Expecting ',' delimiter" and error.doc.lstrip().startswith("["):
        context = "after array element"
    return f"invalid character {char} {context}"



class JsonValues:
    """The request body as a stream of JSON values, each handed on as soon as it is complete.

    A syntax error raises JsonError (Go's wording) as soon as it is certain; one value may be at
    most the body bound (else TooLarge). The body may come a few bytes at a time: a value is decoded when it starts,
    when a scan of the new text alone finds its end, and when it has doubled since the last try
    (so a syntax error is still found early), never whole again on every chunk (that was O(n^2)).
    """

    def __init__(self, read: Callable[[int], Awaitable[bytes]], limit: int) -> None:
        self.read = read  # the body's next bytes, at most that many (b"" at its end)
        self.limit = limit
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pieces: list[str] = []  # the text; the current value starts at ``offset`` in the first
        self.offset = 0
        self.size = 0  # characters from ``offset`` on
        self.eof = False
        self.scan = _EndScan()
        self.tried: int | None = None  # the size at the last try for this value (None: not tried)

    async def next(self) -> tuple[bool, Any]:
        """(True, value), or (False, None) at the end of the body."""
        while True:
            if self.eof or self.tried is None or self.scan.ended or self.size >= 2 * self.tried:
                text = self.pieces[0] if len(self.pieces) == 1 else "".join(self.pieces)
                self.pieces = [text]
                begin = _NOT_WS.search(text, self.offset)
                if begin is not None:
                    self.offset = begin.start()
                    self.size = len(text) - self.offset
                    try:
                        value, end = _raw_decode(text, self.offset)
                    except json.JSONDecodeError as e:
                        if self.eof or not _incomplete(e, text):
                            raise JsonError(go_json_error(e)) from None
                        self.tried, self.scan.ended = self.size, False
                    else:
                        self._start(text, end)
                        return True, value
                elif self.eof:
                    return False, None
                else:
                    self.pieces, self.offset, self.size = [], 0, 0
            if self.size > self.limit:
                raise TooLarge(self.limit)
            chunk = await self.read(READ_CHUNK)
            self.eof = not chunk
            piece = self.utf8.decode(chunk, final=self.eof)
            if piece:
                self.pieces.append(piece)
                self.size += len(piece)
                self.scan.feed(piece)

    def _start(self, text: str, at: int) -> None:
        """A new value begins at ``text[at]`` (what followed the last one, not copied)."""
        self.pieces, self.offset, self.size = [text], at, len(text) - at
        self.scan, self.tried = _EndScan(), None
        self.scan.feed(text, at)


_NOT_WS = re.compile(r"[^ \t\r\n]")
_STRUCTURE = re.compile(r'["\[\]{}]')
_IN_STRING = re.compile(r'["\\]')
_DELIMITER = re.compile(r"[^0-9A-Za-z.+\-]")


class _EndScan:
    """Whether the JSON value fed so far may have ended: nesting and strings followed over each new
    piece alone (regex searches, nothing rescanned). Only a hint: the decoder has the last word."""

    def __init__(self) -> None:
        self.kind = ""  # "" (nothing yet), "{" (object or array), '"' (string), "x" (number, literal)
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.ended = False

    def feed(self, piece: str, i: int = 0) -> None:
        if self.ended:
            return
        n = len(piece)
        if not self.kind:
            begin = _NOT_WS.search(piece, i)
            if begin is None:
                return
            i = begin.start()
            first = piece[i]
            i += 1
            self.kind = "{" if first in "{[" else first if first == '"' else "x"
            self.depth, self.in_string = (1, False) if self.kind == "{" else (0, self.kind == '"')
        if self.kind == "x":
            self.ended = _DELIMITER.search(piece, i) is not None
            return
        while i < n:
            if self.in_string:
                if self.escaped:
                    self.escaped, i = False, i + 1
                    continue
                match = _IN_STRING.search(piece, i)
                if match is None:
                    return
                i = match.end()
                if match.group() == "\\":
                    self.escaped = True
                    continue
                self.in_string = False
                if self.kind == '"':
                    self.ended = True
                    return
                continue
            match = _STRUCTURE.search(piece, i)
            if match is None:
                return
            i = match.end()
            token = match.group()
            if token == '"':
                self.in_string = True
            elif token in "[{":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    self.ended = True
                    return


def _incomplete(error: json.JSONDecodeError, text: str) -> bool:
    """Whether more input could still make ``text`` a JSON value (else the error is final)."""
    if error.pos >= len(text) or error.msg.startswith("Unterminated string"):
        return True
    rest = text[error.pos:]
    return any(word.startswith(rest) for word in ("true", "false", "null")) or rest in ("-",)

