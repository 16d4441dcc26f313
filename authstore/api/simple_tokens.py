"""Simple tokens' sliding TTL: resolution, and expiry through the log.

Which tokens exist is replicated state (the auth store, by digest). When each was last used is
not: proxies resolve tokens at the leader, so the leader keeps the last-use times and, once a
token has been idle longer than its TTL, proposes its expiry so every node drops it in log order.
A node that becomes leader has not seen recent uses, so it counts every token as used at that
moment: a token then outlives its TTL by at most one TTL after a failover, and an active session
never dies because the leader changed.

A leader-side service (it reads the clock, runs on the event loop and proposes entries), so it
lives in the API layer; the deterministic state (authstore/state) only applies the expiries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import lmdb

from authstore.state.auth.store import AuthStore, token_digest
from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.storepb import store_pb2 as spb
from raftgate.simple_token import looks_like_simple_token, token_index
from raftgate.token_verifier import Verified

log = logging.getLogger("raftgate.store.tokens")

TOKEN_WAIT_SECONDS = 5.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class SimpleTokens:
    def __init__(self, env: Callable[[], lmdb.Environment], auth: Callable[[], AuthStore],
                 propose: Callable[[bytes], Awaitable[object]], wait_applied: Callable[[int], Awaitable[None]],
                 last_index: Callable[[], int], caught_up: Callable[[], Awaitable[None]]) -> None:
        """``caught_up``: returns once everything the node knows to be committed is applied
        (``RaftNode.caught_up``)."""
        self._env = env
        self._auth = auth
        self._propose = propose
        self._wait_applied = wait_applied
        self._last_index = last_index
        self._caught_up = caught_up
        self._last_used: dict[bytes, int] = {}
        self._grace_from = 0
        self._expiring: set[asyncio.Task[None]] = set()

    def became_leader(self) -> None:
        self._grace_from = now_ms()

    async def resolve(self, token: str) -> spb.ResolveTokenResponse:
        """Waits until the entry that issued the token is applied here, then looks it up.

        First waits (as long as for the issuing entry) until everything this node knows to be
        committed is applied: the proxy, refused as `auth store is old` by a node that applied an
        auth change, resolves here again and retries once, and must get a revision no older than
        that node's (an auth change is answered before its commit, and followers apply it as soon
        as they learn the commit index, before this node's apply may have reached it)."""
        with contextlib.suppress(Exception):  # a stuck apply: answer from the state as it is
            async with asyncio.timeout(TOKEN_WAIT_SECONDS):
                await self._caught_up()
        resp = spb.ResolveTokenResponse()
        index = token_index(token)
        if index is not None and index <= self._last_index():
            try:
                async with asyncio.timeout(TOKEN_WAIT_SECONDS):
                    await self._wait_applied(index)
            except (TimeoutError, Exception):
                index = None
        else:
            index = None
        with self._env().begin() as txn:
            auth = self._auth()
            resp.auth_enabled = auth.is_enabled(txn)
            resp.auth_revision = auth.revision(txn)
            found = auth.lookup_token(txn, token) if index is not None else None
        if found is None:
            return resp
        username, issued_at, ttl_seconds = found
        digest = token_digest(token)
        now = now_ms()
        if now - self._last_use(digest, issued_at) <= ttl_seconds * 1000:
            self._last_used[digest] = now
            resp.valid = True
            resp.username = username
        else:
            self._expire_soon([digest])
        return resp

    def _last_use(self, digest: bytes, issued_at: int) -> int:
        return max(self._last_used.get(digest, issued_at), self._grace_from)

    def _expire_soon(self, digests: list[bytes]) -> None:
        for d in digests:
            self._last_used.pop(d, None)
        task = asyncio.get_running_loop().create_task(self._expire(digests))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)

    async def _expire(self, digests: list[bytes]) -> None:
        req = ipb.InternalRaftRequest(expire_tokens=ipb.ExpireTokensRequest(token_digests=digests))
        try:
            await self._propose(req.SerializeToString())
        except Exception:  # best effort: an expired token is refused either way, and swept again
            log.warning("could not record %d expired tokens", len(digests))

    async def sweep(self, is_leader: Callable[[], bool], interval: float = 1.0) -> None:
        """On the leader, proposes the expiry of every token idle for longer than its TTL."""
        while True:
            await asyncio.sleep(interval)
            if not is_leader():
                continue
            now = now_ms()
            with self._env().begin() as txn:
                expired = [d for d, (_, issued, ttl) in self._auth().list_tokens(txn)
                           if now - self._last_use(d, issued) > ttl * 1000]
            if expired:
                self._expire_soon(expired)


class StoreSimpleTokens:
    """Simple tokens, verified by the store that holds them (the TokenVerifier of that kind)."""

    def __init__(self, tokens: SimpleTokens) -> None:
        self._tokens = tokens

    def recognizes(self, token: str) -> bool:
        return looks_like_simple_token(token)

    async def verify(self, token: str) -> Verified | None:
        answer = await self._tokens.resolve(token)
        if not answer.valid:
            return None
        return Verified(answer.username, answer.auth_revision, revocable=True)
