"""The gateway's member list names gateway URLs: HTTP clients that discover the cluster find HTTP.

etcd serves gRPC and the JSON gateway on one client URL, so an HTTP client (Patroni's etcd3 DCS,
etcd3gw) may ask ``/v3/cluster/member/list`` and then talk HTTP to each member's ``clientURLs``.
raftgate's client URLs are its member proxies' gRPC ports, which gRPC clients (clientv3's auto-sync,
python-etcd3's failover) must keep finding. So each store node also publishes where its member
proxy serves the gateway (``--advertise-gateway-urls``, kept beside etcd's Member record as the
internal URLs are), and the answers to Cluster requests on the gateway name those as the members'
``clientURLs``; gRPC answers are untouched. No gRPC byte is relayed through HTTP.

A cluster where no member publishes gateway URLs is answered as before (its gRPC client URLs).
Once any member does, a member without them is shown without client URLs (as etcd shows a member
that has not started): an HTTP client skips it rather than sending HTTP to a gRPC port.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

from google.protobuf.message import Message

#: at most this long to hear the member list again when an answer names a member not yet heard of
REFRESH_TIMEOUT = 2.0
#: a member shown with client URLs but no gateway URLs asks for the list again at most this often
REFRESH_INTERVAL = 1.0


class MemberDirectory(Protocol):
    """Where each member's gateway is (proxy/store_client.py's StoreClient)."""

    def gateway_urls(self) -> dict[int, tuple[str, ...]]: ...

    async def refresh_members(self) -> None: ...


class GatewayMembers:
    """Rewrites the ``members`` of Cluster answers for the gateway."""

    def __init__(self, directory: MemberDirectory) -> None:
        self.directory = directory
        self._refreshed = -REFRESH_INTERVAL

    async def rewrite(self, answer: bytes, response_type: type[Message]) -> bytes:
        """``answer`` (a Cluster response's bytes) with each member's clientURLs its gateway URLs."""
        message = response_type.FromString(answer)
        members = getattr(message, "members", None)
        if not members:
            return answer
        table = self.directory.gateway_urls()
        if self._stale(members, table):
            now = time.monotonic()
            if now - self._refreshed >= REFRESH_INTERVAL or any(m.ID not in table for m in members):
                self._refreshed = now
                with contextlib.suppress(Exception):  # unreachable nodes: answer from what is known
                    async with asyncio.timeout(REFRESH_TIMEOUT):
                        await self.directory.refresh_members()
                table = self.directory.gateway_urls()
        if not any(table.values()):
            return answer  # no member serves a gateway: the answer as gRPC gives it
        for member in members:
            del member.clientURLs[:]
            member.clientURLs.extend(table.get(member.ID, ()))
        return message.SerializeToString()

    @staticmethod
    def _stale(members: object, table: dict[int, tuple[str, ...]]) -> bool:
        """A member the list has not heard of, or one that started (it has client URLs) whose
        gateway URLs are not known yet: the member list is asked again."""
        return any(m.ID not in table or (m.clientURLs and not table[m.ID]) for m in members)  # type: ignore[attr-defined]
