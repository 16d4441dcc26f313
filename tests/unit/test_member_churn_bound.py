"""The proxy's store connections stay bounded however the member list it is told moves: nodes
that left are closed after a while, and never more than MAX_MEMBERS of them wait to be closed
(a list that changes at every discovery would otherwise open channels faster than they close).

Finding: a member list that changes at every discovery opened store channels faster than they closed
(failed before the fix).
"""

from __future__ import annotations

import asyncio

from protos.storepb import store_pb2
from proxy import store_client
from proxy.store_client import StoreClient


def test_open_channels_stay_bounded_under_member_list_churn() -> None:
    async def run() -> None:
        client = StoreClient(["seed:1"], secret="s")
        try:
            for round_ in range(40):
                members = [store_pb2.StoreMember(id=i + 1, internal_urls=[f"http://n{round_}-{i}:1"])
                           for i in range(store_client.MAX_MEMBERS)]
                client._follow(members)
                open_channels = len(client._endpoints) + len(client._retired)
                assert open_channels <= 2 * store_client.MAX_MEMBERS + 2, (round_, open_channels)
            # odd URLs never become targets: no unix sockets, no other schemes; credentials and
            # paths are dropped (only host:port is dialled), duplicates are one target
            client._follow([store_pb2.StoreMember(id=1, internal_urls=[u]) for u in (
                "unix:///var/run/x.sock", "unix:/tmp/s", "file:///etc/passwd", "http://user:pw@h1:5/some/path?q=1",
                "http://h1:5", "https://h1:5/", "http://[::1]:7", "http://h2:0", "gopher://h3:70")])
            assert sorted(client.targets) == ["[::1]:7", "h1:5", "seed:1"]
        finally:
            await client.close()

    asyncio.run(run())
