"""This node's member ID, in a file of its data dir that nothing replicated or copied carries.

etcd keeps a member's ID in its WAL's metadata, never in the backend a leader's snapshot
replaces. raftgate kept it in the LMDB store, which a follower swaps whole for the leader's copy:
a restart that found the leader's ID there came up as a second member under that ID, and the
cluster lost its leader. The file is written once, when the node first learns its ID (a new
cluster's member from its URLs, a joiner from the cluster, a restored data dir from
``raftgate snapshot restore``), before anything else of the data dir says it is a member.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from raftgate.private_files import write_private

FILE_NAME = "member_id"
#: more than any ID written here takes (16 hex digits and a newline): a longer file is not one
_MAX_READ = 64
_HEX = frozenset("0123456789abcdefABCDEF")


class IdentityError(Exception):
    """The data dir's member ID file is unreadable."""


def read(data_dir: Path) -> int | None:
    """The member ID recorded in ``data_dir``, or None if none is.

    Only a regular file is read, and only as much of it as an ID takes: a FIFO would block the
    start until something wrote to it, and a link to a device would be read without end."""
    path = data_dir / FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"cannot read this member's ID from {path}: {exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise IdentityError(f"{path} is not a regular file: it must hold this member's ID (16 hex digits)")
        data = os.read(fd, _MAX_READ + 1)
        raw = data.decode("ascii").strip()
    except OSError as exc:
        raise IdentityError(f"cannot read this member's ID from {path}: {exc}") from None
    except UnicodeDecodeError:
        raw = "?"
    finally:
        os.close(fd)
    hex_digits = len(data) <= _MAX_READ and 0 < len(raw) <= 16 and all(c in _HEX for c in raw)
    member = int(raw, 16) if hex_digits else 0  # never int()'s wider syntax ("0x", "_", a sign)
    if not 0 < member < 1 << 64:
        raise IdentityError(f"{path} does not hold a member ID (16 hex digits): {raw[:40]!r}")
    return member


def write(data_dir: Path, member_id: int) -> None:
    """Records ``member_id`` in ``data_dir`` durably (the file and its name synced)."""
    write_private(data_dir / FILE_NAME, f"{member_id:016x}\n".encode("ascii"))
