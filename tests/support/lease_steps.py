"""etcdctl lease steps shared by the lease tests."""

from __future__ import annotations

import re

from tests.support.ctl_steps import Ctl

LEASE_ID = re.compile(r"^lease ([0-9a-f]{16}) granted with TTL\((\d+)s\)\n$")


def grant(ctl: Ctl, ttl: int, user: str | None = None) -> str:
    _, out, _ = ctl("lease", "grant", str(ttl), user=user, out=None)
    m = LEASE_ID.match(out)
    assert m, out
    return m.group(1)


def present(ctl: Ctl, key: str, user: str | None = None) -> bool:
    rc, out, _ = ctl.raw("get", key, "--print-value-only", user=user)
    assert rc == 0
    return out != ""
