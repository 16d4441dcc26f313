"""Reading a small file (a key, a certificate, a secret, a JWKS) with a bound in bytes.

Every file raftgate reads at start-up or on rotation is small; a huge one is a wrong path (a log,
a device), and reading it whole would cost the process its memory. One reader for all of them:
at most ``limit`` bytes are read, and a file with more is refused with a message that names the
file and the bound. Callers put their own flag or prefix in front of the message.
"""

from __future__ import annotations

from pathlib import Path


class FileReadError(ValueError):
    """The file cannot be read, or is larger than the bound; the message names the file, never its content."""


def read_bounded(path: str | Path, limit: int, *, not_blank: bool = False) -> bytes:
    """The file's bytes, if it holds at most ``limit`` of them (exactly ``limit`` is fine); with
    ``not_blank``, a file of only white space is refused too (an unfilled mount, a PEM that is not there)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise FileReadError(f"cannot read {str(path)!r}: {e.strerror or e}") from None
    if len(data) > limit:
        raise FileReadError(f"{str(path)!r} is larger than {limit} bytes")
    if not_blank and not data.strip():
        raise FileReadError(f"{str(path)!r} is empty")
    return data
