"""A tiny RGB canvas with a 5x7 bitmap font, saved as PNG with zlib (no plotting library needed)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

CHAR_W = 6  # 5 pixels + 1 of spacing, before scaling

_FONT_SRC = {
    "0": "0E 11 13 15 19 11 0E", "1": "04 0C 04 04 04 04 0E", "2": "0E 11 01 02 04 08 1F",
    "3": "1F 02 04 02 01 11 0E", "4": "02 06 0A 12 1F 02 02", "5": "1F 10 1E 01 01 11 0E",
    "6": "06 08 10 1E 11 11 0E", "7": "1F 01 02 04 08 08 08", "8": "0E 11 11 0E 11 11 0E",
    "9": "0E 11 11 0F 01 02 0C", "A": "0E 11 11 11 1F 11 11", "B": "1E 11 11 1E 11 11 1E",
    "C": "0E 11 10 10 10 11 0E", "D": "1C 12 11 11 11 12 1C", "E": "1F 10 10 1E 10 10 1F",
    "F": "1F 10 10 1E 10 10 10", "G": "0E 11 10 17 11 11 0F", "H": "11 11 11 1F 11 11 11",
    "I": "0E 04 04 04 04 04 0E", "J": "07 02 02 02 02 12 0C", "K": "11 12 14 18 14 12 11",
    "L": "10 10 10 10 10 10 1F", "M": "11 1B 15 15 11 11 11", "N": "11 11 19 15 13 11 11",
    "O": "0E 11 11 11 11 11 0E", "P": "1E 11 11 1E 10 10 10", "Q": "0E 11 11 11 15 12 0D",
    "R": "1E 11 11 1E 14 12 11", "S": "0F 10 10 0E 01 01 1E", "T": "1F 04 04 04 04 04 04",
    "U": "11 11 11 11 11 11 0E", "V": "11 11 11 11 11 0A 04", "W": "11 11 11 15 15 15 0A",
    "X": "11 11 0A 04 0A 11 11", "Y": "11 11 11 0A 04 04 04", "Z": "1F 01 02 04 08 10 1F",
    " ": "00 00 00 00 00 00 00", ".": "00 00 00 00 00 0C 0C", ",": "00 00 00 00 0C 04 08",
    ":": "00 0C 0C 00 0C 0C 00", ";": "00 0C 0C 00 0C 04 08", "(": "02 04 08 08 08 04 02",
    ")": "08 04 02 02 02 04 08", "/": "00 01 02 04 08 10 00", "-": "00 00 00 1F 00 00 00",
    "+": "00 04 04 1F 04 04 00", "=": "00 00 1F 00 1F 00 00", "%": "18 19 02 04 08 13 03",
    "·": "00 00 00 04 00 00 00", "÷": "00 04 00 1F 00 04 00", "_": "00 00 00 00 00 00 1F",
    "'": "04 04 08 00 00 00 00", "!": "04 04 04 04 04 00 04", "?": "0E 11 01 02 04 00 04",
    "<": "02 04 08 10 08 04 02", ">": "08 04 02 01 02 04 08", "[": "0E 08 08 08 08 08 0E",
    "]": "0E 02 02 02 02 02 0E", "#": "0A 0A 1F 0A 1F 0A 0A", "*": "00 04 15 0E 15 04 00",
    "—": "00 00 00 1F 00 00 00", "×": "00 11 0A 04 0A 11 00", "@": "0E 11 01 0D 15 15 0E",
}  # fmt: skip
FONT = {ch: [int(x, 16) for x in rows.split()] for ch, rows in _FONT_SRC.items()}
_UNKNOWN = [0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F]


class Image:
    def __init__(self, width: int, height: int, background: tuple[int, int, int]) -> None:
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(background) * width) for _ in range(height)]

    def pixel(self, x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self.rows[y][3 * x : 3 * x + 3] = bytes(colour)

    def rect(self, x: int, y: int, w: int, h: int, colour: tuple[int, int, int]) -> None:
        x1, x2 = max(0, x), min(self.width, x + w)
        if x2 <= x1:
            return
        span = bytes(colour) * (x2 - x1)
        for yy in range(max(0, y), min(self.height, y + h)):
            self.rows[yy][3 * x1 : 3 * x2] = span

    def text(self, x: int, y: int, s: str, colour: tuple[int, int, int], scale: int = 1) -> None:
        for i, ch in enumerate(s.upper()):
            glyph = FONT.get(ch, _UNKNOWN)
            cx = x + i * CHAR_W * scale
            for row, bits in enumerate(glyph):
                for col in range(5):
                    if bits & (0x10 >> col):
                        self.rect(cx + col * scale, y + row * scale, scale, scale, colour)

    def encode(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(r) for r in self.rows)

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        ihdr = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")

    def save(self, path: Path) -> None:
        Path(path).write_bytes(self.encode())
