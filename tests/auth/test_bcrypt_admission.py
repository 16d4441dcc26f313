"""Trust item 6: an anonymous Authenticate flood neither starves root's password administration
nor lets one peer take every place in the password-check queue.

bcrypt is slow on purpose, so its queue is bounded (``too many requests`` beyond it). The flood
here is held inside bcrypt (every check blocks until the test lets go), so the queue stays full
for as long as the test needs, without sleeps:

* root's UserAdd and UserChangePassword (hashing) are still served, while the checks are stuck;
* an Authenticate from another peer (a Unix socket client here) is still admitted to the queue
  (the flood's newest waiting check is refused to make room), and gets its answer once the checks
  run again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest

from protos.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from protos.storepb import store_pb2_grpc
from proxy import config as proxy_config
from proxy import passwords
from proxy.server import ProxyServer
from raftgate.errors import Err
from tests.support.fake_store import SECRET, FakeStore, fake_store_server, login, md
from tests.support.processes import wait_for

FLOOD = 24


def _run(tmp_path: Path, scenario: Callable[[FakeStore, grpc.aio.Channel, grpc.aio.Channel, ProxyServer],
                                            Awaitable[None]]) -> None:
    """The proxy in front of a fake store, listening on TCP and on a Unix socket (two peers)."""
    sock = tmp_path / "proxy.sock"

    async def main() -> None:
        fake = FakeStore()
        store_server = fake_store_server()
        store_pb2_grpc.add_StoreServicer_to_server(fake, store_server)
        store_port = store_server.add_insecure_port("127.0.0.1:0")
        await store_server.start()
        secret_file = tmp_path / "secret"
        secret_file.write_text(SECRET + "\n")
        cfg = proxy_config.load([f"--listen-client-urls=http://127.0.0.1:0,unix://{sock}",
                                 f"--store-endpoints=127.0.0.1:{store_port}",
                                 f"--internal-secret-file={secret_file}", "--bcrypt-cost=4",
                                 "--bcrypt-workers=1", "--bcrypt-queue-limit=4"], env={})
        proxy = ProxyServer(cfg)
        tcp = next(a for a in await proxy.start() if not a.startswith("unix:"))
        flood_channel = grpc.aio.insecure_channel(tcp)
        other_channel = grpc.aio.insecure_channel(f"unix://{sock}")
        try:
            await asyncio.wait_for(scenario(fake, flood_channel, other_channel, proxy), timeout=60)
        finally:
            await flood_channel.close()
            await other_channel.close()
            await proxy.stop(0)
            await store_server.stop(0)

    asyncio.run(main())


def test_anonymous_flood_does_not_starve_root_or_other_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = passwords._checkpw

    def stuck_check(raw: bytes, hashed: bytes) -> bool:
        release.wait(timeout=50)  # bounded: the test lets go long before
        return real(raw, hashed)

    async def scenario(fake: FakeStore, flood_ch: grpc.aio.Channel, other_ch: grpc.aio.Channel,
                       proxy: ProxyServer) -> None:
        root_token = await login(flood_ch)  # before the checks get stuck
        monkeypatch.setattr(passwords, "_checkpw", stuck_check)
        flood = [asyncio.ensure_future(login(flood_ch, "nobody", f"guess{i}")) for i in range(FLOOD)]
        # The flood has filled what it may: some of it is already refused with `too many requests`.
        deadline = time.monotonic() + 30
        while not any(f.done() for f in flood):
            assert time.monotonic() < deadline, "the flood was never refused: no bound on the queue?"
            await asyncio.sleep(0.02)  # polling interval of a condition wait
        for f in flood:
            if f.done():
                exc = f.exception()
                assert isinstance(exc, grpc.aio.AioRpcError)
                assert exc.details() == Err.TOO_MANY_REQUESTS.message

        # Root's password administration is served while every check is stuck.
        auth = rpc_pb2_grpc.AuthStub(flood_ch)
        await auth.UserAdd(rpc_pb2.AuthUserAddRequest(name="alice", password="pw"), metadata=md(root_token))
        await auth.UserChangePassword(rpc_pb2.AuthUserChangePasswordRequest(name="alice", password="pw2"),
                                      metadata=md(root_token))
        assert fake.requests[-1].auth_user_change_password.hashedPassword

        # Another peer is still admitted: its check waits for a worker instead of being refused.
        # The queue is full of the flood, so the flood's newest waiting check gives up its place.
        refused_before = sum(f.done() for f in flood)
        other = asyncio.ensure_future(login(other_ch, "root", "wrong"))
        await asyncio.to_thread(wait_for, lambda: other.done() or sum(f.done() for f in flood) > refused_before,
                                30, "the other peer's check to be queued or refused")
        if other.done():
            exc = other.exception()
            why = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else exc
            pytest.fail(f"the other peer was refused: {why}")
        release.set()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await other
        assert (e.value.code(), e.value.details()) == (Err.AUTH_FAILED.code, Err.AUTH_FAILED.message)
        await asyncio.gather(*flood, return_exceptions=True)

    try:
        _run(tmp_path, scenario)
    finally:
        release.set()


def test_a_lone_client_gets_the_whole_check_lane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 item 5: a client alone (a sidecar's pod) is not refused while the lane has room:
    --bcrypt-workers=1 --bcrypt-queue-limit=4 take five concurrent logins from one address."""
    release = threading.Event()
    real = passwords._checkpw

    def stuck_check(raw: bytes, hashed: bytes) -> bool:
        release.wait(timeout=50)  # bounded: the test lets go long before
        return real(raw, hashed)

    async def scenario(fake: FakeStore, ch: grpc.aio.Channel, _other: grpc.aio.Channel, proxy: ProxyServer) -> None:
        monkeypatch.setattr(passwords, "_checkpw", stuck_check)
        places = 1 + 4
        logins = [asyncio.ensure_future(login(ch, "nobody", f"guess{i}")) for i in range(places)]
        await asyncio.to_thread(wait_for, lambda: any(f.done() for f in logins) or proxy.hasher.pending == places,
                                30, "every login to take a place in the check lane")
        refused = [f.exception() for f in logins if f.done()]
        assert not refused, f"{len(refused)} of {places} logins of a lone client refused: {refused[0]}"
        release.set()
        for f in logins:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await f
            assert e.value.details() == Err.AUTH_FAILED.message

    try:
        _run(tmp_path, scenario)
    finally:
        release.set()


@pytest.mark.parametrize(("peer", "client"), [
    ("ipv4:10.0.0.7:5123", "ipv4:10.0.0.7"),
    ("ipv4:10.0.0.7:6000", "ipv4:10.0.0.7"),  # another connection, the same client
    ("ipv6:[::1]:5123", "ipv6:[::1]"),
    ("unix:/run/raftgate.sock", "unix"),
    ("unix:", "unix"),
])  # fmt: skip
def test_a_client_is_its_address_not_its_connection(peer: str, client: str) -> None:
    assert passwords.peer_host(peer) == client
