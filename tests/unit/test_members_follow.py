"""What the proxy follows of the store's membership, and the flags behind it: a store node's
advertised internal URL, a member proxy's node, and how the proxy's node list moves with the
member list it learns (seeds kept, members added, departed ones retired, bounded)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from authstore import config as store_config
from protos.storepb import store_pb2
from proxy import store_client
from proxy.config import ConfigError, load
from proxy.store_client import StoreClient


@pytest.fixture
def secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith(("ETCD_", "RAFTGATE_"))]:
        monkeypatch.delenv(name)
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef0123")
    return path


def _store(secret: Path, listen: str, *extra: str) -> store_config.StoreConfig:
    return store_config.parse(["--internal-secret-file", str(secret), "--peer-secret-file", str(secret),
                               "--listen-internal-urls", listen, *extra])


def test_store_advertises_its_internal_url(secret: Path) -> None:
    assert _store(secret, "http://127.0.0.1:23790").advertise_internal_urls == ["http://127.0.0.1:23790"]
    # a wildcard listener is no address to reach: nothing is published unless given
    assert _store(secret, "http://0.0.0.0:23790").advertise_internal_urls == []
    given = _store(secret, "http://0.0.0.0:23790", "--advertise-internal-urls", "http://store-0.h.ns.svc:23790")
    assert given.advertise_internal_urls == ["http://store-0.h.ns.svc:23790"]
    with pytest.raises(store_config.ConfigError, match="--advertise-internal-urls"):
        _store(secret, "http://0.0.0.0:23790", "--advertise-internal-urls", "store-0:23790")


def test_member_store_endpoint_flag(secret: Path) -> None:
    base = ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}"]
    assert load(base, env={}).member_store_endpoint is None
    assert load([*base, "--member-store-endpoint=127.0.0.1:7001"], env={}).member_store_endpoint == "127.0.0.1:7001"
    with pytest.raises(ConfigError, match="--member-store-endpoint"):
        load([*base, "--member-store-endpoint=nope"], env={})


def test_target_of_a_published_url() -> None:
    assert store_client._target("https://store-0.h.ns.svc:23790") == "store-0.h.ns.svc:23790"
    assert store_client._target("http://[::1]:5") == "[::1]:5"
    for bad in ("store-0:23790", "http://host", "ftp://h:1", "http://h:99999"):
        assert store_client._target(bad) is None


def _member(mid: int, *urls: str, learner: bool = False) -> store_pb2.StoreMember:
    return store_pb2.StoreMember(id=mid, internal_urls=urls, is_learner=learner)


def test_follows_the_member_list() -> None:
    async def run() -> None:
        client = StoreClient(["a:1", "b:2"], secret="s")
        try:
            # a store that publishes nothing changes nothing
            assert not client._follow([_member(1), _member(2)])
            assert client.targets == ["a:1", "b:2"]
            # a node joins (a learner too: it may be promoted and lead)
            assert client._follow([_member(1, "http://a:1"), _member(2, "http://b:2"),
                                   _member(3, "http://c:3", learner=True)])
            assert client.targets == ["a:1", "b:2", "c:3"]
            # a node that is not a seed leaves: retired (closed later), no longer asked
            assert not client._follow([_member(1, "http://a:1"), _member(2, "http://b:2")])
            assert client.targets == ["a:1", "b:2"] and len(client._retired) == 1
            # a seed that left the list is still asked (its pod may come back under its name)
            assert not client._follow([_member(2, "http://b:2")])
            assert client.targets == ["a:1", "b:2"]
            # bounded
            many = [_member(i, f"http://n{i}:1") for i in range(1, 1000)]
            client._follow(many)
            assert len(client.targets) <= store_client.MAX_MEMBERS + 2
        finally:
            await client.close()

    asyncio.run(run())


def test_internal_urls_only_from_the_members_own_publication(tmp_path: Path) -> None:
    """A member's internal URL enters the replicated state only by the entry the member logs when
    it starts (MemberAttrSet, an internal kind no etcd method maps to), not by member add/update;
    MemberList keeps etcd's fields; a removed member's URL goes with it."""
    import lmdb

    from authstore.raft.types import ConfChange, ConfChangeType
    from authstore.state.membership import Membership
    from protos.etcdserverpb import rpc_pb2

    env = lmdb.open(str(tmp_path / "db"), max_dbs=8, map_size=1 << 24)
    try:
        with env.begin(write=True) as txn:
            ms = Membership(env, txn)
            ctx = store_pb2.MemberContext(member=rpc_pb2.Member(ID=7, peerURLs=["http://10.0.0.7:2380"]))
            ms.apply_conf_change(txn, ConfChange(ConfChangeType.ADD_NODE, 7, ctx.SerializeToString()))
            assert ms.internal_urls(txn, 7) == []
            ms.update_peer_urls(txn, 7, ["http://10.0.0.8:2380"])
            assert ms.internal_urls(txn, 7) == []
            ms.set_attributes(txn, 7, "n7", ["http://10.0.0.7:2379"], ["https://10.0.0.7:23790"])
            assert ms.internal_urls(txn, 7) == ["https://10.0.0.7:23790"]
            (member,) = ms.members(txn)
            assert set(member.DESCRIPTOR.fields_by_name) == set(rpc_pb2.Member.DESCRIPTOR.fields_by_name)
            assert "10.0.0.7:23790" not in str(member)
            ms.apply_conf_change(txn, ConfChange(ConfChangeType.REMOVE_NODE, 7, b""))
            assert ms.internal_urls(txn, 7) == []
    finally:
        env.close()


def test_raftgate_local_gives_an_older_layout_member_proxy_ports(tmp_path: Path) -> None:
    """A data dir from before member proxies keeps its nodes' ports and gets one client port per
    node, distinct from everything else, written back (a member's client URL should not move)."""
    import json

    from raftgate import local

    old = [{"name": f"node{i}", "data_dir": str(tmp_path / f"node{i}"), "peer_port": 41000 + 2 * i,
            "internal_port": 41001 + 2 * i} for i in (1, 2, 3)]  # fmt: skip
    (tmp_path / "layout.json").write_text(json.dumps(old))
    layout = local._layout(tmp_path, 3, client_port=2379)
    assert [(n["peer_port"], n["internal_port"]) for n in layout] == [(n["peer_port"], n["internal_port"]) for n in old]
    ports = [2379, *(n[k] for n in layout for k in ("peer_port", "internal_port", "client_port"))]
    assert len(set(ports)) == len(ports) == 10
    assert json.loads((tmp_path / "layout.json").read_text()) == layout
    assert local._layout(tmp_path, 3, client_port=2379) == layout


def test_follows_every_internal_url_a_member_publishes() -> None:
    """--advertise-internal-urls is a list (two networks, IPv4 and IPv6): a proxy that cannot reach
    a member's first URL still reaches it by another."""

    async def run() -> None:
        client = StoreClient(["a:1"], secret="s")
        try:
            assert client._follow([_member(1, "http://a:1"), _member(2, "http://10.0.0.2:2", "http://[fd00::2]:2")])
            assert client.targets == ["a:1", "10.0.0.2:2", "[fd00::2]:2"]
        finally:
            await client.close()

    asyncio.run(run())
