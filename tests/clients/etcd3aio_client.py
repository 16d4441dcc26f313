"""etcd3aio (asyncio client) against an auth-enabled server; prints one JSON object of observations.

Run as a SUBPROCESS (it ships its own copies of etcd's protos).

Usage: etcd3aio_client.py HOST:PORT basic
       etcd3aio_client.py HOST:PORT ttl TTL_SECONDS
Expects the upstream fixture (root/rootpw; test-user/pass with READWRITE on `foo`) plus READWRITE on
the prefix `/cli/` for test-user.

`ttl` mode is the simple-token sliding-TTL check (reference §4.2, §11.10): one long-lived client keeps
its token alive by using it more often than the TTL, then stays idle for longer than the TTL (a real
wait: expiry is a matter of elapsed time) and observes `invalid auth token`, then re-authenticates.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from etcd3aio import Etcd3Client, prefix_range_end
from etcd3aio.kv import KVService


def rpc_error(exc: BaseException) -> dict[str, Any]:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, grpc.aio.AioRpcError):
            return {"code": seen.code().name, "details": seen.details()}
        seen = seen.__cause__ or seen.__context__
    return {"code": type(exc).__name__, "details": str(exc)}


async def attempt(fn: Callable[[], Awaitable[Any]], conv: Callable[[Any], Any] = lambda r: None) -> dict[str, Any]:
    try:
        return {"ok": conv(await fn())}
    except Exception as exc:  # noqa: BLE001 - every outcome is data for the asserting test
        return {"error": rpc_error(exc)}


def kvs(resp: Any) -> list[list[str]]:
    return [[kv.key.decode(), kv.value.decode()] for kv in resp.kvs]


async def basic(endpoint: str) -> dict[str, Any]:
    r: dict[str, Any] = {}
    async with Etcd3Client([endpoint], rpc_max_attempts=1) as anon:
        r["anon_get"] = await attempt(lambda: anon.kv.get("foo"), kvs)
        r["anon_auth_status"] = await attempt(lambda: anon.auth.auth_status(), lambda s: s.enabled)
        r["bad_password"] = await attempt(lambda: anon.auth.authenticate("test-user", "wrong"))
        r["unknown_user"] = await attempt(lambda: anon.auth.authenticate("nobody", "pass"))
        anon.set_token("bogus.token")
        r["bogus_token_get"] = await attempt(lambda: anon.kv.get("foo"), kvs)

    async with Etcd3Client([endpoint], rpc_max_attempts=1) as c:
        tok = await c.auth.authenticate("test-user", "pass")
        c.set_token(tok.token)
        r["put_a"] = await attempt(lambda: c.kv.put("/cli/aio/a", "1"))
        r["put_b"] = await attempt(lambda: c.kv.put("/cli/aio/b", "2", prev_kv=True), lambda p: p.HasField("prev_kv"))
        r["get_a"] = await attempt(lambda: c.kv.get("/cli/aio/a"), kvs)
        r["get_prefix"] = await attempt(lambda: c.kv.get("/cli/aio/", prefix_range_end("/cli/aio/")), kvs)
        r["get_from_key_denied"] = await attempt(lambda: c.kv.get("/cli/aio/", "\0"), kvs)
        r["put_denied"] = await attempt(lambda: c.kv.put("hoo", "x"))
        r["get_denied"] = await attempt(lambda: c.kv.get("hoo"), kvs)
        r["delete_range_denied"] = await attempt(lambda: c.kv.delete("/cli/aio/", "/cm"))
        r["txn_success"] = await attempt(
            lambda: c.kv.txn(
                [KVService.txn_compare_value("/cli/aio/a", "1")],
                [KVService.txn_op_put("/cli/aio/c", "3")],
                [KVService.txn_op_get("/cli/aio/b")],
            ),
            lambda t: t.succeeded,
        )
        r["txn_denied_failure_branch"] = await attempt(
            lambda: c.kv.txn(
                [KVService.txn_compare_value("/cli/aio/a", "1")],
                [KVService.txn_op_put("/cli/aio/d", "4")],
                [KVService.txn_op_delete("hoo")],
            ),
            lambda t: t.succeeded,
        )
        r["get_d"] = await attempt(lambda: c.kv.get("/cli/aio/d"), kvs)
        r["delete_b"] = await attempt(lambda: c.kv.delete("/cli/aio/b"), lambda d: d.deleted)
        r["user_list_denied"] = await attempt(lambda: c.auth.user_list(), lambda u: list(u.users))
        r["user_get_self"] = await attempt(lambda: c.auth.user_get("test-user"), lambda u: list(u.roles))
        r["status"] = await attempt(lambda: c.maintenance.status(), lambda s: bool(s.version))
        r["defrag_denied"] = await attempt(lambda: c.maintenance.defragment())
        r["auth_status"] = await attempt(lambda: c.auth.auth_status(), lambda s: s.enabled)
        r["compact_denied"] = await attempt(lambda: c.kv.compact(1))
        r["lease_grant"] = await attempt(lambda: c.lease.grant(ttl=60), lambda g: g.TTL)

    async with Etcd3Client([endpoint], rpc_max_attempts=1) as root:
        tok = await root.auth.authenticate("root", "rootpw")
        root.set_token(tok.token)
        r["root_user_list_has_test_user"] = await attempt(
            lambda: root.auth.user_list(), lambda u: "test-user" in u.users
        )
        r["root_get_prefix"] = await attempt(lambda: root.kv.get("/cli/aio/", prefix_range_end("/cli/aio/")), kvs)
    return r


async def ttl_mode(endpoint: str, ttl: float) -> dict[str, Any]:
    r: dict[str, Any] = {}
    async with Etcd3Client([endpoint], rpc_max_attempts=1) as c:
        tok = await c.auth.authenticate("test-user", "pass")
        c.set_token(tok.token)
        start = time.monotonic()
        uses = []
        # Use the token every ttl/4 for 2*ttl: a sliding TTL keeps it valid throughout.
        while time.monotonic() - start < 2 * ttl:
            uses.append(await attempt(lambda: c.kv.put("/cli/ttl/k", "v")))
            await asyncio.sleep(ttl / 4)
        r["active_uses_ok"] = all("ok" in u for u in uses)
        r["active_uses"] = len(uses)
        r["active_first_error"] = next((u["error"] for u in uses if "error" in u), None)
        # Idle for longer than the TTL plus etcd's 1 s sweep resolution.
        await asyncio.sleep(ttl + 1.5)
        r["after_idle"] = await attempt(lambda: c.kv.put("/cli/ttl/k", "v"))
        tok = await c.auth.authenticate("test-user", "pass")
        c.set_token(tok.token)
        r["after_reauth"] = await attempt(lambda: c.kv.put("/cli/ttl/k", "v2"))
    return r


def main() -> None:
    endpoint, mode = sys.argv[1], sys.argv[2]
    coro = basic(endpoint) if mode == "basic" else ttl_mode(endpoint, float(sys.argv[3]))
    out = asyncio.run(coro)
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
