"""The name an ``auth_failures`` entry records for a failed login of a name that does not exist.

Shared by the proxy (proxy/authenticate.py) and the store's own login for sidecars
(authstore/api/login.py): a client's name is bounded only by the request size (1.5 MiB), and
every failure is a log entry, so a long unknown name is recorded by a fixed-size digest.
"""

from __future__ import annotations

import hashlib

#: Bytes of a name that does not exist recorded as they are; a longer one is recorded by digest.
MAX_UNKNOWN_NAME_BYTES = 256


def unknown_name_record(name: str) -> str:
    """Itself when short, else a digest of it: the same name counts together, and a failed guess
    with a huge name costs a small entry. A digest that happens to equal a real user's name only
    adds to that user's count, which guessing does anyway."""
    raw = name.encode()
    if len(raw) <= MAX_UNKNOWN_NAME_BYTES:
        return name
    return "raftgate-sha256:" + hashlib.sha256(raw).hexdigest()
