"""A hand-made HTTP/2 client on a plain socket, for clients no gRPC library would be: one that
stops reading its socket (a stuck reader: the server's writes fill the kernel's buffers), one
that sends a header block past every limit, one that never finishes its preface.

Frames as RFC 9113 lays them out, headers as HPACK literals without Huffman coding (RFC 7541
6.2.2), gRPC messages with their 5-byte prefix. Only what these tests send; nothing is parsed
beyond the frame headers of what the server answers.
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x0, 0x1, 0x4, 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE = 0x4
MAX_WINDOW = 2**31 - 1


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _integer(value: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = bytearray([limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[str, str | bytes]]) -> bytes:
    """HPACK: every header a literal without indexing, new name, no Huffman."""
    out = bytearray()
    for name, value in headers:
        raw = value.encode() if isinstance(value, str) else value
        out += b"\x00" + _integer(len(name)) + name.encode() + _integer(len(raw)) + raw
    return bytes(out)


def grpc_headers(path: str, authority: str, extra: list[tuple[str, str | bytes]] = ()) -> list[tuple[str, str | bytes]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", authority),
            ("content-type", "application/grpc"), ("te", "trailers"), *extra]


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(payload)) + payload


class RawH2:
    """One HTTP/2 connection to ``host:port``; streams are opened with :meth:`call`."""

    def __init__(self, host: str, port: int, *, rcvbuf: int | None = None, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connect: the window the kernel offers the server
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.authority = f"{host}:{port}"
        self.next_stream = 1

    def handshake(self, *, window: int = MAX_WINDOW) -> None:
        """Preface, our SETTINGS (a stream window of ``window``) and the connection's window opened
        as far; reads the server's first frames and acknowledges its SETTINGS."""
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, window))
                          + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535)))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            kind, flags, _, _ = self.read_frame()
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0, b""))
                return
        raise AssertionError("the server sent no SETTINGS")

    def prove(self, secret: bytes, role: str = "internal") -> list[tuple[str, str | bytes]]:
        """A store port's secret proof (raftgate/secret_proof.py) for calls on this connection:
        its Challenge asked and answered here, as a proxy does."""
        from protos.storepb import store_pb2
        from raftgate.secret_proof import CHALLENGE_METHODS, proof_metadata

        answer = store_pb2.ChallengeResponse.FromString(self.read_message(self.call(CHALLENGE_METHODS[role], b"")))
        return list(proof_metadata(secret, role, answer.member_id, answer.nonce))

    def read_frame(self) -> tuple[int, int, int, bytes]:
        head = self._exactly(9)
        length = int.from_bytes(head[:3], "big")
        return head[3], head[4], int.from_bytes(head[5:9], "big") & MAX_WINDOW, self._exactly(length)

    def read_message(self, stream: int, timeout: float = 10.0) -> bytes:
        """The first gRPC message the server sends on ``stream`` (other frames skipped, its PINGs
        and SETTINGS acknowledged)."""
        data = bytearray()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kind, flags, sid, payload = self.read_frame()
            if kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0, b""))
            elif kind == DATA and sid == stream:
                data += payload
                if len(data) >= 5 and len(data) >= 5 + int.from_bytes(data[1:5], "big"):
                    return bytes(data[5:5 + int.from_bytes(data[1:5], "big")])
            elif kind == HEADERS and sid == stream and flags & END_STREAM:
                raise AssertionError(f"stream {stream} ended without a message: {payload!r}")
        raise TimeoutError(f"no message on stream {stream} in {timeout}s")

    def _exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, path: str, request: bytes, *, end_stream: bool = True,
             extra: list[tuple[str, str | bytes]] = ()) -> int:
        """Opens a stream and sends one gRPC message on it (ending our side with ``end_stream``)."""
        stream = self.next_stream
        self.next_stream += 2
        block = header_block(grpc_headers(path, self.authority, extra))
        self.sock.sendall(frame(HEADERS, END_HEADERS, stream, block)
                          + frame(DATA, END_STREAM if end_stream else 0, stream, grpc_message(request)))
        return stream

    def pending_at_server(self) -> int:
        """Bytes the server has written to this connection that its kernel still holds (the
        send queue of the server's end, from /proc/net/tcp): above 0, the server's writes wait on
        this client."""
        ours = self.sock.getsockname()[1]
        server = self.sock.getpeername()[1]
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if (int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)) == (server, ours):
                    return int(fields[4].split(":")[0], 16)
        return 0

    def close(self) -> None:
        self.sock.close()
