"""Trust item 9: many watches cost an unrelated write nothing, and their number is capped.

An event finds its watchers through an index by key interval, so the work per event follows the
watchers it matches, not the watchers open (counted, not timed). Watches per stream and per user
are capped; a create beyond a cap is refused in-band with ResourceExhausted and every other watch
on the stream goes on.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from authstore.api.watch import hub as hubmod
from authstore.api.watch.hub import Stream, Watcher
from protos.etcdserverpb import rpc_pb2 as pb
from tests.support.watch_world import World

PER_STREAM = "rpc error: code = ResourceExhausted desc = etcdserver: too many watches on this stream"
PER_USER = "rpc error: code = ResourceExhausted desc = etcdserver: too many watches for this user"


@pytest.fixture
def tmp_world(tmp_path: Path) -> Iterator[Any]:
    worlds: list[World] = []

    def make(**hub_kw: Any) -> World:
        worlds.append(World(tmp_path / f"store{len(worlds)}", **hub_kw))
        return worlds[-1]

    yield make
    for w in worlds:
        w.close()


def drain(stream: Stream) -> list[pb.WatchResponse]:
    out = []
    while not stream.queue.empty():
        item = stream.queue.get_nowait()
        assert isinstance(item, bytes), item
        out.append(pb.WatchResponse.FromString(item))
    return out


def test_an_unrelated_put_looks_at_no_watcher_of_20000(tmp_world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    world = tmp_world(max_watches_per_stream=20_000, max_watches_per_user=20_000)
    world.put(b"seed")
    stream = Stream()

    async def open_watches() -> None:
        for i in range(5000):  # one key, a prefix, a range, a from-key interval: all after "w/"
            await world.create(stream, b"w/%05d" % i)
            await world.create(stream, b"w/%05d/" % i, b"w/%05d0" % i)
            await world.create(stream, b"w/%05d/a" % i, b"w/%05d/m" % i)
            await world.create(stream, b"w/%05d" % i, b"\x00")

    asyncio.run(open_watches())
    drain(stream)
    looked_at = 0
    matches = Watcher.matches

    def counting(self: Watcher, ev: hubmod.Event) -> bool:
        nonlocal looked_at
        looked_at += 1
        return matches(self, ev)

    monkeypatch.setattr(Watcher, "matches", counting)
    world.put(b"a/unrelated")
    assert drain(stream) == []
    assert looked_at <= 64, looked_at  # was 20,000: every watcher, for every event
    looked_at = 0
    world.put(b"w/00042/b")  # the key, no; its prefix, its range, and 43 from-key watches: yes
    got = drain(stream)
    assert len(got) == 2 + 43
    assert looked_at <= 2 * 45 + 64, looked_at


def test_the_index_finds_what_a_scan_finds(tmp_world: Any) -> None:
    """Random keys, prefixes, ranges and from-key watches, added and removed: every event goes to
    exactly the watchers whose interval holds its key."""
    world = tmp_world()
    rng = random.Random(7)
    alphabet = [b"a", b"b", b"c", b"d"]

    def key() -> bytes:
        return b"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3)))

    stream = Stream()
    ws: dict[int, tuple[bytes, bytes]] = {}

    async def scenario() -> None:
        for _ in range(400):
            k = key()
            kind = rng.randrange(4)
            end = [b"", k[:-1] + bytes([k[-1] + 1]), max(k + b"\x00", key()), b"\x00"][kind]
            resp = await world.create(stream, k, end)
            assert resp is not None and resp.created and not resp.canceled, resp
            ws[resp.watch_id] = (k, end)
        for watch_id in rng.sample(sorted(ws), 150):
            world.hub._remove(stream.watchers[watch_id])
            del ws[watch_id]
        drain(stream)
        for _ in range(60):
            k = key()
            world.put(k)
            got = sorted(r.watch_id for r in drain(stream) if r.events)
            want = sorted(i for i, (start, end) in ws.items()
                          if (start == k if not end else start <= k and (end == b"\x00" or k < end)))
            assert got == want, k

    asyncio.run(scenario())


def test_watches_beyond_the_stream_cap_are_refused_and_the_others_go_on(tmp_world: Any) -> None:
    world = tmp_world(max_watches_per_stream=3, max_watches_per_user=100)
    world.put(b"seed")

    async def scenario() -> None:
        s, other = Stream(), Stream()
        ids = [(await world.create(s, b"k%d" % i)).watch_id for i in range(3)]
        assert ids == [0, 1, 2]
        refused = await world.create(s, b"k3")
        assert (refused.watch_id, refused.created, refused.canceled, refused.cancel_reason) == (
            -1, True, True, PER_STREAM)
        assert (await world.create(other, b"k3")).canceled is False  # another stream has its own cap
        world.put(b"k0", b"k1", b"k2", b"k3")
        assert sorted(r.watch_id for r in drain(s) if r.events) == [0, 1, 2]
        assert [r.watch_id for r in drain(other) if r.events] == [0]
        world.hub._remove(s.watchers[1])  # a canceled watch frees its place
        assert (await world.create(s, b"k3")).canceled is False

    asyncio.run(scenario())


def test_watches_beyond_the_user_cap_are_refused_on_every_stream(tmp_world: Any) -> None:
    world = tmp_world(max_watches_per_stream=100, max_watches_per_user=4)
    world.put(b"seed")

    async def scenario() -> None:
        s1, s2 = Stream(), Stream()
        for i in range(2):
            assert not (await world.create(s1, b"k%d" % i, user="")).canceled
            assert not (await world.create(s2, b"k%d" % i, user="")).canceled
        for s in (s1, s2):
            refused = await world.create(s, b"k9")
            assert (refused.watch_id, refused.canceled, refused.cancel_reason) == (-1, True, PER_USER)
        world.put(b"k0")
        assert [r.watch_id for r in drain(s1) if r.events] == [0]
        assert [r.watch_id for r in drain(s2) if r.events] == [0]
        # a resume is capped too (any sidecar-class caller can mark a create `resume`): canceled
        # under its own id, with no `created`
        await world.create(s2, b"k5", resume=True, watch_id=7)
        assert 7 not in s2.watchers
        refused = pb.WatchResponse.FromString(s2.queue.get_nowait())
        assert (refused.watch_id, refused.created, refused.canceled, refused.cancel_reason) == (
            7, False, True, PER_USER)
        for w in list(s1.watchers.values()):  # the stream ends: its watches free the user's places
            world.hub._remove(w)
        assert not (await world.create(s1, b"k1")).canceled

    asyncio.run(scenario())


def test_store_flags_for_the_watch_caps() -> None:
    from authstore import config

    base = ["--internal-secret-file", __file__, "--peer-secret-file", __file__]
    cfg = config.parse(base)
    assert (cfg.max_watches_per_stream, cfg.max_watches_per_user) == (
        hubmod.DEFAULT_MAX_WATCHES_PER_STREAM, hubmod.DEFAULT_MAX_WATCHES_PER_USER)
    cfg = config.parse([*base, "--max-watches-per-stream", "5", "--max-watches-per-user", "7"])
    assert (cfg.max_watches_per_stream, cfg.max_watches_per_user) == (5, 7)
    for flag in ("--max-watches-per-stream", "--max-watches-per-user"):
        with pytest.raises(config.ConfigError, match=flag):
            config.parse([*base, flag, "0"])
