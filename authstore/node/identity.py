"""This node's member ID, in a file of its data dir that nothing replicated or copied carries.

etcd keeps a member's ID in its WAL's metadata, never in the backend a leader's snapshot
replaces. raftgate kept it in the LMDB store, which a follower swaps whole for the leader's copy:
a restart that found the leader's ID there came up as a second member under that ID, and the
cluster lost its leader. The file is written once, when the node first learns its ID (a new
cluster's member from its URLs, a joiner from the cluster, a restored data dir from
``raftgate snapshot restore``), before anything else of the data dir says it is a member.
"""

from __future__ import annotations

from pathlib import Path

from raftgate.private_files import write_private

FILE_NAME = "member_id"


class IdentityError(Exception):
    """The data dir's member ID file is unreadable."""


def read(data_dir: Path) -> int | None:
    """The member ID recorded in ``data_dir``, or None if none is."""
    path = data_dir / FILE_NAME
    try:
        raw = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise IdentityError(f"cannot read this member's ID from {path}: {exc}") from None
    try:
        member = int(raw, 16)
    except ValueError:
        member = 0
    if not 0 < member < 1 << 64 or len(raw) > 16:
        raise IdentityError(f"{path} does not hold a member ID (16 hex digits): {raw[:40]!r}")
    return member


def write(data_dir: Path, member_id: int) -> None:
    """Records ``member_id`` in ``data_dir`` durably (the file and its name synced)."""
    write_private(data_dir / FILE_NAME, f"{member_id:016x}\n".encode("ascii"))
