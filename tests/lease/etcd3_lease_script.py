"""python-etcd3 0.12 lease scenarios against an auth-enabled server; prints one JSON object.

Run as a SUBPROCESS only (etcd3 ships its own copies of etcd's protos) with
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python. Expects test_lease_etcdctl.setup_users: root/rootpw,
alice/pw (READWRITE a/), bob/pw (READWRITE b/, READ a/), carol/pw (nothing).

Usage: etcd3_lease_script.py HOST:PORT
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "clients"))

from etcd3_client import TokenClient, attempt  # noqa: E402


def client(host: str, port: int, user: str | None) -> TokenClient:
    c = TokenClient(host=host, port=port, timeout=10)
    if user:
        c.login(user, "rootpw" if user == "root" else "pw")
    return c


def refresh(c: TokenClient, lease_id: int) -> list[int]:
    return [r.TTL for r in c.refresh_lease(lease_id)]


def main() -> None:
    host, port_s = sys.argv[1].rsplit(":", 1)
    port = int(port_s)
    r: dict[str, Any] = {}
    anon = client(host, port, None)
    alice, bob, carol, root = (client(host, port, u) for u in ("alice", "bob", "carol", "root"))

    r["anon_grant"] = attempt(lambda: anon.lease(60).id)
    lease = alice.lease(60)
    r["alice_grant_ttl"] = attempt(lambda: lease.granted_ttl)
    r["alice_grant_given_id"] = attempt(lambda: alice.lease(60, lease_id=0x4242).id)
    r["alice_put_with_lease"] = attempt(lambda: alice.put("a/e3", "v", lease=lease) and None)
    r["bob_put_with_lease"] = attempt(lambda: bob.put("b/e3", "v", lease=lease) and None)
    r["alice_refresh"] = attempt(lambda: refresh(alice, lease.id))
    r["bob_refresh"] = attempt(lambda: refresh(bob, lease.id))
    r["anon_refresh"] = attempt(lambda: refresh(anon, lease.id))
    r["alice_refresh_unknown"] = attempt(lambda: refresh(alice, 0x999))
    r["bob_info_keys"] = attempt(lambda: [k.decode() for k in bob.get_lease_info(lease.id).keys])
    r["carol_info_keys"] = attempt(lambda: [k.decode() for k in carol.get_lease_info(lease.id).keys])
    r["alice_info_unknown_ttl"] = attempt(lambda: alice.get_lease_info(0x999).TTL)
    r["lease_object_keys"] = attempt(lambda: [k.decode() for k in lease.keys])
    r["lease_object_remaining_ok"] = attempt(lambda: 55 <= lease.remaining_ttl <= 60)
    r["bob_revoke"] = attempt(lambda: bob.revoke_lease(lease.id) and None)
    r["anon_revoke"] = attempt(lambda: anon.revoke_lease(lease.id) and None)
    r["alice_revoke"] = attempt(lambda: alice.revoke_lease(lease.id) and None)
    r["key_after_revoke"] = attempt(lambda: alice.get("a/e3")[0])
    r["root_revoke_given_id"] = attempt(lambda: root.revoke_lease(0x4242) and None)

    short = alice.lease(2)
    alice.put("a/short", "v", lease=short)
    deadline = time.monotonic() + 10
    while alice.get("a/short")[0] is not None and time.monotonic() < deadline:
        time.sleep(0.1)  # polling interval of a condition wait
    r["expired_key"] = attempt(lambda: alice.get("a/short")[0])
    r["expired_info_ttl"] = attempt(lambda: alice.get_lease_info(short.id).TTL)
    for c in (anon, alice, bob, carol, root):
        c.close()
    print(json.dumps(r, sort_keys=True))


if __name__ == "__main__":
    main()
